"""``auto``: train a small set of candidates, tune each on validation, pick by the objective.

Every candidate gets the same number of validation trials (``trials``, default 3): the first
``trials`` values of its tuned axis below, each trained on the *fit* part of the training items
and scored on the *validation* part (both carved from the training items; the held-out items are
never seen). ``procrustes`` has nothing to tune and is always a candidate, so the chosen model is
never worse than it on validation. A candidate whose validation own-item R@1 falls below
``INSTANCE_FLOOR`` × procrustes's is not eligible: instance alignment is never traded away
silently for a class or query gain.

``params`` for auto (validated by ``AutoParams.from_dict``):
- any ``CompatParams`` field except a tuned axis of an included candidate: shared overrides for
  every candidate (e.g. ``epochs``, ``hidden_dim``, ``lr``); a setting only some methods read
  (``METHOD_ONLY_PARAMS``) reaches only those candidates, and needs one among them;
- ``candidates``: a list of candidate names (``KNOWN_CANDIDATES``); procrustes is added when left
  out; default ``AUTO_CANDIDATES`` (every candidate but the opt-in ones);
- ``trials``: trials per candidate, 1…3 (default 3);
- ``extra_trials``: further trials per tuned candidate after its grid, 0…3 (default 2; none
  when ``trials`` is 1): past the end its best sits on, else between the best and a neighbour
  (``app.ml.auto.widening``), so a choice is not left on an edge of a three-value grid;
- ``halving``: successive halving of each candidate's trials (default true): every trial is
  screened by a short run, the best trained again at full length (``app.ml.auto.halving``);
  false trains every trial at full length.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.ml.auto import widening
from app.ml.methods.compat import METHOD_ONLY_PARAMS, CompatParams

OBJECTIVES = ("query", "class", "instance")
# The view and metric each objective selects and recommends by.
PRIMARY_METRIC: dict[str, tuple[str, str]] = {
    "query": ("query", "recall@10"),
    "class": ("class", "cmc1"),
    "instance": ("instance", "recall@1"),
}
# A candidate is eligible only when its validation own-item R@1 is at least this share of
# procrustes's (the instance target: ≥ 0.95 × procrustes in every scenario).
INSTANCE_FLOOR = 0.95
DEFAULT_TRIALS = 3
# Two, not one: with one, a best at the top of (0.3, 1, 3) got a single step (9) and stayed on
# that edge on two of three seeds of a public class scenario (BENCHMARKS.md, compatibility:
# class-conditional-map on `both`). 3 + 2 is also the budget of every single method in
# bench.quality.compat, so auto's candidates and the methods they are compared with are tuned alike.
DEFAULT_EXTRA_TRIALS = 2
MAX_EXTRA_TRIALS = 3
VALIDATION_FRACTION = 0.2
MIN_VALIDATION_ITEMS = 10
MIN_FIT_ITEMS = 10


@dataclass(frozen=True)
class Candidate:
    """A method and the one setting validation tunes for it (values in trial order)."""

    name: str
    method: str
    axis: str | None
    grid: tuple[Any, ...]
    # Without labels a different axis applies (the prototype term needs classes).
    unlabelled_axis: str | None = None
    unlabelled_grid: tuple[Any, ...] = ()
    # Trained only when the upgrade has labels (its loss needs classes).
    labelled_only: bool = False
    # Settings that make this candidate a variant of its method, the same in every trial.
    fixed: tuple[tuple[str, Any], ...] = ()
    # Trained only when a request names it in ``candidates``: not yet measured in every public
    # scenario, so the default set (and its benchmark figures) does not include it.
    opt_in: bool = False

    def trial_settings(self, trials: int, labelled: bool) -> list[dict[str, Any]]:
        axis, grid = (self.axis, self.grid)
        if not labelled and self.unlabelled_axis is not None:
            axis, grid = self.unlabelled_axis, self.unlabelled_grid
        if axis is None:
            return [dict(self.fixed)]
        return [{**dict(self.fixed), axis: v} for v in grid[:trials]]

    def axes(self) -> set[str]:
        return {a for a in (self.axis, self.unlabelled_axis) if a is not None}

    def owned(self) -> set[str]:
        """The settings auto sets for this candidate: its tuned axes and its fixed settings."""
        return self.axes() | {name for name, _ in self.fixed}

    def tuned_axis(self, labelled: bool) -> str | None:
        """The axis this upgrade's trials vary."""
        if not labelled and self.unlabelled_axis is not None:
            return self.unlabelled_axis
        return self.axis


# Grid order: the first value is the one a single trial gets (the measured default).
CANDIDATES: tuple[Candidate, ...] = (
    Candidate("procrustes", "procrustes", None, ()),
    # Prototype term weight, 0 = the paper's loss: the term collapses instances within a class
    # (docs/algorithms.md §5), so it is a validated choice, never a fixed default.
    Candidate(
        "hbct",
        "hbct",
        "old_proto_weight",
        (0.0, 1.0, 3.0),
        unlabelled_axis="compat_weight",
        unlabelled_grid=(1.0, 0.3, 3.0),
    ),
    Candidate("contrastive", "contrastive", "compat_weight", (1.0, 0.3, 3.0)),
    Candidate("affine", "affine", "adapter_rank", (64, 16, 256)),
    Candidate("mlp-adapter", "mlp-adapter", "adapter_hidden", (256, 64, 1024)),
    Candidate("instance-map", "instance-map", "instance_temperature", (0.05, 0.02, 0.1)),
    # Class terms on top of the instance term, weighted on validation under the instance floor.
    Candidate("class-map", "class-map", "class_weight", (0.3, 1.0, 3.0), labelled_only=True),
    # The same terms through a non-linear map: the fixed Procrustes map plus a residual MLP
    # (issue 26 item 5: a non-linear map with an instance term; +0.045 validation P_com in a
    # one-split probe, not reproduced on per-seed splits: BENCHMARKS.md, compatibility section).
    Candidate(
        "class-map-mlp",
        "class-map",
        "class_weight",
        (0.3, 1.0, 3.0),
        labelled_only=True,
        fixed=(("map_hidden", 256),),
    ),
    # The same terms through a class-conditional map (issue 26 item 5): the fixed Procrustes map
    # plus 16 rank-32 experts, each gated by the cosine to a group of classes' mean features.
    Candidate(
        "class-conditional-map",
        "class-map",
        "class_weight",
        (0.3, 1.0, 3.0),
        labelled_only=True,
        fixed=(("map_experts", 16),),
    ),
    # The same terms with BT²-style extra dimensions (issue 26 item 5): L_base's prototype term
    # also sees 128 dimensions the served map never outputs. Opt-in: measured on `external`
    # only (bench.quality.bt2_probe; BENCHMARKS.md, compatibility section).
    Candidate(
        "class-map-bt2",
        "class-map",
        "class_weight",
        (0.3, 1.0, 3.0),
        labelled_only=True,
        fixed=(("extra_dims", 128),),
        opt_in=True,
    ),
)
# Every candidate a request may name, in tie-break order (procrustes first).
KNOWN_CANDIDATES: tuple[str, ...] = tuple(c.name for c in CANDIDATES)
# The candidates auto trains when a request names none.
AUTO_CANDIDATES: tuple[str, ...] = tuple(c.name for c in CANDIDATES if not c.opt_in)
# An axis's natural end: a prototype weight of 0 is the paper's loss, nothing lies below it.
NATURAL_BOUNDS: dict[str, float] = {"old_proto_weight": 0.0, "compat_weight": 0.0}
_BY_NAME = {c.name: c for c in CANDIDATES}
METHOD_OF = {c.name: c.method for c in CANDIDATES}


@dataclass
class AutoParams:
    shared: dict[str, Any] = field(default_factory=dict)
    candidates: tuple[str, ...] = AUTO_CANDIDATES
    trials: int = DEFAULT_TRIALS
    extra_trials: int = DEFAULT_EXTRA_TRIALS
    halving: bool = True

    @classmethod
    def from_dict(cls, values: dict[str, Any] | None) -> AutoParams:
        """Validated construction; bad names, values or tuned-axis overrides raise ValueError."""
        values = dict(values or {})
        names = values.pop("candidates", None)
        trials = values.pop("trials", DEFAULT_TRIALS)
        extra = values.pop("extra_trials", DEFAULT_EXTRA_TRIALS)
        halving = values.pop("halving", True)
        if not isinstance(halving, bool):
            raise ValueError("parameter 'halving' must be true or false")
        if names is None:
            chosen = AUTO_CANDIDATES
        else:
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise ValueError("parameter 'candidates' must be a list of candidate names")
            unknown = sorted(set(names) - set(KNOWN_CANDIDATES))
            if unknown:
                raise ValueError(f"unknown candidate(s) {unknown}; known: {list(KNOWN_CANDIDATES)}")
            keep = set(names) | {"procrustes"}
            chosen = tuple(n for n in KNOWN_CANDIDATES if n in keep)
        longest = max(len(c.grid) for c in CANDIDATES)
        if isinstance(trials, bool) or not isinstance(trials, int) or not 1 <= trials <= longest:
            raise ValueError(f"parameter 'trials' must be an integer in [1, {longest}]")
        if (
            isinstance(extra, bool)
            or not isinstance(extra, int)
            or not 0 <= extra <= MAX_EXTRA_TRIALS
        ):
            raise ValueError(
                f"parameter 'extra_trials' must be an integer in [0, {MAX_EXTRA_TRIALS}]"
            )
        CompatParams.from_dict(values)  # shared overrides: CompatParams' own checks
        for name in chosen:
            tuned = _BY_NAME[name].owned() & set(values)
            if tuned:
                how = "tuned" if tuned & _BY_NAME[name].axes() else "fixed"
                raise ValueError(
                    f"parameter(s) {sorted(tuned)} are {how} by auto for candidate {name!r}: "
                    "leave them out, drop the candidate, or name the method explicitly"
                )
        if values.get("extra_dims"):
            # A shared override reaches every candidate; only class-map reads this one.
            raise ValueError(
                "parameter 'extra_dims' applies to class-map only: name candidate "
                "'class-map-bt2', or the method 'class-map' explicitly"
            )
        defaults = CompatParams()
        for name, methods in METHOD_ONLY_PARAMS.items():
            # A shared override reaches the candidates that read it; one none reads would be
            # accepted and ignored.
            requested = name in values and values[name] != getattr(defaults, name)
            if requested and not any(METHOD_OF[c] in methods for c in chosen):
                raise ValueError(
                    f"parameter {name!r} applies to method(s) {list(methods)} only, and no "
                    "candidate of this request is one: name such a candidate, or the method "
                    "explicitly"
                )
        return cls(
            shared=values, candidates=chosen, trials=trials, extra_trials=extra, halving=halving
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.shared,
            "candidates": list(self.candidates),
            "trials": self.trials,
            "extra_trials": self.extra_trials,
            "halving": self.halving,
        }

    def extra_for(self, name: str, labelled: bool) -> int:
        """How many extra trials candidate ``name`` gets: none untuned or with one grid trial."""
        tuned = _BY_NAME[name].tuned_axis(labelled) is not None
        return self.extra_trials if tuned and self.trials >= 2 else 0

    def next_settings(
        self,
        name: str,
        labelled: bool,
        tried: list[dict[str, Any]],
        keys: list[Any],
        best: int,
        dims: tuple[int, int] | None = None,
    ) -> dict[str, Any] | None:
        """The full parameter dict of candidate ``name``'s next extra trial after ``tried``
        (comparable scores ``keys``, the best at ``best``; ``widening.next_value``), or None.
        ``dims`` (new, old widths) bound the structure axes (``structure_ceiling``)."""
        axis = _BY_NAME[name].tuned_axis(labelled)
        if axis is None:
            return None
        values = [t[axis] for t in tried]
        bound = NATURAL_BOUNDS.get(axis)
        ceiling = None if dims is None else structure_ceiling(axis, *dims)
        value = widening.next_value(values, keys, best, isinstance(values[0], int), bound, ceiling)
        return None if value is None else {**self.shared, **dict(_BY_NAME[name].fixed), axis: value}

    def applicable(self, labelled: bool) -> tuple[str, ...]:
        """The candidates this upgrade can train (label-only ones need labels)."""
        return tuple(n for n in self.candidates if labelled or not _BY_NAME[n].labelled_only)

    def skipped(self, labelled: bool) -> list[str]:
        return [n for n in self.candidates if n not in self.applicable(labelled)]

    def settings(self, name: str, labelled: bool) -> list[dict[str, Any]]:
        """The full parameter dicts of candidate ``name``'s trials."""
        return [{**self.shared, **s} for s in _BY_NAME[name].trial_settings(self.trials, labelled)]


# A structure setting wider than the data is no richer map, only a slower one (auto once tried
# adapter_rank 4096 and adapter_hidden 16384 on 768 → 384 dimensions).
HIDDEN_PER_DIM = 4


def structure_ceiling(axis: str, new_dim: int, old_dim: int) -> int | None:
    """The widest sensible value of a structure axis for these widths: an adapter's rank at
    most min(new, old) (a wider one is the full affine map), a hidden layer at most
    ``HIDDEN_PER_DIM`` × the wider side; None for other axes."""
    if axis == "adapter_rank":
        return min(new_dim, old_dim)
    if axis in ("adapter_hidden", "map_hidden"):
        return HIDDEN_PER_DIM * max(new_dim, old_dim)
    return None


def default_objective(labelled: bool, has_relevance: bool) -> str:
    """``query`` when logged queries carry relevance, else ``class`` with labels, else
    ``instance``."""
    if has_relevance:
        return "query"
    return "class" if labelled else "instance"


def objective_problem(objective: str, labelled: bool, has_relevance: bool) -> str | None:
    """Why ``objective`` cannot be measured on this data, or None."""
    if objective not in OBJECTIVES:
        return f"unknown objective {objective!r}, expected one of {list(OBJECTIVES)}"
    if objective == "query" and not has_relevance:
        return "objective 'query' needs logged queries with relevant items"
    if objective == "class" and not labelled:
        return "objective 'class' needs labels (on the dataset or the gallery)"
    return None


def split_for_validation(
    train_idx: np.ndarray, seed: int, fraction: float = VALIDATION_FRACTION
) -> tuple[np.ndarray, np.ndarray] | None:
    """(fit, validation) carved from the training items by a seeded permutation; None when the
    training part is too small for both."""
    n = train_idx.size
    n_val = max(MIN_VALIDATION_ITEMS, math.floor(n * fraction))
    if n - n_val < MIN_FIT_ITEMS:
        return None
    perm = np.random.default_rng([seed, 1]).permutation(train_idx)
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


def compat_field_names() -> set[str]:
    return {f.name for f in dataclasses.fields(CompatParams)} - {"extra"}


@dataclass
class Trial:
    settings: dict[str, Any]
    validation: dict[str, Any]
    primary: float
    instance_r1: float
    eligible: bool = True
    history: list[dict[str, float]] = field(default_factory=list)
    # The epochs it trained: its settings' own, or a screening run's (``app.ml.auto.halving``).
    epochs: int | None = None


def pick(
    trials_by_candidate: dict[str, list[Trial]],
    primary_of: Callable[[Trial], float],
) -> tuple[str, dict[str, int]]:
    """Mark eligibility against procrustes's own-item R@1 and choose: each candidate's best
    eligible trial by the primary metric, then the best candidate (ties: the earlier one in
    ``CANDIDATES``, procrustes first). Returns the chosen name and each candidate's best trial."""
    floor = INSTANCE_FLOOR * trials_by_candidate["procrustes"][0].instance_r1
    best_trial: dict[str, int] = {}
    for name, trials in trials_by_candidate.items():
        for t in trials:
            t.eligible = name == "procrustes" or not t.instance_r1 < floor
        ranked = sorted(
            range(len(trials)),
            key=lambda i: (trials[i].eligible, _finite(primary_of(trials[i])), -i),
            reverse=True,
        )
        best_trial[name] = ranked[0]
    chosen = max(
        trials_by_candidate,
        key=lambda n: (
            trials_by_candidate[n][best_trial[n]].eligible,
            _finite(primary_of(trials_by_candidate[n][best_trial[n]])),
            -KNOWN_CANDIDATES.index(n),
        ),
    )
    return chosen, best_trial


def ranked_keys(
    trials: list[Trial], floor: float | None, primary_of: Callable[[Trial], float]
) -> tuple[list[tuple[bool, float]], int]:
    """Each trial's comparable score as ``pick`` ranks it (eligible under ``floor`` first, then
    the primary metric; ``floor`` None: every trial eligible) and the best one's index (the
    earlier on ties)."""
    keys = [(floor is None or not t.instance_r1 < floor, _finite(primary_of(t))) for t in trials]
    best = max(range(len(trials)), key=lambda i: (keys[i], -i))
    return keys, best


def _finite(value: float) -> float:
    return value if math.isfinite(value) else -math.inf
