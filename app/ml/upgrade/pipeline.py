"""The training and measuring behind ``run_backbone_upgrade``: one explicit method, or ``auto``.

Progress goes through ``TrainingHooks.progress`` with, besides ``epoch``/``epochs``/``loss``:
``phase`` ("training" or "evaluating"), ``candidate`` (the method being trained),
``candidate_index`` / ``candidates`` (1-based position among the trainings this run plans),
``trial`` / ``trials`` for auto, and ``eta_s`` (seconds left, estimated from the time each epoch
and each evaluation took so far; None before anything finished).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from app.ml.auto.candidates import (
    AUTO_CANDIDATES,
    INSTANCE_FLOOR,
    METHOD_OF,
    MIN_FIT_ITEMS,
    MIN_VALIDATION_ITEMS,
    PRIMARY_METRIC,
    AutoParams,
    Trial,
    pick,
    ranked_keys,
    split_for_validation,
)
from app.ml.auto.verdict import recommend
from app.ml.evaluation.calibration import labelled_calibration, unlabelled_calibration
from app.ml.evaluation.retrieval import METRIC_MEANINGS, json_safe
from app.ml.geometry.space import EuclideanLift
from app.ml.methods.compat import (
    PAIR_METHODS,
    CompatParams,
    settings_read_by,
    train_compatible_model,
)
from app.ml.methods.models import EmbeddingModel
from app.ml.methods.training import TrainingHooks
from app.ml.upgrade.alternatives import (
    EvalSet,
    assemble,
    measure_bridge,
    measure_independent,
    measure_reindex,
    measure_stay,
    primary_value,
)
from app.ml.upgrade.data import QueryLog, UpgradeData, UpgradeOutcome, split_queries
from app.ml.upgrade.outlook import transition_outlook
from app.ml.upgrade.paired_gains import paired_gains
from app.ml.upgrade.two_stage_curve import two_stage_curve
from app.ml.upgrade.whole_gallery import describe


class Progress:
    """Counts planned work (training epochs and evaluations) and reports it with an ETA."""

    def __init__(self, hooks: TrainingHooks, trainings: list[tuple[str, int]], evaluations: int):
        self.hooks = hooks
        self.trainings = trainings  # (candidate, epochs) in run order
        self.planned = len(trainings)  # less any skipped (``skip``)
        self.epochs_left = sum(max(1, e) for _, e in trainings)
        self.evaluations_left = evaluations
        self.epoch_seconds: list[float] = []
        self.eval_seconds: list[float] = []
        self.index = 0
        self.last = time.perf_counter()
        self.extra: dict[str, Any] = {}

    def eta(self) -> float | None:
        if not self.epoch_seconds:
            return None
        per_epoch = float(np.mean(self.epoch_seconds))
        per_eval = float(np.mean(self.eval_seconds)) if self.eval_seconds else per_epoch
        return round(self.epochs_left * per_epoch + self.evaluations_left * per_eval, 1)

    def stage(self, candidate: str, history: list[dict[str, float]], **extra: Any) -> TrainingHooks:
        """Hooks for the next training: record its loss history and report with context."""
        self.index += 1
        self.last = time.perf_counter()
        self.extra = {
            "phase": "training",
            "candidate": candidate,
            "candidate_index": self.index,
            "candidates": self.planned,
            **extra,
        }

        def progress(event: dict[str, Any]) -> None:
            now = time.perf_counter()
            self.epoch_seconds.append(now - self.last)
            self.last = now
            self.epochs_left = max(0, self.epochs_left - 1)
            if event.get("epoch"):
                history.append({"epoch": int(event["epoch"]), "loss": float(event["loss"])})
            if self.hooks.progress is not None:
                self.hooks.progress({**event, **self.extra, "eta_s": self.eta()})

        return TrainingHooks(progress=progress, should_stop=self.hooks.should_stop)

    def evaluating(self, epoch: int, epochs: int, loss: float, **extra: Any) -> None:
        base = self.extra
        if "candidate" in extra:  # a different stage: its trial counters no longer apply
            base = {k: v for k, v in base.items() if k not in ("trial", "trials")}
        self.extra = {**base, "phase": "evaluating", **extra}
        if self.hooks.progress is not None:
            self.hooks.progress(
                {"epoch": epoch, "epochs": epochs, "loss": loss, **self.extra, "eta_s": self.eta()}
            )

    def skip(self, epochs: int, trainings: int) -> None:
        """Planned trainings that will not run (and their evaluations)."""
        self.planned -= trainings
        self.epochs_left = max(0, self.epochs_left - max(1, epochs) * trainings)
        self.evaluations_left = max(0, self.evaluations_left - trainings)

    def evaluated(self, started: float) -> None:
        self.eval_seconds.append(time.perf_counter() - started)
        self.evaluations_left = max(0, self.evaluations_left - 1)


@dataclass
class UpgradeContext:
    data: UpgradeData
    lift: EuclideanLift
    seed: int
    hooks: TrainingHooks
    old_points: np.ndarray
    query_old_points: np.ndarray | None
    # The gallery's unpaired items lifted like the paired ones (None: none given).
    distractor_points: np.ndarray | None = None

    @classmethod
    def build(
        cls, data: UpgradeData, lift: EuclideanLift, seed: int, hooks: TrainingHooks
    ) -> UpgradeContext:
        q = data.queries
        qold = None
        if q is not None and q.old_vectors is not None:
            qold = lift(torch.from_numpy(q.old_vectors)).numpy()
        old = lift(torch.from_numpy(data.old_vectors)).numpy()
        distractors = None
        if data.n_distractors:
            assert data.distractors is not None
            distractors = lift(torch.from_numpy(data.distractors)).numpy()
        return cls(data, lift, seed, hooks, old, qold, distractors)

    @property
    def labelled(self) -> bool:
        return self.data.labels is not None

    def extra_pairs(
        self, query_rows: np.ndarray, item_rows: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """Training pairs from logged queries: (features, the query's old vector) where the log
        has the old model's vectors, and (features, a relevant item's old point) for each
        relevant item among ``item_rows`` (the items this model trains on; others are held out).

        Both, not one or the other: on the lemma → gloss validation split (seeds 0 and 1, the
        test part untouched; ``python -m bench.quality.querydoc_pairs``) a map trained on both reached
        R@10 0.502 / 0.505 against 0.482 / 0.482 with the old-vector pairs alone."""
        q = self.data.queries
        if q is None or query_rows.size == 0:
            return None
        features: list[np.ndarray] = []
        targets: list[np.ndarray] = []
        if self.query_old_points is not None:
            features.append(q.features[query_rows])
            targets.append(self.query_old_points[query_rows])
        if q.relevant is not None:
            training = np.zeros(len(self.data), dtype=bool)
            training[item_rows] = True
            pairs = [(i, r) for i in query_rows for r in q.relevant[i] if training[r]]
            if pairs:
                queries, items = np.array(pairs, dtype=np.int64).T
                features.append(q.features[queries])
                targets.append(self.old_points[items])
        if not features:
            return None
        return np.concatenate(features), np.concatenate(targets)

    def train(
        self,
        method: str,
        params: CompatParams,
        rows: np.ndarray,
        query_rows: np.ndarray,
        hooks: TrainingHooks,
    ) -> EmbeddingModel:
        # The references (procrustes, the independent head) and auto's candidates train beside
        # the requested method on its request: each gets the settings it reads.
        params = settings_read_by(method, params)
        labels = self.data.labels
        train_labels = None
        if labels is not None and method != "procrustes":
            # Class codes must be dense for the prototype layer: re-index what the split kept.
            train_labels = np.unique(labels[rows], return_inverse=True)[1]
        return train_compatible_model(
            method,
            self.data.new_features[rows],
            self.old_points[rows],
            train_labels,
            self.lift.curv,
            params,
            seed=self.seed,
            hooks=hooks,
            extra_pairs=self.extra_pairs(query_rows, rows) if method in PAIR_METHODS else None,
        )

    def eval_set(self, gallery: np.ndarray, items: np.ndarray, query_rows: np.ndarray) -> EvalSet:
        """Gallery = the paired items ``gallery`` (sorted row indices); measured = ``items``;
        queries = ``query_rows`` with their relevant items mapped to gallery positions (items
        outside the gallery dropped)."""
        d = self.data
        position = np.full(len(d), -1, dtype=np.int64)
        position[gallery] = np.arange(gallery.size)
        q = d.queries
        qf = qold = rel = None
        if q is not None and q.relevant is not None and query_rows.size:
            with_rel = [i for i in query_rows if q.relevant[i].size]
            if with_rel:
                qf = q.features[with_rel]
                qold = None if self.query_old_points is None else self.query_old_points[with_rel]
                rel = []
                for i in with_rel:
                    pos = position[q.relevant[i]]
                    rel.append(pos[pos >= 0])
        return EvalSet(
            old_points=self.old_points[gallery],
            new_features=d.new_features[gallery],
            rows=position[items],
            curv=self.lift.curv,
            labels=None if d.labels is None else d.labels[gallery],
            query_features=qf,
            query_old_points=qold,
            query_relevant=rel,
            seed=self.seed,
        )

    def whole_gallery(self, ev: EvalSet) -> EvalSet:
        """``ev`` whose query view also searches the gallery's unpaired items (the held-out
        figures; validation keeps to its own carve of the paired items)."""
        return replace(
            ev,
            distractor_points=self.distractor_points,
            unpaired_total=self.data.unpaired_total,
            cache={},  # rankings of the paired-only set would be wrong here
        )


def _selection_view(ev: EvalSet, objective: str) -> tuple[str, str]:
    """The objective's (view, metric), or own-item R@1 when that view is not measurable here."""
    view, metric = PRIMARY_METRIC[objective]
    return (view, metric) if view in ev.views else PRIMARY_METRIC["instance"]


def _searched(ev: EvalSet) -> dict[str, Any]:
    """What each held-out figure searched (``app.ml.upgrade.whole_gallery.describe``)."""
    old_list = None
    if ev.has_queries:
        old_list = "old model" if ev.query_old_points is not None else "bridge"
    return describe(
        ev.old_points.shape[0], ev.n_distractors, ev.unpaired_total, old_list, int(ev.rows.size)
    )


def _report_base(ctx: UpgradeContext, objective: str, train_idx, eval_idx, train_q, eval_q):
    q = ctx.data.queries
    n_rel = 0 if q is None or q.relevant is None else sum(1 for i in eval_q if q.relevant[i].size)
    return {
        "objective": objective,
        "primary_metric": dict(zip(("view", "metric"), PRIMARY_METRIC[objective], strict=True)),
        "n_train": int(train_idx.size),
        "n_eval": int(eval_idx.size),
        "labelled": ctx.labelled,
        "n_queries": 0 if q is None else len(q),
        "n_train_queries": int(train_q.size),
        "n_eval_queries": int(eval_q.size),
        "n_eval_queries_with_relevance": int(n_rel),
        "metric_meanings": METRIC_MEANINGS,
    }


def _held_out(
    ctx: UpgradeContext,
    bridges: dict[str, EmbeddingModel],
    independent: EmbeddingModel | None,
    eval_idx: np.ndarray,
    eval_q: np.ndarray,
    progress: Progress,
    served: str,
) -> tuple[dict[str, Any], EvalSet]:
    """Every alternative on held-out data: gallery = every paired item and, for the query view,
    every unpaired one (``searched``). ``served``: the bridge that scores the unpaired items in
    the reindex's old-space list when the log has no old query vectors."""
    ev = ctx.whole_gallery(ctx.eval_set(np.arange(len(ctx.data)), eval_idx, eval_q))
    started = time.perf_counter()
    measured = {name: measure_bridge(ev, model) for name, model in bridges.items()}
    ind = measure_independent(ev, independent) if independent is not None else None
    reindex = measure_reindex(ev, bridges[served])
    metrics = assemble(measure_stay(ev), reindex, measured, ind)
    progress.evaluated(started)
    return metrics, ev


def _calibration(ev: EvalSet, served: EmbeddingModel) -> dict[str, Any]:
    """Whether the old embeddings' uncertainty predicts search failures on held-out items
    (``app.ml.evaluation.calibration``); the gallery of ``ev`` is every paired item."""
    train_rows = np.setdiff1d(np.arange(ev.old_points.shape[0]), ev.rows)
    if ev.labels is not None and train_rows.size:
        return labelled_calibration(ev.old_points, ev.labels, ev.rows, train_rows, ev.curv)
    bridged = served.embed(ev.new_features[ev.rows])
    return unlabelled_calibration(ev.old_points, ev.rows, bridged, ev.curv)


def _verdict(
    ctx: UpgradeContext,
    ev: EvalSet,
    metrics: dict[str, Any],
    served: str,
    objective: str,
    view: str | None,
    old_model_available: bool,
    two_stage: dict[str, Any] | None = None,
    paired: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The recommendation (``two_stage``: the report's two-stage curve, for rule 4 of
    ``app.ml.auto.verdict``; ``paired``: the report's paired per-query differences, which every
    other rule compares by); a transition verdict also measures the transition search's curve
    on the held-out queries (``app.ml.upgrade.outlook``) to say how much to re-embed first."""
    args = (metrics, served, objective, view, old_model_available)
    verdict = recommend(*args, None, two_stage, paired)
    if verdict["action"] != "transition":
        return verdict
    outlook = transition_outlook(ev, ctx.seed)
    return recommend(*args, outlook, two_stage, paired)


def run_explicit(
    ctx: UpgradeContext,
    method: str,
    params: CompatParams,
    objective: str,
    train_idx: np.ndarray,
    eval_idx: np.ndarray,
    train_q: np.ndarray,
    eval_q: np.ndarray,
    old_model_available: bool = True,
) -> UpgradeOutcome:
    """The requested method beside procrustes (and, with labels, the independent reference),
    all trained on the training part."""
    plan = [(method, params.epochs)]
    if method != "procrustes":
        plan.append(("procrustes", 0))
    if ctx.labelled and method != "independent":
        plan.append(("independent", params.epochs))
    progress = Progress(ctx.hooks, plan, evaluations=1)
    history: list[dict[str, float]] = []
    model = ctx.train(method, params, train_idx, train_q, progress.stage(method, history))
    bridges = {method: model}
    if method != "procrustes":
        bridges["procrustes"] = ctx.train(
            "procrustes", params, train_idx, train_q, progress.stage("procrustes", [])
        )
    independent = None
    if ctx.labelled:
        independent = (
            model
            if method == "independent"
            else ctx.train(
                "independent", params, train_idx, train_q, progress.stage("independent", [])
            )
        )
    last = history[-1] if history else {"epoch": 0, "loss": math.nan}
    progress.evaluating(
        params.epochs if history else 0, params.epochs if history else 0, last["loss"]
    )
    metrics, ev = _held_out(ctx, bridges, independent, eval_idx, eval_q, progress, method)
    report = _report_base(ctx, objective, train_idx, eval_idx, train_q, eval_q)
    view, _ = _selection_view(ev, objective)
    curve = two_stage_curve(ev, model, ctx.seed)
    paired = paired_gains(ev, model, view)
    report.update(
        method=method,
        requested_method=method,
        chosen_method=method,
        chosen_candidate=method,
        views=list(ev.views),
        searched=_searched(ev),
        metrics=metrics,
        history=history,
        paired_gains=paired,
        recommendation=_verdict(
            ctx, ev, metrics, method, objective, view, old_model_available, curve, paired
        ),
        calibration=_calibration(ev, model),
        two_stage=curve,
    )
    return UpgradeOutcome(
        model=model, report=json_safe(report), params=params.to_dict(), method=method
    )


def run_auto(
    ctx: UpgradeContext,
    auto: AutoParams,
    objective: str,
    train_idx: np.ndarray,
    eval_idx: np.ndarray,
    train_q: np.ndarray,
    eval_q: np.ndarray,
    old_model_available: bool = True,
    validation: np.ndarray | None = None,
) -> UpgradeOutcome:
    """Tune every candidate on validation (same number of trials each), serve the best.

    ``validation``: the items of ``train_idx`` to validate on (the rest fit); None — the service's
    case — carves them here (``split_for_validation``). A caller comparing auto with models tuned
    on its own carve passes that carve, so that both validate on the same items
    (``bench.quality.compat``: its old heads are trained on its fit part only, and a carve of
    auto's own put most of auto's validation items there — issue 42 item 2)."""
    split = (
        split_for_validation(train_idx, ctx.seed)
        if validation is None
        else _given_split(train_idx, validation)
    )
    names = auto.applicable(ctx.labelled) if split is not None else ("procrustes",)
    if split is None:
        fit_idx, val_idx = train_idx, np.zeros(0, dtype=np.int64)
    else:
        fit_idx, val_idx = split
    # Training queries follow the same rule as held-out ones: a query about a validation item
    # validates; the rest (and a share of those without relevance) train.
    if train_q.size:
        sub = _subset_queries(ctx, train_q)
        fit_local, val_local = split_queries(sub, val_idx, 0.2, ctx.seed + 1)
        fit_q, val_q = train_q[fit_local], train_q[val_local]
    else:
        fit_q = val_q = train_q
    settings = {n: auto.settings(n, ctx.labelled) for n in names}
    # The widths structure axes are bounded by (a rank no wider than the data).
    dims = (int(ctx.data.new_features.shape[1]), int(ctx.data.old_vectors.shape[1]))
    base = CompatParams.from_dict(auto.shared)
    # Each tuned candidate's extra trials are planned with its grid's epochs (they vary only
    # the tuned axis); one that finds no new value gives its epochs back (``skip``).
    extra = {n: auto.extra_for(n, ctx.labelled) if split is not None else 0 for n in names}
    plan = [
        (n, 0 if METHOD_OF[n] == "procrustes" else CompatParams.from_dict(s).epochs)
        for n in names
        for s in [*settings[n], *settings[n][:1] * extra[n]]
    ]
    if ctx.labelled:
        plan.append(("independent", base.epochs))
    progress = Progress(ctx.hooks, plan, evaluations=len(plan) + 1)

    trials: dict[str, list[Trial]] = {}
    models: dict[str, list[EmbeddingModel]] = {}
    val_set = ctx.eval_set(np.sort(train_idx), val_idx, val_q) if split is not None else None
    sel_view = _selection_view(val_set, objective) if val_set is not None else None
    floor: float | None = None
    for name in names:
        trials[name], models[name] = [], []
        queue = list(settings[name])
        planned = len(queue) + extra[name]
        while queue:
            s = queue.pop(0)
            history: list[dict[str, float]] = []
            params = CompatParams.from_dict(s)
            t = len(trials[name])
            hooks = progress.stage(name, history, trial=t + 1, trials=planned)
            model = ctx.train(METHOD_OF[name], params, fit_idx, fit_q, hooks)
            validation: dict[str, Any] = {}
            if val_set is not None and sel_view is not None:
                last = history[-1] if history else {"epoch": 0, "loss": math.nan}
                progress.evaluating(last["epoch"], last["epoch"], last["loss"])
                started = time.perf_counter()
                views = tuple({"instance", sel_view[0]})
                validation = measure_bridge(val_set, model, views)
                validation.pop("class_new_new", None)
                progress.evaluated(started)
            primary = primary_value(validation, *sel_view) if sel_view else math.nan
            r1 = primary_value(validation, "instance", "recall@1")
            trials[name].append(Trial(s, validation, primary, r1, history=history))
            models[name].append(model)
            if not queue and len(trials[name]) < planned:
                keys, best_so_far = ranked_keys(trials[name], floor, lambda t: t.primary)
                tried = [t.settings for t in trials[name]]
                following = auto.next_settings(name, ctx.labelled, tried, keys, best_so_far, dims)
                if following is None:
                    progress.skip(params.epochs, planned - len(trials[name]))
                else:
                    queue.append(following)
        if name == "procrustes":
            floor = INSTANCE_FLOOR * trials[name][0].instance_r1
    chosen, best = pick(trials, lambda t: t.primary)
    note = (
        None
        if split is not None
        else (
            f"{train_idx.size} training items are too few to carve a validation split: "
            "served procrustes, which has nothing to tune"
        )
    )
    if sel_view is not None and sel_view[0] != PRIMARY_METRIC[objective][0]:
        # The objective's view has no validation data (e.g. no logged queries about training
        # items): the choice is made on what validation can measure, own-item R@1 (every
        # candidate, procrustes included, ranked by it), and the report says so.
        note = (
            f"no validation data for the {objective!r} objective's view: chosen by "
            f"{sel_view[0]} {sel_view[1]} on validation, the view that has data "
            "(candidates' figures on the other views are shown for information)"
        )
    served = models[chosen][best[chosen]]
    independent = None
    if ctx.labelled:
        independent = ctx.train(
            "independent", base, fit_idx, fit_q, progress.stage("independent", [])
        )
    bridges = {n: models[n][best[n]] for n in names}
    served_trial = trials[chosen][best[chosen]]
    last = served_trial.history[-1] if served_trial.history else {"epoch": 0, "loss": math.nan}
    progress.evaluating(last["epoch"], last["epoch"], last["loss"], candidate=chosen)
    metrics, ev = _held_out(ctx, bridges, independent, eval_idx, eval_q, progress, chosen)
    report = _report_base(ctx, objective, train_idx, eval_idx, train_q, eval_q)
    view, _ = _selection_view(ev, objective)
    candidates = []
    for n in names:
        b = trials[n][best[n]]
        candidates.append(
            {
                "name": n,
                "method": METHOD_OF[n],
                "chosen_settings": {k: v for k, v in b.settings.items() if k not in auto.shared},
                "eligible": b.eligible,
                "validation": b.validation,
                "held_out": {k: v for k, v in metrics[n].items()},
                "trials": [
                    {
                        "settings": {k: v for k, v in t.settings.items() if k not in auto.shared},
                        "validation": t.validation,
                        "eligible": t.eligible,
                    }
                    for t in trials[n]
                ],
            }
        )
    # The served model is its candidate's method with the candidate's settings in its
    # parameters (class-map-mlp: class-map with map_hidden), so the stored method is one an
    # explicit request accepts; the report names the candidate too.
    curve = two_stage_curve(ev, bridges[chosen], ctx.seed)
    paired = paired_gains(ev, bridges[chosen], view)
    report.update(
        method=METHOD_OF[chosen],
        requested_method="auto",
        chosen_method=chosen,
        chosen_candidate=chosen,
        views=list(ev.views),
        searched=_searched(ev),
        metrics=metrics,
        history=served_trial.history,
        candidates=candidates,
        auto={
            **auto.to_dict(),
            "n_fit": int(fit_idx.size),
            "n_validation": int(val_idx.size),
            "validation_given": validation is not None,
            "n_fit_queries": int(fit_q.size),
            "n_validation_queries": int(val_q.size),
            "selection_metric": None
            if sel_view is None
            else {"view": sel_view[0], "metric": sel_view[1]},
            "instance_floor": INSTANCE_FLOOR,
            "skipped_candidates": {n: "needs labels" for n in auto.skipped(ctx.labelled)},
            "note": note,
        },
        paired_gains=paired,
        recommendation=_verdict(
            ctx, ev, metrics, chosen, objective, view, old_model_available, curve, paired
        ),
        calibration=_calibration(ev, bridges[chosen]),
        two_stage=curve,
    )
    # The served method's own settings: a shared override only other candidates read is not
    # one of its parameters (an explicit request for it would be refused).
    params = settings_read_by(METHOD_OF[chosen], CompatParams.from_dict(served_trial.settings))
    params = params.to_dict()
    return UpgradeOutcome(
        model=served, report=json_safe(report), params=params, method=METHOD_OF[chosen]
    )


def _given_split(train_idx: np.ndarray, validation: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(fit, validation), both sorted, from a caller's validation items: they must be distinct
    training items and leave ``MIN_FIT_ITEMS`` to fit and ``MIN_VALIDATION_ITEMS`` to validate
    (the bounds of auto's own carve); ValueError otherwise."""
    val_idx = np.unique(np.asarray(validation, dtype=np.int64))
    if val_idx.size != np.asarray(validation).size:
        raise ValueError("validation items must be distinct")
    outside = np.setdiff1d(val_idx, train_idx)
    if outside.size:
        raise ValueError(f"{outside.size} validation items are not training items")
    fit_idx = np.setdiff1d(train_idx, val_idx)
    if val_idx.size < MIN_VALIDATION_ITEMS or fit_idx.size < MIN_FIT_ITEMS:
        raise ValueError(
            f"a given validation carve needs ≥ {MIN_VALIDATION_ITEMS} validation and "
            f"≥ {MIN_FIT_ITEMS} fit items, got {val_idx.size} and {fit_idx.size}"
        )
    return fit_idx, val_idx


def _subset_queries(ctx: UpgradeContext, rows: np.ndarray):
    """The query log restricted to ``rows`` (relevance kept as item rows)."""
    q = ctx.data.queries
    assert q is not None
    return QueryLog(
        features=q.features[rows],
        old_vectors=None if q.old_vectors is None else q.old_vectors[rows],
        relevant=None if q.relevant is None else [q.relevant[i] for i in rows],
    )


__all__ = ["AUTO_CANDIDATES", "UpgradeContext", "run_auto", "run_explicit"]
