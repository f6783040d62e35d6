"""What a job will cost the shared workers, estimated before it runs, in optimiser steps: the
unit the trainers' loops count (``app.ml.methods.compat._optimise``, ``app.ml.hmcl.trainer``),
known from the request and the dataset's size alone. Seconds would need the hardware's step
time (measured 3.6–37 ms a step on 2 CPU cores, by width and batch): steps rank jobs the same
on any hardware, and the cap that uses them (``max_queued_job_steps_per_tenant``) says so.

An upper estimate where the request does not settle it: the independent reference model is
counted whenever the method trains one with labels (whether the data has labels is known only
when the job loads it), ``auto`` counts every candidate it may train (label-only ones included)
with all of its extra trials, and closed-form fits (``procrustes``) cost no step. Jobs of other
kinds (``reembed``) train nothing: their work is paced by their own rate limit.
"""

from __future__ import annotations

import math
from typing import Any

from app.ml.auto import halving
from app.ml.auto.candidates import METHOD_OF, AutoParams
from app.ml.hmcl import ContinualParams
from app.ml.methods.compat import CompatParams
from app.upgrades import backbone, continual

# Methods fitted in closed form (no optimiser loop).
CLOSED_FORM = ("procrustes",)
# The reference every backbone upgrade is measured against (trained when the data has labels).
REFERENCE = "independent"


def training_steps(method: str, params: CompatParams, items: int) -> int:
    """Steps of one backbone training on ``items`` rows, as ``_optimise`` takes them: batches of
    ``batch_size`` rows, smaller on small data so that an epoch still has about
    ``min_batches_per_epoch`` of them, the ragged tail dropped."""
    if method in CLOSED_FORM or items < 2:
        return 0
    batch = max(2, min(params.batch_size, items // max(1, params.min_batches_per_epoch)))
    return params.epochs * max(1, items // batch)


def _candidate_steps(
    method: str, trials: list[dict[str, Any]], items: int, halving_on: bool
) -> int:
    """One ``auto`` candidate's trials as ``app.ml.upgrade.tuning`` trains them: with successive
    halving (``app.ml.auto.halving``) every trial a short screening run, then the finalists at
    full length (the longest trials counted: an upper estimate), else every trial in full."""
    full = [training_steps(method, CompatParams.from_dict(values), items) for values in trials]
    epochs = CompatParams.from_dict(trials[0]).epochs if trials else 0
    screen = halving.screen_epochs(epochs, len(trials), halving_on)
    if screen is None:
        return sum(full)
    screened = sum(
        training_steps(method, CompatParams.from_dict({**values, "epochs": screen}), items)
        for values in trials
    )
    return screened + sum(sorted(full, reverse=True)[: min(halving.FINALISTS, len(trials))])


def _backbone_steps(method: str, knobs: dict[str, Any], items: int) -> int:
    if method == "auto":
        auto = AutoParams.from_dict(knobs)
        steps = 0
        for name in auto.applicable(labelled=True):
            trials = auto.settings(name, labelled=True)
            trials += trials[:1] * auto.extra_for(name, labelled=True)
            steps += _candidate_steps(METHOD_OF[name], trials, items, auto.halving)
        reference = CompatParams.from_dict(auto.shared)
        return steps + training_steps(REFERENCE, reference, items)
    params = CompatParams.for_method(method, knobs)
    steps = training_steps(method, params, items)
    if method != REFERENCE:
        steps += training_steps(REFERENCE, params, items)
    return steps


def _continual_steps(params: dict[str, Any], rows: int) -> int:
    """``TaskTrainer``'s plan: batches of ``batch_size`` rows, at least ``epochs`` epochs and
    at least ``min_steps`` steps."""
    p = ContinualParams.from_dict(params)
    per_epoch = max(1, math.ceil(rows / p.batch_size))
    return max(p.epochs, math.ceil(p.min_steps / per_epoch)) * per_epoch


def estimated_steps(
    method: str, params: dict[str, Any] | None, items: int, eval_fraction: float
) -> int:
    """Optimiser steps a job of ``method`` is expected to take on a dataset of ``items`` rows
    (0 for a job that trains nothing, or whose parameters the trainer would refuse: such a job
    is refused at POST, or fails at once)."""
    params = dict(params or {})
    try:
        if method in backbone.METHODS:
            knobs = {
                k: v
                for k, v in params.items()
                if k not in (backbone.OBJECTIVE_PARAM, backbone.OLD_MODEL_PARAM)
            }
            trained = items - math.floor(items * eval_fraction)
            return _backbone_steps(method, knobs, trained)
        if method in continual.METHODS:
            return _continual_steps(params, items)
    except (ValueError, TypeError):
        return 0
    return 0
