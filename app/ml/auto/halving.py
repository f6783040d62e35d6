"""Successive halving of ``auto``'s validation trials (issue 44 item 4): the budget rule, the
same for every tuned candidate. Pure functions: the caller trains and scores.

Without it every trial trained its full ``epochs`` (3 grid + 2 extra trials × 15 epochs per
candidate), and a user's default upgrade of 14,400 pairs took a quarter of an hour on 2 cores
(issue 44). With it,
a candidate with more than one trial:

1. **screens** every trial — its grid's, then its extra trials, each placed by the screened
   scores (``app.ml.auto.widening``) — with a short run of ``screen_epochs`` (a third of its
   epochs, the cosine schedule over that short run: a complete, annealed training, not a
   prefix of the long one), each scored on validation by the rule the choice uses
   (``ranked_keys``: eligible under the instance floor first, then the primary metric);
2. trains its ``FINALISTS`` best screened settings again for the full ``epochs``, exactly as
   every trial trained before (same seed, same settings: the same model), and scores them;
   the candidate's best full-budget trial is what ``pick`` compares across candidates, as before.

Budget per tuned candidate: ``trials × screen_epochs + FINALISTS × epochs`` epochs
(``budget_epochs``; 5 × 5 + 15 = 40 at the defaults, against 5 × 15 = 75), the same for every
candidate, so the comparison between candidates stays equal (one split, one criterion, one
budget; issue 42). A candidate with one trial, or epochs too few to shorten, trains its trials
once at full length (no screening): the rule is then the earlier one.

Why a third, measured once on the public nouns (24,000 glosses, 14,400 pairs; validation
own-item R@1 of each trial of the default run, trained for 3, 5 and 15 epochs): at 3 epochs
hbct had learnt almost nothing (R@1 0.04 where 15 epochs reach 0.96); at 5 its trials came in
the order of 15 epochs but for two within 0.003 of each other; contrastive and instance-map
kept their order; the adapters, which start at the Procrustes map and move little, differed by
a few validation items either way. The choice between candidates did not change
(``bench.perf.training --default-upgrade``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

# The short run's share of a trial's epochs.
SCREEN_FRACTION = 1 / 3
# Screened settings per candidate trained again at full length.
FINALISTS = 1
# The rule in words, for the report.
RULE = (
    "each tuned candidate's trials are screened by a short run (a third of their epochs, "
    "annealed over that run) and scored on validation by the choice's own rule; its best "
    "screened setting is trained again at full length, and the candidates' full-length "
    "trials are compared as before — the same trials and epochs for every candidate"
)


def screen_epochs(epochs: int, trials: int, enabled: bool = True) -> int | None:
    """Epochs of a screening run for a candidate with ``trials`` trials of ``epochs`` epochs, or
    None when it trains its trials at full length: halving off, a single trial (nothing to
    compare), or too few epochs for a shorter run (⌈epochs / 3⌉ not below ``epochs``)."""
    if not enabled or trials <= FINALISTS or epochs < 1:
        return None
    short = max(1, math.ceil(epochs * SCREEN_FRACTION))
    return short if short < epochs else None


def finalists(keys: Sequence[Any], count: int = FINALISTS) -> list[int]:
    """Indices of the ``count`` best screened trials by their comparable keys (``ranked_keys``),
    the earlier trial first among equal keys, in trial order."""
    order = sorted(range(len(keys)), key=lambda i: (keys[i], -i), reverse=True)
    return sorted(order[:count])


def budget_epochs(epochs: int, trials: int, screen: int | None) -> int:
    """Epochs one candidate trains in all: ``trials`` runs at full length without screening,
    else ``trials`` screening runs and the finalists' full runs."""
    if screen is None:
        return trials * epochs
    return trials * screen + min(FINALISTS, trials) * epochs
