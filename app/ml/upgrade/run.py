"""A backbone upgrade as the service runs it: split, train, and measure against the alternatives.

``run_backbone_upgrade`` holds out ``eval_fraction`` of the paired items (and the logged queries
about them), trains the requested method on the rest — or, for ``auto``, tunes and picks among
candidates on a validation split carved from the training part — and reports on held-out data
every alternative in every view that applies (instance, query→document, class; see
``app.ml.evaluation.retrieval``), ARR against reindexing, P_com/P_up against the stronger new reference,
and a recommendation (bridge, stay or reindex; ``app.ml.auto.verdict``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from app.ml.auto.candidates import OBJECTIVES, AutoParams, default_objective, objective_problem
from app.ml.geometry.space import EuclideanLift
from app.ml.methods.compat import BACKBONE_METHODS as COMPAT_METHODS
from app.ml.methods.compat import LABELLED_ONLY_METHODS, CompatParams
from app.ml.methods.training import NO_HOOKS, TrainingHooks
from app.ml.upgrade.data import (
    QueryLog,
    UpgradeData,
    UpgradeOutcome,
    split_for_evaluation,
    split_queries,
)
from app.ml.upgrade.pipeline import UpgradeContext, run_auto, run_explicit

__all__ = [
    "BACKBONE_METHODS",
    "OBJECTIVES",
    "QueryLog",
    "UpgradeData",
    "UpgradeOutcome",
    "check_backbone_request",
    "default_objective",
    "run_backbone_upgrade",
    "split_for_evaluation",
    "split_queries",
]

BACKBONE_METHODS: tuple[str, ...] = ("auto", *COMPAT_METHODS)

# On a host with at most SMALL_HOST_CORES cores an upgrade runs its torch work on ONE intra-op
# thread (issue 44 item 4). Its matrices are small (a batch of 512 × 768 → 384), and the cores
# are shared with the API, the database and other jobs: measured on 2 cores with the default
# upgrade of the public nouns (``bench.perf.training --default-upgrade``, ``--threads 2``), two
# threads spent 387–603 s of CPU where one spent 164–175 s, and took 310–782 s of wall time
# where one took 165–192 s (load averages 1–19); every figure of the upgrade was the same.
# Larger hosts keep torch's own setting.
SMALL_HOST_CORES = 2
SMALL_HOST_THREADS = 1


def default_threads(cores: int | None = None) -> int | None:
    """The intra-op threads an upgrade runs with on a host of ``cores`` cores (this one's when
    None): ``SMALL_HOST_THREADS`` on a small host, else None (torch's own setting)."""
    cores = os.cpu_count() if cores is None else cores
    return SMALL_HOST_THREADS if cores is not None and cores <= SMALL_HOST_CORES else None


@contextmanager
def intra_op_threads(threads: int | None) -> Iterator[None]:
    """torch's intra-op threads set to ``threads`` (None: left alone) for the block, and put back
    after. With torch's OpenMP backend the setting is the calling thread's own, so a job in a
    thread of the API process leaves the other threads' setting alone."""
    if threads is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def check_backbone_request(
    method: str,
    params: dict[str, Any] | None,
    n_items: int,
    eval_fraction: float,
    seed: int,
    labelled: bool,
    *,
    objective: str | None = None,
    n_queries: int = 0,
    queries_with_relevance: int = 0,
) -> dict[str, str]:
    """Everything ``run_backbone_upgrade`` would refuse, found before any training: a map from
    the offending request field (``method``, ``params``, ``eval_fraction``, ``dataset_id``,
    ``objective``) to the reason; empty when the request is acceptable."""
    problems: dict[str, str] = {}
    if method not in BACKBONE_METHODS:
        problems["method"] = f"unknown method {method!r}, expected one of {list(BACKBONE_METHODS)}"
    shared: dict[str, Any] | None = None
    try:
        if method == "auto":
            shared = AutoParams.from_dict(params).shared
        else:
            CompatParams.for_method(method, params)
            shared = dict(params or {})
    except ValueError as exc:
        problems["params"] = str(exc)
    if not 0.0 < eval_fraction < 1.0:
        problems["eval_fraction"] = "eval_fraction must lie strictly between 0 and 1"
    else:
        try:
            split_for_evaluation(n_items, eval_fraction, seed)
        except ValueError as exc:
            problems["dataset_id"] = str(exc)
    if not labelled:
        if method in LABELLED_ONLY_METHODS:
            problems["method"] = f"method {method!r} needs labels"
        elif shared is not None and shared.get("uncertainty") == "knn":
            problems["params"] = "uncertainty 'knn' needs labels; use 'auto', 'norm' or 'none'"
    if objective is not None:
        reason = objective_problem(objective, labelled, queries_with_relevance > 0)
        if reason:
            problems["objective"] = reason
    return problems


def run_backbone_upgrade(
    method: str,
    data: UpgradeData,
    lift: EuclideanLift,
    *,
    params: dict[str, Any] | None = None,
    seed: int = 0,
    eval_fraction: float = 0.2,
    hooks: TrainingHooks = NO_HOOKS,
    objective: str | None = None,
    old_model_available: bool = True,
    threads: int | None = None,
) -> UpgradeOutcome:
    """Train ``method`` (or, for ``auto``, tune and pick a candidate) on a seeded split and
    report every alternative on held-out data.

    The returned model is trained on the training part only (for ``auto``: on the fit part that
    validation was carved from), so the report measures exactly the model that gets served.
    ``objective`` defaults to ``default_objective``; ``old_model_available`` false (the old
    model can no longer embed queries) removes stay and transition from the verdict.
    ``threads``: torch's intra-op threads for the run (None: ``default_threads()``; the
    figures do not depend on it). Raises ``ValueError`` for a bad method,
    parameters, objective or data, and ``TrainingCancelled`` when ``hooks.should_stop()`` turns
    true.
    """
    if method not in BACKBONE_METHODS:
        raise ValueError(f"unknown method {method!r}, expected one of {list(BACKBONE_METHODS)}")
    labelled = data.labels is not None
    has_relevance = data.queries is not None and any(r.size for r in (data.queries.relevant or []))
    objective = objective or default_objective(labelled, has_relevance)
    reason = objective_problem(objective, labelled, has_relevance)
    if reason:
        raise ValueError(reason)
    auto = AutoParams.from_dict(params) if method == "auto" else None
    compat = None if auto else CompatParams.for_method(method, params)
    if data.old_vectors.shape[1] < 1:
        raise ValueError("old vectors must have at least one dimension")
    train_idx, eval_idx = split_for_evaluation(len(data), eval_fraction, seed)
    train_q, eval_q = split_queries(data.queries, eval_idx, eval_fraction, seed)
    if threads is not None and threads < 1:
        raise ValueError("threads must be at least 1")
    with intra_op_threads(default_threads() if threads is None else threads):
        ctx = UpgradeContext.build(data, lift, seed, hooks)
        if auto is not None:
            return run_auto(
                ctx, auto, objective, train_idx, eval_idx, train_q, eval_q, old_model_available
            )
        assert compat is not None
        return run_explicit(
            ctx,
            method,
            compat,
            objective,
            train_idx,
            eval_idx,
            train_q,
            eval_q,
            old_model_available,
        )
