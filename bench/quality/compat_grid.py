"""bench.quality.compat's validation grids: the same number of trials for every method, on its own knob.

Every method is tuned on one axis with ``TRIALS`` values spread over its grid, each trained on the
*fit* part of the training items and scored on the *validation* part (both carved from the
training items; the evaluation part is never seen); then exactly ``EXTEND_ROUNDS`` more trials,
the same for every method: while the best sits at an end of what was tried, one a grid step past
that end (widening); otherwise one between the best and its better neighbour (refining). So
every tuned method gets ``TRIALS + EXTEND_ROUNDS`` trials, widening included. ``procrustes`` is
closed form: it has nothing to tune and gets its single fit. A chosen value still at an end of
what was tried is flagged (``edge``) — unless nothing valid lies beyond it (a weight of 0 is the
paper's loss, a rank below 1 does not exist) — because a better value may lie beyond it.

Scores: ``independent`` by its own space's class metrics (mean of CMC@1 and mAP@100); every
bridge by feasibility first — validation own-item R@1 ≥ ``INSTANCE_FLOOR`` × procrustes's, the
floor ``auto`` applies to its candidates (P_up is reported, a target, not a selection floor) —
then the mean gain of new→old over old→old (see ``bridge_score`` for why not P_com). Every single
method is thereby tuned under the same instance floor as ``auto`` (issue 26), on validation only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.ml.auto.candidates import DEFAULT_TRIALS, INSTANCE_FLOOR
from app.ml.evaluation.retrieval import CLASS_METRICS
from app.ml.methods.models import EmbeddingModel
from app.ml.upgrade import alternatives
from app.ml.upgrade.alternatives import EvalSet

# As many trials as ``auto`` gives each of its candidates (app.ml.auto.candidates.DEFAULT_TRIALS): three
# values spread over each grid (its two ends and its middle).
TRIALS = DEFAULT_TRIALS
# Then this many more for every tuned method: a grid step past the end the best sits on, or
# between the best and its better neighbour when it sits inside.
EXTEND_ROUNDS = 2
P_UP_FLOOR = -0.01


@dataclass(frozen=True)
class Grid:
    """The one setting validation tunes for a method, and its values (ascending)."""

    axis: str | None
    values: tuple[Any, ...] = ()
    bound: Any = None  # the axis's natural end: choosing it is not an edge to widen

    def settings(self, trials: int) -> list[dict[str, Any]]:
        """``trials`` values spread over the grid, both ends included (all of them when
        ``trials`` ≥ its length)."""
        if self.axis is None:
            return [{}]
        if trials >= len(self.values):
            picked = list(self.values)
        else:
            idx = np.unique(np.linspace(0, len(self.values) - 1, trials).round().astype(int))
            picked = [self.values[i] for i in idx]
        return [{self.axis: v} for v in picked]

    def beyond(self, tried: list[Any], side: str) -> Any:
        """The next value past the ``side`` (``"low"`` / ``"high"``) end of ``tried``: one step of
        the grid's own ratio at that end (3 significant digits; integers rounded, at least 1),
        or None where no valid value lies beyond (the natural bound, or an integer axis at 1)."""
        end = min(tried) if side == "low" else max(tried)
        if self.axis is None or end == self.bound:
            return None
        pair = self.values[:2] if side == "low" else self.values[-2:]
        ratio = pair[1] / pair[0]
        value = end / ratio if side == "low" else end * ratio
        if isinstance(self.values[0], int):
            value = max(1, round(value))
            return None if value == end else value
        return float(f"{value:.3g}")

    def between(self, low: Any, high: Any) -> Any:
        """A value between two tried ones: their geometric mean (the grids are ratio-spaced),
        the arithmetic one where an end is 0; 3 significant digits, integers rounded; None
        where nothing new lies between (neighbouring integers)."""
        value = math.sqrt(low * high) if low > 0 and high > 0 else (low + high) / 2
        if isinstance(self.values[0], int):
            value = round(value)
            return None if value in (low, high) else value
        value = float(f"{value:.3g}")
        return None if value in (low, high) else value


WEIGHTS = (0.1, 0.3, 1.0, 3.0, 10.0)
# Widened where the previous full run (commit 915873d, external) chose an end: hbct 30, bct 10,
# affine rank 16, mlp-adapter 1024 hidden, instance-map τ 0.2 — each grid now extends past it;
# then instance-map τ 1.0 and class-map 10 (a first widened selection) — widened again.
PROTO_WEIGHTS = (0.0, 3.0, 10.0, 30.0, 100.0)
GRIDS: dict[str, Grid] = {
    # L_base's temperature, chosen on the independent head and then shared by every method that
    # trains L_base (hbct, l2, bct, contrastive).
    "independent": Grid("base_temperature", (0.02, 0.05, 0.1, 0.2, 0.5)),
    "hbct": Grid("old_proto_weight", PROTO_WEIGHTS, bound=0.0),
    "l2": Grid("compat_weight", WEIGHTS),
    "bct": Grid("compat_weight", (1.0, 3.0, 10.0, 30.0, 100.0)),
    "contrastive": Grid("compat_weight", WEIGHTS),
    "procrustes": Grid(None),
    "affine": Grid("adapter_rank", (4, 8, 16, 32, 64)),
    "mlp-adapter": Grid("adapter_hidden", (256, 512, 1024, 2048, 4096)),
    "instance-map": Grid("instance_temperature", (0.2, 0.5, 1.0, 2.0, 5.0)),
    "class-map": Grid("class_weight", (1.0, 3.0, 10.0, 30.0, 100.0)),
}
METHODS = tuple(GRIDS)
BRIDGES = tuple(m for m in METHODS if m != "independent")
# Methods whose loss includes L_base and so take the independent head's chosen temperature.
BASE_LOSS_METHODS = ("hbct", "l2", "bct", "contrastive")


def bridge_score(
    entry: dict[str, Any], stay_class: dict[str, float], instance_floor: float | None = None
) -> tuple[bool, float]:
    """(feasible, mean gain of new→old over old→old relative to old→old): feasible settings
    first. Feasible = validation own-item R@1 ≥ ``instance_floor`` (``INSTANCE_FLOOR`` ×
    procrustes's, as ``auto`` requires), or without one P_up ≥ floor for CMC@1 and mAP@100.

    Not P_com: it divides by (reference − old→old), which on a validation split can be near 0
    or negative (extended-data / extended-class: the old and new heads share the backbone), and
    a negative denominator inverts its order (a map that collapses new→old retrieval scored
    P_com +18 there). For one metric, the gain over old→old orders as P_com does wherever P_com's
    denominator is positive."""
    pu = entry["p_up"]
    if instance_floor is None:
        feasible = all(pu[k] is not None and pu[k] >= P_UP_FLOOR for k in CLASS_METRICS)
    else:
        # auto's own rule: eligible by the instance floor alone, P_up only reported. With the
        # P_up floor as well, no trial of any method on external met both (two floors that
        # conflict there), and every choice fell back to the class gain.
        own = entry.get("instance", {}).get("recall@1")
        feasible = own is not None and own >= instance_floor
    gains = [
        (entry["class"][k] - stay_class[k]) / stay_class[k]
        for k in CLASS_METRICS
        if entry.get("class", {}).get(k) is not None and stay_class.get(k)
    ]
    return feasible, float(np.mean(gains)) if gains else -np.inf


def _as_key(score: Any) -> tuple[bool, float]:
    feasible, value = score
    return bool(feasible), -np.inf if value is None else float(value)


def independent_score(own_class: dict[str, float]) -> float:
    return float(np.mean([own_class[k] for k in CLASS_METRICS]))


def edge_of(grid: Grid, trials: list[dict[str, Any]], chosen: int) -> str | None:
    """``"low"`` / ``"high"`` when the chosen trial's value is the lowest / highest tried and a
    valid value lies beyond it (not the axis's natural end: a weight of 0, a rank of 1), else
    None."""
    if grid.axis is None or len(trials) < 2:
        return None
    values = [t[grid.axis] for t in trials]
    value = values[chosen]
    side = "low" if value == min(values) else "high" if value == max(values) else None
    if side is None or grid.beyond(values, side) is None:
        return None
    return side


Trainer = Callable[[str, dict[str, Any]], EmbeddingModel]


def next_value(
    grid: Grid, trials: list[dict[str, Any]], best: int, score: Callable[[dict[str, Any]], Any]
) -> Any:
    """The value of the next trial after ``trials`` (best at index ``best``): a grid step past
    the end the best sits on, else between the best and its better-scoring neighbour (then the
    other neighbour); None when no new valid value exists."""
    values = [t["settings"][grid.axis] for t in trials]
    edge = edge_of(grid, [t["settings"] for t in trials], best)
    if edge is not None:
        return grid.beyond(values, edge)
    value = values[best]
    below = [i for i, v in enumerate(values) if v < value]
    above = [i for i, v in enumerate(values) if v > value]
    sides = []
    if below:
        sides.append(max(below, key=lambda i: values[i]))
    if above:
        sides.append(min(above, key=lambda i: values[i]))
    for i in sorted(sides, key=lambda i: score(trials[i]), reverse=True):
        low, high = sorted((value, values[i]))
        middle = grid.between(low, high)
        if middle is not None and middle not in values:
            return middle
    return None


def tune(
    grid: Grid,
    base_settings: list[dict[str, Any]],
    shared: dict[str, Any],
    run_trial: Callable[[dict[str, Any]], dict[str, Any]],
    score: Callable[[dict[str, Any]], Any],
    reuse: list[dict[str, Any]],
    extend_rounds: int,
) -> tuple[list[dict[str, Any]], int, str | None]:
    """Trials of ``base_settings`` (each merged into ``shared``), then ``extend_rounds`` more
    (``next_value``: past the end the best sits on, else between it and a neighbour); (trials,
    best index, edge flag). A trial whose settings appear in ``reuse`` (an earlier selection's
    trials) is taken from there."""
    trials: list[dict[str, Any]] = []

    def trial(settings: dict[str, Any]) -> None:
        settings = {**shared, **settings}
        earlier = next((t for t in reuse if t["settings"] == settings), None)
        trials.append(earlier if earlier is not None else run_trial(settings))

    def best_index() -> int:
        return max(range(len(trials)), key=lambda i: score(trials[i]))

    for s in base_settings:
        trial(s)
    if grid.axis is not None:
        for _ in range(extend_rounds):
            value = next_value(grid, trials, best_index(), score)
            if value is None:
                break
            trial({grid.axis: value})
    best = best_index()
    return trials, best, edge_of(grid, [t["settings"] for t in trials], best)


def select(
    train: Trainer,
    val: EvalSet,
    trials: int,
    methods: tuple[str, ...] = METHODS,
    reuse: dict[str, list[dict[str, Any]]] | None = None,
    extend_rounds: int = EXTEND_ROUNDS,
) -> dict[str, Any]:
    """Every method's trials (``tune``) trained by ``train(method, settings)`` (on the fit
    part) and scored on ``val``; returns each method's chosen settings, its trials, its edge
    flag and the instance floor applied. The independent head goes first (its chosen temperature
    is shared), then procrustes (its own-item R@1 sets the floor every bridge is tuned under,
    as ``auto``'s candidates are). ``reuse``: an earlier selection's trials per method, taken
    instead of retraining the same settings (training is seeded: the same figures)."""
    reuse = reuse or {}
    stay, reindex = alternatives.measure_stay(val), alternatives.measure_reindex(val)
    # old→old on the validation carve, recorded so that every trial can be read against
    # staying (a trial's "arr" is ÷ reindex, not ÷ old→old).
    out: dict[str, Any] = {"trials": {}, "chosen": {}, "edge": {}, "stay": stay}
    grid = GRIDS["independent"]

    def independent_trial(settings: dict[str, Any]) -> dict[str, Any]:
        own = alternatives.measure_independent(val, train("independent", settings))["class"]
        return {"settings": settings, "class_own_space": own, "score": independent_score(own)}

    ind_trials, best, edge = tune(
        grid,
        grid.settings(trials),
        {},
        independent_trial,
        lambda t: t["score"],
        reuse.get("independent", []),
        extend_rounds,
    )
    shared = dict(ind_trials[best]["settings"])
    reference = {"class": ind_trials[best]["class_own_space"]}
    out["trials"]["independent"] = ind_trials
    out["chosen"]["independent"] = shared
    out["edge"]["independent"] = edge

    def bridge_trial(method: str, settings: dict[str, Any]) -> dict[str, Any]:
        measured = alternatives.measure_bridge(val, train(method, settings))
        entry = alternatives.assemble(stay, reindex, {method: measured}, reference)[method]
        return {"settings": settings, "val": entry}

    earlier = reuse.get("procrustes", [])
    floor_trial = earlier[0] if earlier else bridge_trial("procrustes", {})
    floor = INSTANCE_FLOOR * floor_trial["val"]["instance"]["recall@1"]
    out["instance_floor"] = floor

    def bridge_key(trial: dict[str, Any]) -> tuple[bool, float]:
        # Scored afresh, so that trials reused from an earlier selection follow this rule.
        return _as_key(bridge_score(trial["val"], stay["class"], floor))

    # procrustes first: the rest are tuned under its floor.
    order = sorted((m for m in methods if m != "independent"), key=lambda m: m != "procrustes")
    for method in order:
        grid = GRIDS[method]
        method_trials, best, edge = tune(
            grid,
            grid.settings(trials),
            shared if method in BASE_LOSS_METHODS else {},
            lambda settings, method=method: bridge_trial(method, settings),
            bridge_key,
            [floor_trial] if method == "procrustes" else reuse.get(method, []),
            extend_rounds,
        )
        method_trials = [{**t, "score": list(bridge_key(t))} for t in method_trials]
        out["trials"][method] = method_trials
        out["chosen"][method] = method_trials[best]["settings"]
        out["edge"][method] = edge
    # In the benchmark's method order, whatever order they were trained in.
    for key in ("trials", "chosen", "edge"):
        out[key] = {m: out[key][m] for m in METHODS if m in out[key]}
    return out
