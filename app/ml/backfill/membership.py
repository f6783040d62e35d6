"""What membership of the re-embedded list says about relevance (issue 42, item 6). Pure: arrays
in, numbers out.

A mixed or transition search merges two lists — the re-embedded items R scored natively, the
rest by the old (or bridged) query — on each list's P̂(relevant | c) (``app.ml.backfill.relevance``),
fitted at upgrade time with *every* item in one space. That map is right when R is a random
share s of the gallery: an item of R is then relevant as often, a priori, as any other. When R
follows traffic (a plan from the click log, the most clicked items first, a lazy two-stage
migration) it is not: R holds the items users want, and the map, which does not know it, lets
the other list's items crowd R's out (on the skewed-traffic fixture the most-clicked 10 % landed
*below* stay). By Bayes' rule, if membership depends on relevance but not on the score given
relevance, the odds of relevance of an item of a list scale by the list's *lift*:

    odds(rel | c, i ∈ R) = odds(rel | c) · L_R,   L_R = π / s,
    odds(rel | c, i ∉ R) = odds(rel | c) · L_Rᶜ,  L_Rᶜ = (1 − π) / (1 − s),

with π = P(a search's relevant item is in R) and s = |R| / n (a query has one relevant item; its
prior is 1/n per item overall, π/|R| inside R). Without maps the merge key is c = −ln(share
above), and the same evidence adds ln L (the share scaled by 1/L). A random R has π ≈ s: both
lifts 1, the merge unchanged. Within a list the transform is strictly increasing, so 0 % and
100 % re-embedded stay exactly the one-space rankings (s = 0 or 1: nothing to lift).

π is estimated from the gallery's access counts (the team's click log, ``app.migration.access``)
with the log's own measure of how far it can be trusted, the Good–Turing missing mass
M₀ = N₁ / N (N clicks, N₁ items clicked exactly once): the chance that the next search wants an
item the log has not seen yet. The log's empirical shares get the weight 1 − M₀ and the
uniform share (every item alike: R holds s) the rest:

    π̂ = (1 − M₀) · C_R / N + M₀ · s        (C_R: the clicks on R).

Nothing is tuned. A log of singletons (M₀ = 1: every search wanted a new item, as under uniform
traffic) gives π̂ = s, no evidence and no lift; a log that repeats itself trusts its counts; and
an R that holds every clicked item is credited 1 − M₀ (+ M₀·s), not 1 — a past log overstates
the future coverage of exactly its own items, and the missing mass is the classical correction.
π̂ is kept within [1/(N+2), 1 − 1/(N+2)]: no finite log rules out either side entirely.

What this does not do: it carries popularity only through membership, so once R holds every
clicked item, re-embedding more *dilutes* the lift (at 100 % it is gone, and the search is the
reindex exactly). On skewed traffic the curve therefore peaks where R covers the traffic and
falls back towards the reindex after it (BENCHMARKS.md, bench.quality.traffic).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

NO_LIFTS = (1.0, 1.0)


@dataclass(frozen=True)
class ClickSummary:
    """What the coverage estimate needs of a click log over a gallery of ``items`` items:
    ``clicks`` in all, ``singletons`` (items clicked exactly once), and of the re-embedded set R
    its size ``reembedded`` and the ``reembedded_clicks`` on it."""

    items: int
    clicks: int
    singletons: int
    reembedded: int
    reembedded_clicks: int

    @classmethod
    def of(cls, counts: np.ndarray, reembedded: np.ndarray) -> ClickSummary:
        """From per-item counts (n) and a re-embedded mask (n)."""
        c = np.asarray(counts, dtype=np.int64)
        mask = np.asarray(reembedded, dtype=bool)
        return cls(
            items=len(c),
            clicks=int(c.sum()),
            singletons=int((c == 1).sum()),
            reembedded=int(mask.sum()),
            reembedded_clicks=int(c[mask].sum()),
        )


def coverage(summary: ClickSummary) -> float | None:
    """π̂ = P(a search's relevant item is re-embedded): the log's shares shrunk towards the
    uniform one by its Good–Turing missing mass; None without clicks (no evidence)."""
    s = summary
    if s.clicks <= 0 or s.items <= 0:
        return None
    missing = min(s.singletons / s.clicks, 1.0)
    share = s.reembedded / s.items
    pi = (1.0 - missing) * min(s.reembedded_clicks / s.clicks, 1.0) + missing * share
    floor = 1.0 / (s.clicks + 2)
    return float(np.clip(pi, floor, 1.0 - floor))


def membership_lifts(summary: ClickSummary | None) -> tuple[float, float]:
    """(L_R, L_Rᶜ): the odds factors of the re-embedded list and of the other one. (1, 1) without
    a log, with nothing re-embedded or everything (the one-space ranking, exactly)."""
    if summary is None or summary.items <= 0:
        return NO_LIFTS
    share = summary.reembedded / summary.items
    pi = coverage(summary)
    if pi is None or share <= 0.0 or share >= 1.0:
        return NO_LIFTS
    return pi / share, (1.0 - pi) / (1.0 - share)


def lifted_keys(keys: np.ndarray, lift: float, probability: bool) -> np.ndarray:
    """A list's merge keys with its membership evidence: P̂ keys (``probability``: P̂ plus the
    relevance map's tiny tie term) to the odds-scaled L·p / (1 − p + L·p); calibrated scores c
    (no map) shifted by ln L. Strictly increasing in the key: the list's own order is kept.
    −inf (padding) stays −inf."""
    k = np.asarray(keys)
    if lift == 1.0:
        return k
    if not probability:
        return k + np.asarray(np.log(lift), dtype=k.dtype)
    # Keys exceed 1 by at most the tie term (1e-6): the denominator 1 + p·(L − 1) stays positive
    # there for L > 1e-6, so the lift is floored at 1e-5 (a log of 10⁵ clicks all on one side).
    lift = max(float(lift), 1e-5)
    p = np.where(np.isneginf(k), 0.0, k)
    out = lift * p / (1.0 - p + lift * p)
    return np.where(np.isneginf(k), -np.inf, out).astype(k.dtype, copy=False)
