"""The training and measuring behind ``run_backbone_upgrade``: one explicit method, or ``auto``.

Progress goes through ``TrainingHooks.progress`` with, besides ``epoch``/``epochs``/``loss``:
``phase`` ("training" or "evaluating"), ``candidate`` (the method being trained),
``candidate_index`` / ``candidates`` (1-based position among the trainings this run plans),
``trial`` / ``trials`` and ``stage`` ("screening", "final" or "full"; ``app.ml.auto.halving``)
for auto, ``eta_s`` (seconds left in the whole job, the work left priced by what the same work
took so far; None before anything finished) and ``job_fraction`` (the whole job's share done;
``app.ml.upgrade.progress``).
"""

from __future__ import annotations

import math
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
    split_for_validation,
)
from app.ml.auto.halving import FINALISTS, SCREEN_FRACTION
from app.ml.auto.halving import RULE as HALVING_RULE
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
)
from app.ml.upgrade.data import QueryLog, UpgradeData, UpgradeOutcome, split_queries
from app.ml.upgrade.outlook import transition_outlook
from app.ml.upgrade.paired_gains import paired_gains
from app.ml.upgrade.progress import Progress
from app.ml.upgrade.tuning import Tuned, tune
from app.ml.upgrade.two_stage_curve import two_stage_curve
from app.ml.upgrade.whole_gallery import describe


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
    served: str,
) -> tuple[dict[str, Any], EvalSet]:
    """Every alternative on held-out data: gallery = every paired item and, for the query view,
    every unpaired one (``searched``). ``served``: the bridge that scores the unpaired items in
    the reindex's old-space list when the log has no old query vectors."""
    ev = ctx.whole_gallery(ctx.eval_set(np.arange(len(ctx.data)), eval_idx, eval_q))
    measured = {name: measure_bridge(ev, model) for name, model in bridges.items()}
    ind = measure_independent(ev, independent) if independent is not None else None
    reindex = measure_reindex(ev, bridges[served])
    metrics = assemble(measure_stay(ev), reindex, measured, ind)
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


def _held_out_weight(
    ctx: UpgradeContext,
    val_set: EvalSet | None,
    eval_idx: np.ndarray,
    eval_q: np.ndarray,
    bridges: int,
) -> float:
    """What the held-out evaluation costs in validation evaluations (the ETA's unit for it):
    searches of the held-out items (and queries) against the whole gallery — every bridge,
    stay, the reindex (in the new features' width) and the calibration's — over one validation
    search. The query view's further figures (the reindex's merge, the two-stage curve, the
    transition outlook, the paired differences) count four searches each; 1 without
    validation."""
    if val_set is None or not val_set.rows.size:
        return 1.0
    unit = float(val_set.rows.size * val_set.old_points.shape[0])
    if val_set.has_queries and val_set.query_features is not None:
        unit += float(val_set.query_features.shape[0] * val_set.searched_old.shape[0])
    widths = ctx.data.new_features.shape[1] / max(1, ctx.data.old_vectors.shape[1])
    searches = bridges + 2 + widths
    paired = len(ctx.data)
    held = searches * eval_idx.size * paired
    if eval_q.size:
        held += 4.0 * searches * eval_q.size * (paired + ctx.data.n_distractors)
    if ctx.labelled:
        held += (2 * bridges + 3) * eval_idx.size**2
    return float(held) / unit


def _last(history: list[dict[str, float]]) -> dict[str, float]:
    return history[-1] if history else {"epoch": 0, "loss": math.nan}


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
    progress = Progress(ctx.hooks)
    own = progress.add_training(method, 0 if method == "procrustes" else params.epochs)
    reference = progress.add_training("procrustes", 0) if method != "procrustes" else None
    with_independent = ctx.labelled and method != "independent"
    independent_handle = progress.add_training("independent", params.epochs)
    if not with_independent:
        progress.drop(independent_handle)
    final = progress.add_evaluation()
    history: list[dict[str, float]] = []
    model = ctx.train(method, params, train_idx, train_q, progress.start_training(own, history))
    bridges = {method: model}
    if reference is not None:
        bridges["procrustes"] = ctx.train(
            "procrustes", params, train_idx, train_q, progress.start_training(reference, [])
        )
    independent = None
    if ctx.labelled:
        independent = (
            model
            if method == "independent"
            else ctx.train(
                "independent",
                params,
                train_idx,
                train_q,
                progress.start_training(independent_handle, []),
            )
        )
    last = _last(history)
    progress.evaluating(final, last["epoch"], last["epoch"], last["loss"])
    metrics, ev = _held_out(ctx, bridges, independent, eval_idx, eval_q, method)
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
    progress.evaluated()
    return UpgradeOutcome(
        model=model, report=json_safe(report), params=params.to_dict(), method=method
    )


def _trial_entry(trial: Trial, shared: dict[str, Any]) -> dict[str, Any]:
    return {
        "settings": {k: v for k, v in trial.settings.items() if k not in shared},
        "epochs": trial.epochs,
        "validation": trial.validation,
        "eligible": trial.eligible,
    }


def _candidate_entry(
    name: str, tuned: Tuned, best: int, metrics: dict[str, Any], shared: dict[str, Any]
) -> dict[str, Any]:
    """A candidate in the report: its best full-length trial, its held-out figures and every
    trial as tried (a screened trial that was trained again at full length carries that run as
    ``final``)."""
    b = tuned.final[name][best]
    trials = [_trial_entry(t, shared) for t in tuned.tried[name]]
    if tuned.screen[name] is not None:
        for i, final in zip(tuned.final_of[name], tuned.final[name], strict=True):
            trials[i]["final"] = {
                k: v for k, v in _trial_entry(final, shared).items() if k != "settings"
            }
    return {
        "name": name,
        "method": METHOD_OF[name],
        "chosen_settings": {k: v for k, v in b.settings.items() if k not in shared},
        "eligible": b.eligible,
        "validation": b.validation,
        "held_out": dict(metrics[name]),
        "screen_epochs": tuned.screen[name],
        "epochs_trained": tuned.epochs_trained(name),
        "trials": trials,
    }


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
    """Tune every candidate on validation (same trials and the same epoch budget each,
    ``app.ml.auto.halving``), serve the best.

    ``validation``: the items of ``train_idx`` to validate on (the rest fit); None — the service's
    case — carves them here (``split_for_validation``). A caller comparing auto with models tuned
    on its own carve passes that carve, so that both validate on the same items
    (``bench.quality.compat``: its old heads are trained on its fit part only, and a carve of
    auto's own put most of auto's validation items there — issue 42 item 2)."""
    validation_given = validation is not None
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
    # The widths structure axes are bounded by (a rank no wider than the data).
    dims = (int(ctx.data.new_features.shape[1]), int(ctx.data.old_vectors.shape[1]))
    base = CompatParams.from_dict(auto.shared)
    val_set = ctx.eval_set(np.sort(train_idx), val_idx, val_q) if split is not None else None
    sel_view = _selection_view(val_set, objective) if val_set is not None else None

    def score(model: EmbeddingModel) -> dict[str, Any]:
        assert val_set is not None and sel_view is not None
        measured = measure_bridge(val_set, model, tuple({"instance", sel_view[0]}))
        measured.pop("class_new_new", None)
        return measured

    progress = Progress(ctx.hooks)
    # The work after the trials is planned first: the ETA counts it from the first epoch on.
    independent_handle = progress.add_training("independent", base.epochs)
    if not ctx.labelled:
        progress.drop(independent_handle)
    final = progress.add_evaluation(
        _held_out_weight(ctx, val_set, eval_idx, eval_q, len(names) + int(ctx.labelled))
    )
    tuned = tune(
        auto,
        names,
        ctx.labelled,
        progress,
        lambda method, params, hooks: ctx.train(method, params, fit_idx, fit_q, hooks),
        score if val_set is not None else None,
        sel_view,
        dims,
    )
    chosen, best = pick(tuned.final, lambda t: t.primary)
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
    bridges = {n: tuned.models[n][best[n]] for n in names}
    served = bridges[chosen]
    independent = None
    if ctx.labelled:
        independent = ctx.train(
            "independent", base, fit_idx, fit_q, progress.start_training(independent_handle, [])
        )
    served_trial = tuned.final[chosen][best[chosen]]
    last = _last(served_trial.history)
    progress.evaluating(final, last["epoch"], last["epoch"], last["loss"], candidate=chosen)
    metrics, ev = _held_out(ctx, bridges, independent, eval_idx, eval_q, chosen)
    report = _report_base(ctx, objective, train_idx, eval_idx, train_q, eval_q)
    view, _ = _selection_view(ev, objective)
    candidates = [_candidate_entry(n, tuned, best[n], metrics, auto.shared) for n in names]
    # The served model is its candidate's method with the candidate's settings in its
    # parameters (class-map-mlp: class-map with map_hidden), so the stored method is one an
    # explicit request accepts; the report names the candidate too.
    curve = two_stage_curve(ev, served, ctx.seed)
    paired = paired_gains(ev, served, view)
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
            "validation_given": validation_given,
            "n_fit_queries": int(fit_q.size),
            "n_validation_queries": int(val_q.size),
            "selection_metric": None
            if sel_view is None
            else {"view": sel_view[0], "metric": sel_view[1]},
            "instance_floor": INSTANCE_FLOOR,
            "halving": {
                "screen_fraction": SCREEN_FRACTION if auto.halving else None,
                "finalists": FINALISTS if auto.halving else None,
                "epochs_trained": sum(tuned.epochs_trained(n) for n in names),
                "rule": HALVING_RULE if auto.halving else "every trial at full length",
            },
            "skipped_candidates": {n: "needs labels" for n in auto.skipped(ctx.labelled)},
            "note": note,
        },
        paired_gains=paired,
        recommendation=_verdict(
            ctx, ev, metrics, chosen, objective, view, old_model_available, curve, paired
        ),
        calibration=_calibration(ev, served),
        two_stage=curve,
    )
    progress.evaluated()
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
