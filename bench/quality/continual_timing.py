"""Per-step wall time of the continual methods: every method stepped on the same mini-batch in
interleaved rounds, as ratios to a plain AdamW step (``--timing-only`` and every full run)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from app.ml.hmcl import METHODS, TaskTrainer, run_continual_task
from bench.quality.continual_stream import (
    Task,
)


def time_steps(
    tasks: Sequence[Task], params: Mapping[str, dict[str, Any]], repeats: int, seed: int
) -> dict[str, Any]:
    """Per-step wall time of every method on task 2 (protected data = task 1), interleaved.

    One trainer per method, all starting from the same task-1 state; each round steps every
    trainer once on the same mini-batch in a fresh random order, so CPU contention from other
    processes falls on all methods alike. Ratios: median over rounds of (method step / plain
    AdamW step in that round).
    """
    first, second = tasks[0], tasks[1]
    start = run_continual_task(
        "finetune",
        None,
        first.train,
        first.train_labels,
        params=params["finetune"],
        seed=seed,
    )
    trainers = {
        m: TaskTrainer(
            m, start.state, second.train, second.train_labels, params=params[m], seed=seed
        )
        for m in METHODS
    }
    batch = torch.arange(min(trainers["finetune"].rows, trainers["finetune"].params.batch_size))
    for trainer in trainers.values():  # warm-up: allocator, first-call overheads
        trainer.train_step(batch)
    times: dict[str, list[float]] = {m: [] for m in METHODS}
    correction: dict[str, list[float]] = {m: [] for m in METHODS}
    order = list(METHODS)
    rng = np.random.default_rng(seed)
    for _ in range(repeats):
        rng.shuffle(order)
        for m in order:
            before = trainers[m].correction_seconds
            tic = time.perf_counter()
            trainers[m].train_step(batch)
            times[m].append(time.perf_counter() - tic)
            correction[m].append(trainers[m].correction_seconds - before)
    base = np.array(times["finetune"])
    out: dict[str, Any] = {
        "repeats": repeats,
        "rows": len(batch),
        "dim": int(next(iter(second.train.values())).shape[1]),
    }
    for m in METHODS:
        t = np.array(times[m])
        ratios = t / base
        out[m] = {
            "step_ms_median": float(np.median(t) * 1e3),
            "correction_ms_median": float(np.median(correction[m]) * 1e3),
            "ratio_median": float(np.median(ratios)),
            "ratio_iqr": [float(np.quantile(ratios, 0.25)), float(np.quantile(ratios, 0.75))],
        }
    return out
