"""An upgrade's progress as one job: the work planned, what it took so far, and the ETA of the
whole job (issue 44 item 4: the ETA was 2–3 × too low, and the bar followed one trial).

The plan is a list of trainings (a candidate, its epochs, the settings when known) and
evaluations (a weight: how many validation-sized searches the evaluation costs). Every epoch and
every evaluation is timed as it ends. The ETA is the work left priced by what the same kind of
work took so far:

- an epoch by the seconds an epoch of the same candidate *with the same settings* took (a
  finalist repeats a screened setting, so its price is measured); else by the candidate's mean
  epoch (its other settings); else by the mean over the candidates measured so far. Candidates
  differ tenfold per epoch (hbct against affine), so one mean over every epoch — the earlier
  ETA — was off by the mix of what had run. A training's first epoch is priced apart (its
  set-up: a Procrustes start, first passes), once per training not yet started;
- an evaluation by the mean seconds per unit of weight of the evaluations timed so far, else by
  the mean epoch (nothing else is known yet);
- and the whole by the machine's *current* speed: the work timed in the last ``RECENT_SHARE`` of
  the elapsed time (at least ``RECENT_MIN_S``) took ``speed`` × what those means price it at, and
  the rest is assumed to go at that speed. Other jobs share the cores: measured on the public
  nouns, the load average fell from 19 to 1 within one upgrade, the epochs sped up threefold,
  and means over the whole run alone overestimated the time left fourfold near the end.

``job_fraction`` — elapsed ÷ (elapsed + ETA), never decreasing — is the whole job's share done:
the one bar a client draws. Each event also names the candidate, its trial and the stage, and
``evaluated_s`` — the seconds the evaluations that ended took, in all.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.ml.methods.training import TrainingHooks

# The window the current speed is read from: this share of the elapsed time, at least
# RECENT_MIN_S seconds; the factor is kept within [1 / SPEED_BOUND, SPEED_BOUND].
RECENT_SHARE = 0.2
RECENT_MIN_S = 30.0
SPEED_BOUND = 4.0


@dataclass
class _Work:
    candidate: str | None  # None: an evaluation
    left: float  # epochs left (a training) or weight left (an evaluation)
    key: str | None = None  # the training's settings, once known
    started: bool = False


class Progress:
    """Planned work and the seconds it took; reports through ``hooks.progress`` with the ETA."""

    def __init__(self, hooks: TrainingHooks, clock: Callable[[], float] = time.perf_counter):
        self.hooks = hooks
        self.clock = clock
        self.work: list[_Work] = []
        # Seconds of each training's first epoch (its set-up included) and of its later ones,
        # by (candidate, settings).
        self.first: dict[tuple[str, str | None], list[float]] = {}
        self.later: dict[tuple[str, str | None], list[float]] = {}
        self.eval_seconds: list[tuple[float, float]] = []  # (seconds, weight)
        # Every timed unit: (when it ended, seconds, what): ("epoch", candidate, key, first) or
        # ("eval", weight).
        self.timed: list[tuple[float, float, tuple[Any, ...]]] = []
        self.index = 0  # trainings started
        self.began = clock()
        self.last = self.began
        self.shown = 0.0
        self.extra: dict[str, Any] = {}
        self._eval: tuple[int, float] | None = None

    # --- the plan ---
    def add_training(self, candidate: str, epochs: int, key: str | None = None) -> int:
        """Plan a training of ``epochs`` epochs (a closed form counts as one); its handle."""
        self.work.append(_Work(candidate, float(max(1, epochs)), key))
        return len(self.work) - 1

    def add_evaluation(self, weight: float = 1.0) -> int:
        """Plan an evaluation costing ``weight`` validation-sized searches; its handle."""
        self.work.append(_Work(None, float(weight)))
        return len(self.work) - 1

    def drop(self, handle: int) -> None:
        """Planned work that will not run (an extra trial that found no new value)."""
        self.work[handle].left = 0.0

    @property
    def planned(self) -> int:
        """Trainings planned and not dropped (started ones included)."""
        return sum(1 for w in self.work if w.candidate is not None and (w.started or w.left > 0))

    # --- the estimate ---
    def _rate(self, candidate: str, key: str | None) -> float | None:
        """Seconds an epoch after a training's first is priced at, from the nearest evidence:
        the same candidate and settings, else the candidate, else the mean over the candidates
        measured — at each, its later epochs, else its first ones."""

        def same(c: str, k: str | None) -> bool:
            return (c, k) == (candidate, key)

        def mine(c: str, k: str | None) -> bool:
            return c == candidate

        for belongs in (same, mine):
            for table in (self.later, self.first):
                found = [s for (c, k), v in table.items() if belongs(c, k) for s in v]
                if found:
                    return float(np.mean(found))
        for table in (self.later, self.first):
            by_candidate: dict[str, list[float]] = {}
            for (c, _), v in table.items():
                by_candidate.setdefault(c, []).extend(v)
            means = [float(np.mean(v)) for v in by_candidate.values() if v]
            if means:
                return float(np.mean(means))
        return None

    def _setup(self, candidate: str, key: str | None, rate: float) -> float:
        """What a training's first epoch takes beyond ``rate`` (its set-up: a closed-form
        start, a first pass over the data), by the same fallbacks."""
        same = self.first.get((candidate, key))
        mine = same or [s for (c, _), v in self.first.items() if c == candidate for s in v]
        if not mine:
            return 0.0
        return max(0.0, float(np.mean(mine)) - rate)

    def _per_weight(self) -> float:
        weights = sum(w for _, w in self.eval_seconds)
        if weights > 0:
            return sum(s for s, _ in self.eval_seconds) / weights
        return self._rate("", None) or 0.0

    def _priced(self, unit: tuple[Any, ...], per_weight: float) -> float:
        """What a timed unit is priced at by every measurement so far."""
        if unit[0] == "eval":
            return per_weight * unit[1]
        _, candidate, key, first = unit
        rate = self._rate(candidate, key) or 0.0
        return rate + (self._setup(candidate, key, rate) if first else 0.0)

    def speed(self) -> float:
        """Seconds the recent work took ÷ seconds the means price it at (1: as fast as on
        average; 0.5: twice as fast now)."""
        if not self.timed:
            return 1.0
        per_weight = self._per_weight()
        now = self.timed[-1][0]
        window = max(RECENT_MIN_S, RECENT_SHARE * (now - self.began))
        took = priced = 0.0
        for ended, seconds, unit in reversed(self.timed):
            if ended < now - window:
                break
            took += seconds
            priced += self._priced(unit, per_weight)
        if priced <= 0 or took <= 0:
            return 1.0
        return float(np.clip(took / priced, 1 / SPEED_BOUND, SPEED_BOUND))

    def eta(self) -> float | None:
        """Seconds left for the whole plan; None before the first epoch ended."""
        if not self.first:
            return None
        per_weight = self._per_weight()
        total = 0.0
        for w in self.work:
            if w.left <= 0:
                continue
            if w.candidate is None:
                total += w.left * per_weight
                continue
            rate = self._rate(w.candidate, w.key) or 0.0
            total += w.left * rate
            if not w.started:
                total += self._setup(w.candidate, w.key, rate)
        return round(total * self.speed(), 1)

    def _emit(self, event: dict[str, Any]) -> None:
        if self.hooks.progress is None:
            return
        eta = self.eta()
        if eta is not None:
            elapsed = self.clock() - self.began
            done = elapsed / (elapsed + eta) if elapsed + eta > 0 else 0.0
            self.shown = max(self.shown, min(done, 1.0))
        spent = round(sum(s for s, _ in self.eval_seconds), 3)
        self.hooks.progress(
            {
                **event,
                **self.extra,
                "eta_s": eta,
                "job_fraction": round(self.shown, 4),
                "evaluated_s": spent,
            }
        )

    # --- what runs ---
    def start_training(
        self, handle: int, history: list[dict[str, float]], key: str | None = None, **extra: Any
    ) -> TrainingHooks:
        """Hooks for planned training ``handle``: time its epochs, record its loss history and
        report with context (``extra``: trial, trials, stage)."""
        work = self.work[handle]
        assert work.candidate is not None
        work.started = True
        if key is not None:
            work.key = key
        self.index += 1
        self.last = self.clock()
        self.extra = {
            "phase": "training",
            "candidate": work.candidate,
            "candidate_index": self.index,
            "candidates": self.planned,
            **extra,
        }
        candidate = work.candidate
        epochs = {"done": 0}

        def progress(event: dict[str, Any]) -> None:
            now = self.clock()
            first = epochs["done"] == 0
            epochs["done"] += 1
            table = self.first if first else self.later
            table.setdefault((candidate, work.key), []).append(now - self.last)
            self.timed.append((now, now - self.last, ("epoch", candidate, work.key, first)))
            self.last = now
            work.left = max(0.0, work.left - 1)
            if event.get("epoch"):
                history.append({"epoch": int(event["epoch"]), "loss": float(event["loss"])})
            self.extra["candidates"] = self.planned
            self._emit(event)

        return TrainingHooks(progress=progress, should_stop=self.hooks.should_stop)

    def evaluating(self, handle: int, epoch: int, epochs: int, loss: float, **extra: Any) -> None:
        """Planned evaluation ``handle`` starts (after the training that reported ``epoch`` of
        ``epochs`` and ``loss``)."""
        base = self.extra
        if "candidate" in extra:  # a different stage: its trial counters no longer apply
            base = {k: v for k, v in base.items() if k not in ("trial", "trials", "stage")}
        self.extra = {**base, "phase": "evaluating", **extra}
        self._eval = (handle, self.clock())
        self._emit({"epoch": epoch, "epochs": epochs, "loss": loss})

    def evaluated(self) -> None:
        """The evaluation started last has ended."""
        assert self._eval is not None
        handle, started = self._eval
        work = self.work[handle]
        now = self.clock()
        self.eval_seconds.append((now - started, work.left))
        self.timed.append((now, now - started, ("eval", work.left)))
        work.left = 0.0
        self._eval = None
