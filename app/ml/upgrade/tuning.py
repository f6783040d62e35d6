"""``auto``'s validation trials: every candidate's grid, its extra trials and, where its trials
are screened, its finalists at full length (``app.ml.auto.halving``). Pure orchestration: the
caller passes how to train (``train``) and how to score on validation (``score``).

Trials run round by round across the candidates — every candidate's first grid trial, then
every second one, …, then the extra trials, then the finalists — not candidate by candidate:
each trial is deterministic in its settings and seed, so the order changes no model and no
figure, and after the first round every candidate's cost per epoch has been measured, which the
job's ETA prices the rest of the plan by (``app.ml.upgrade.progress``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from app.ml.auto import halving
from app.ml.auto.candidates import INSTANCE_FLOOR, METHOD_OF, AutoParams, Trial, ranked_keys
from app.ml.methods.compat import CompatParams
from app.ml.methods.models import EmbeddingModel
from app.ml.methods.training import TrainingHooks
from app.ml.upgrade.alternatives import primary_value
from app.ml.upgrade.progress import Progress

TrainFn = Callable[[str, CompatParams, TrainingHooks], EmbeddingModel]
ScoreFn = Callable[[EmbeddingModel], dict[str, Any]]


@dataclass
class Tuned:
    """Each candidate's trials as tried (``tried``: screening runs where its trials are
    screened), its full-length trials (``final``) with their models (``models``), the index in
    ``tried`` each final trial repeats (``final_of``) and its screening epochs (``screen``)."""

    tried: dict[str, list[Trial]] = field(default_factory=dict)
    final: dict[str, list[Trial]] = field(default_factory=dict)
    models: dict[str, list[EmbeddingModel]] = field(default_factory=dict)
    final_of: dict[str, list[int]] = field(default_factory=dict)
    screen: dict[str, int | None] = field(default_factory=dict)
    epochs: dict[str, int] = field(default_factory=dict)
    floor: float | None = None

    def epochs_trained(self, name: str) -> int:
        screened = self.screen.get(name) is not None
        runs = self.tried[name] + (self.final[name] if screened else [])
        return sum(t.epochs or 0 for t in runs)


def settings_key(settings: dict[str, Any]) -> str:
    """What prices an epoch: the settings but the epochs (a screening run's epoch costs what a
    full run's does)."""
    return json.dumps({k: v for k, v in settings.items() if k != "epochs"}, sort_keys=True)


def _own_epochs(name: str, settings: dict[str, Any]) -> int:
    return 0 if METHOD_OF[name] == "procrustes" else CompatParams.from_dict(settings).epochs


class _Runner:
    def __init__(
        self,
        progress: Progress,
        train: TrainFn,
        score: ScoreFn | None,
        sel_view: tuple[str, str] | None,
    ) -> None:
        self.progress, self.train, self.score, self.sel_view = progress, train, score, sel_view

    def run(
        self,
        name: str,
        settings: dict[str, Any],
        epochs: int,
        handles: tuple[int, int | None],
        **extra: Any,
    ) -> tuple[Trial, EmbeddingModel]:
        """Train ``name`` with ``settings`` for ``epochs`` epochs and score it on validation."""
        history: list[dict[str, float]] = []
        values = (
            settings if epochs == _own_epochs(name, settings) else {**settings, "epochs": epochs}
        )
        hooks = self.progress.start_training(handles[0], history, settings_key(settings), **extra)
        model = self.train(METHOD_OF[name], CompatParams.from_dict(values), hooks)
        validation: dict[str, Any] = {}
        if self.score is not None and handles[1] is not None:
            last = history[-1] if history else {"epoch": 0, "loss": math.nan}
            self.progress.evaluating(handles[1], last["epoch"], last["epoch"], last["loss"])
            validation = self.score(model)
            self.progress.evaluated()
        primary = primary_value(validation, *self.sel_view) if self.sel_view else math.nan
        r1 = primary_value(validation, "instance", "recall@1")
        trial = Trial(settings, validation, primary, r1, history=history, epochs=epochs)
        return trial, model


def tune(
    auto: AutoParams,
    names: tuple[str, ...],
    labelled: bool,
    progress: Progress,
    train: TrainFn,
    score: ScoreFn | None,
    sel_view: tuple[str, str] | None,
    dims: tuple[int, int],
) -> Tuned:
    """Every candidate of ``names`` (procrustes first) tried on validation (``score``; None:
    no validation split, each candidate's first setting trained once). Plans its work on
    ``progress`` (beside whatever the caller planned) and reports through it."""
    validating = score is not None
    grid = {n: auto.settings(n, labelled) for n in names}
    extra = {n: auto.extra_for(n, labelled) if validating else 0 for n in names}
    out = Tuned()
    for n in names:
        out.epochs[n] = _own_epochs(n, grid[n][0])
        count = len(grid[n]) + extra[n]
        out.screen[n] = halving.screen_epochs(out.epochs[n], count, auto.halving and validating)
        out.tried[n], out.final[n], out.models[n], out.final_of[n] = [], [], [], []

    def budget(n: str) -> int:
        screen = out.screen[n]
        return out.epochs[n] if screen is None else screen

    def plan(n: str, epochs: int) -> tuple[int, int | None]:
        return (
            progress.add_training(n, epochs),
            progress.add_evaluation() if validating else None,
        )

    grid_handles = {n: [plan(n, budget(n)) for _ in grid[n]] for n in names}
    extra_handles = {n: [plan(n, budget(n)) for _ in range(extra[n])] for n in names}
    final_handles = {
        n: [plan(n, out.epochs[n]) for _ in range(halving.FINALISTS)]
        for n in names
        if out.screen[n] is not None
    }
    runner = _Runner(progress, train, score, sel_view)
    kept: dict[str, list[EmbeddingModel]] = {n: [] for n in names}

    def attempt(n: str, settings: dict[str, Any], handles: tuple[int, int | None]) -> None:
        screened = out.screen[n] is not None
        trial, model = runner.run(
            n,
            settings,
            budget(n),
            handles,
            trial=len(out.tried[n]) + 1,
            trials=len(grid[n]) + extra[n],
            stage="screening" if screened else "full",
        )
        out.tried[n].append(trial)
        if not screened:  # a full-length trial: it competes as it is
            kept[n].append(model)

    # Procrustes first: its own-item R@1 sets the floor every other trial is ranked under.
    for n in names:
        if n == "procrustes":
            for s, h in zip(grid[n], grid_handles[n], strict=True):
                attempt(n, s, h)
            out.floor = INSTANCE_FLOOR * out.tried[n][0].instance_r1
    rounds = max((len(grid[n]) for n in names), default=0)
    for r in range(rounds):
        for n in names:
            if n != "procrustes" and r < len(grid[n]):
                attempt(n, grid[n][r], grid_handles[n][r])
    widening = {n: True for n in names}
    for r in range(max(extra.values(), default=0)):
        for n in names:
            if r >= extra[n] or not widening[n]:
                continue
            keys, best = ranked_keys(out.tried[n], out.floor, lambda t: t.primary)
            tried = [t.settings for t in out.tried[n]]
            following = auto.next_settings(n, labelled, tried, keys, best, dims)
            if following is None:
                # No new value to try: this candidate's remaining extra trials do not run.
                widening[n] = False
                for t_handle, e_handle in extra_handles[n][r:]:
                    progress.drop(t_handle)
                    if e_handle is not None:
                        progress.drop(e_handle)
                continue
            attempt(n, following, extra_handles[n][r])
    for n in names:
        for t in out.tried[n]:
            t.eligible = n == "procrustes" or out.floor is None or not t.instance_r1 < out.floor
        if out.screen[n] is None:
            out.final[n], out.models[n] = out.tried[n], kept[n]
            out.final_of[n] = list(range(len(out.tried[n])))
    for n, handles in final_handles.items():
        keys, _ = ranked_keys(out.tried[n], out.floor, lambda t: t.primary)
        chosen = halving.finalists(keys)
        for i, h in zip(chosen, handles, strict=False):
            trial, model = runner.run(
                n,
                out.tried[n][i].settings,
                out.epochs[n],
                h,
                trial=i + 1,
                trials=len(out.tried[n]),
                stage="final",
            )
            out.final[n].append(trial)
            out.models[n].append(model)
            out.final_of[n].append(i)
        for t_handle, e_handle in handles[len(chosen) :]:
            progress.drop(t_handle)
            if e_handle is not None:
                progress.drop(e_handle)
    return out
