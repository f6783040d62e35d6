"""Where the continual benchmark's trainings run (this process or spawned workers) and the
per-seed settings selection: every setting of a method's grid trained on the training rows minus
a validation carve, the best validation Overall chosen. Used by ``bench.quality.continual``."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from typing import Any

import numpy as np
import torch

from bench.common.workers import exit_with_parent
from bench.quality.continual_config import Config
from bench.quality.continual_stream import Task, carve_validation
from bench.quality.continual_training import run_method


def selection_score(run: Mapping[str, Any]) -> float:
    """Validation Overall, averaged over the kinds of task."""
    return float(np.mean([run["by_kind"][k]["overall"] for k in run["by_kind"]]))


def _start_worker(parent_pid: int, threads: int) -> None:
    exit_with_parent(parent_pid)
    torch.set_num_threads(threads)


class _InProcess(Executor):
    """``Executor`` that runs every call at submit time, in this process (``jobs`` 1)."""

    def submit(self, fn, /, *args, **kwargs) -> Future:  # type: ignore[override]
        future: Future = Future()
        future.set_result(fn(*args, **kwargs))
        return future


def trainer_pool(config: Config) -> Executor:
    """Where the trainings run: this process (``jobs`` 1), or ``jobs`` spawned workers that end
    with this process (``bench.common.workers``)."""
    if config.jobs <= 1:
        return _InProcess()
    return ProcessPoolExecutor(
        max_workers=config.jobs,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_start_worker,
        initargs=(os.getpid(), config.threads),
    )


def _selection_trial(
    method: str, carved: Sequence[Task], params: Mapping[str, Any], seed: int
) -> dict[str, Any]:
    run = run_method(method, carved, params, seed, full=False)
    return {
        "score": selection_score(run),
        "by_kind": run["by_kind"],
        "steps": run["steps"],
        "seconds": run["train_seconds"],
    }


def select_settings(
    method: str, tasks: Sequence[Task], config: Config, seed: int, pool: Executor | None = None
) -> dict[str, Any]:
    """Every setting of the grid trained on the tasks' training rows minus a validation carve,
    scored on that carve; the best by ``selection_score`` (the first on a tie). ``pool``: where
    the trials run; in this process without one."""
    return selection_result(submit_selection(method, tasks, config, seed, pool or _InProcess()))


def submit_selection(
    method: str, tasks: Sequence[Task], config: Config, seed: int, pool: Executor
) -> dict[str, Any]:
    """``select_settings``'s trials submitted to ``pool``, not waited for."""
    carved = [carve_validation(t, seed) for t in tasks]
    settings = config.settings(method)
    futures = [
        pool.submit(_selection_trial, method, carved, {**config.base_params, **s}, seed)
        for s in settings
    ]
    return {"futures": futures, "settings": settings, "method": method, "seed": seed}


def selection_result(pending: Mapping[str, Any]) -> dict[str, Any]:
    """The chosen setting of ``select_settings``'s trials, once they have run."""
    trials = []
    for setting, future in zip(pending["settings"], pending["futures"], strict=True):
        trials.append({"setting": setting, **future.result()})
        print(
            f"  seed {pending['seed']} select {pending['method']:9s} {setting}: validation Overall "
            f"{trials[-1]['score']:.4f} "
            + " ".join(
                f"{k} task-end {v['task_end']:.3f} bwt {v['bwt']:+.3f}"
                for k, v in trials[-1]["by_kind"].items()
            ),
            flush=True,
        )
    best = max(range(len(trials)), key=lambda j: (trials[j]["score"], -j))
    return {"seed": pending["seed"], "chosen": trials[best]["setting"], "trials": trials}
