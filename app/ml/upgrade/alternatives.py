"""Measure every alternative an upgrade offers on one evaluation set, in every view that applies.

Alternatives: ``stay`` (old model for queries and gallery), a bridge (a trained model whose
outputs search the old gallery, ranked by Lorentz distance), ``reindex`` (the new backbone used
natively: new query features against the items' new features, by cosine) and, for the class
view only, the ``independent`` head (a new model trained without compatibility, one of the two
references for P_com / P_up beside ``reindex``).

The query view searches the whole gallery where the evaluation set carries the gallery's
unpaired items (``EvalSet.distractor_points``): stay and a bridge rank every stored old vector;
a reindex can score natively only the paired items, so the unpaired ones stay in the old space
and the two are merged as the service merges them (``app.ml.upgrade.whole_gallery``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from app.ml.evaluation.retrieval import (
    RANK_DEPTH,
    arr,
    class_metrics,
    compatibility,
    instance_metrics,
    query_metrics,
    top_k,
)
from app.ml.methods.models import EmbeddingModel
from app.ml.upgrade.whole_gallery import key_blocks, top_of_keys


@dataclass
class EvalSet:
    """A gallery (rows = paired items), the items measured as queries (``rows``, positions in the
    gallery), their labels, and logged queries with their relevant gallery positions."""

    old_points: np.ndarray  # G×d, the old gallery in its Lorentz frame
    new_features: np.ndarray  # G×D, the same items by the new backbone
    rows: np.ndarray  # positions of the evaluated items in the gallery
    curv: float
    labels: np.ndarray | None = None  # G labels, or None
    query_features: np.ndarray | None = None  # Q×D
    query_old_points: np.ndarray | None = None  # Q×d, the same queries by the old model, lifted
    query_relevant: list[np.ndarray] | None = None  # per query: gallery positions
    # The gallery's unpaired items (no new features), in the old gallery's Lorentz frame: the
    # query view's searches meet them after the G paired items (positions G, G+1, …).
    distractor_points: np.ndarray | None = None  # M×d
    # How many unpaired items the gallery holds when the distractors are a sample (else None).
    unpaired_total: int | None = None
    seed: int = 0  # the reference sample's and the cross-fitting's seed (whole-gallery reindex)
    # Rankings computed once per evaluation set and read by several figures.
    cache: dict[str, np.ndarray] = field(default_factory=dict, repr=False, compare=False)

    @property
    def n_distractors(self) -> int:
        return 0 if self.distractor_points is None else int(self.distractor_points.shape[0])

    @cached_property
    def searched_old(self) -> np.ndarray:
        """Every old point the query view searches: the paired items, then the distractors."""
        if not self.n_distractors:
            return self.old_points
        assert self.distractor_points is not None
        return np.concatenate(
            [self.old_points, self.distractor_points.astype(self.old_points.dtype)]
        )

    @property
    def has_queries(self) -> bool:
        return self.query_relevant is not None and any(len(r) for r in self.query_relevant)

    @property
    def views(self) -> tuple[str, ...]:
        out = ["instance"]
        if self.has_queries:
            out.append("query")
        if self.labels is not None:
            out.append("class")
        return tuple(out)


def _instance(ev: EvalSet, queries: np.ndarray, gallery: np.ndarray, space: str) -> dict:
    ranked = top_k(queries, gallery, RANK_DEPTH, space=space, curv=ev.curv)  # type: ignore[arg-type]
    return instance_metrics(ranked, ev.rows)


def _query(ev: EvalSet, queries: np.ndarray, gallery: np.ndarray, space: str) -> dict:
    assert ev.query_relevant is not None
    ranked = top_k(queries, gallery, RANK_DEPTH, space=space, curv=ev.curv)  # type: ignore[arg-type]
    return query_metrics(ranked, ev.query_relevant)


def reindex_ranked(ev: EvalSet, bridge: EmbeddingModel | None = None) -> np.ndarray:
    """The reindex's best ``RANK_DEPTH`` gallery positions per held-out query. The paired items
    are scored natively (new query features, cosine); the distractors, which have no new
    features, in the old space by the old model's query vectors (a transition search) or, where
    the log has none, by ``bridge``'s query (a mixed search), merged as the service merges the
    two (``app.ml.upgrade.whole_gallery``). Without distractors: the native ranking alone (what
    the merge gives when every item is re-embedded)."""
    assert ev.query_features is not None and ev.query_relevant is not None
    if "reindex" in ev.cache:
        return ev.cache["reindex"]
    if not ev.n_distractors:
        ranked = top_k(ev.query_features, ev.new_features, RANK_DEPTH, space="cosine")
    else:
        if ev.query_old_points is not None:
            old_queries = ev.query_old_points
        elif bridge is not None:
            old_queries = bridge.embed(ev.query_features)
        else:
            raise ValueError(
                "a reindex of a gallery with unpaired items needs the old model's query "
                "vectors or a bridge to score them"
            )
        depth = min(RANK_DEPTH, ev.searched_old.shape[0])
        ranked = np.empty((len(ev.query_relevant), depth), dtype=np.int64)
        every = np.ones(ev.new_features.shape[0], dtype=bool)
        for block in key_blocks(
            ev.query_features,
            ev.new_features,
            old_queries,
            ev.searched_old,
            ev.curv,
            ev.query_relevant,
            ev.seed,
        ):
            ranked[block.rows] = top_of_keys(block.mixed(every), depth)
    ev.cache["reindex"] = ranked
    return ranked


def measure_bridge(ev: EvalSet, model: EmbeddingModel, views: tuple[str, ...] | None = None):
    """A trained model's queries against the old gallery (the query view: every stored item,
    ``EvalSet.searched_old``); ``class_new_new`` is the model's own space (items' outputs as
    query and gallery), the P_up side."""
    views = views or ev.views
    out: dict[str, Any] = {}
    item_emb = model.embed(ev.new_features[ev.rows])
    if "instance" in views:
        out["instance"] = _instance(ev, item_emb, ev.old_points, "lorentz")
    if "query" in views and ev.has_queries:
        assert ev.query_features is not None
        out["query"] = _query(ev, model.embed(ev.query_features), ev.searched_old, "lorentz")
    if "class" in views and ev.labels is not None:
        labels = ev.labels[ev.rows]
        out["class"] = class_metrics(item_emb, ev.old_points[ev.rows], labels, curv=ev.curv)
        out["class_new_new"] = class_metrics(item_emb, item_emb, labels, curv=ev.curv)
    return out


def measure_stay(ev: EvalSet) -> dict[str, Any]:
    """The old model for queries and gallery (the query view: every stored item). Instance view:
    the item's own old vector is the query, so it is first by construction (1.0 unless items
    share a vector)."""
    out: dict[str, Any] = {
        "instance": _instance(ev, ev.old_points[ev.rows], ev.old_points, "lorentz")
    }
    if ev.has_queries and ev.query_old_points is not None:
        out["query"] = _query(ev, ev.query_old_points, ev.searched_old, "lorentz")
    if ev.labels is not None:
        old = ev.old_points[ev.rows]
        out["class"] = class_metrics(old, old, ev.labels[ev.rows], curv=ev.curv)
    return out


def measure_reindex(ev: EvalSet, bridge: EmbeddingModel | None = None) -> dict[str, Any]:
    """The new backbone natively, by cosine: new query features against the items' new
    features (the gallery re-embedded — what a bridge avoids). The query view: the paired items
    re-embedded and the unpaired ones in the old space (``reindex_ranked``; ``bridge`` scores
    them where the log has no old query vectors)."""
    items = ev.new_features[ev.rows]
    out: dict[str, Any] = {"instance": _instance(ev, items, ev.new_features, "cosine")}
    if ev.has_queries:
        assert ev.query_relevant is not None
        out["query"] = query_metrics(reindex_ranked(ev, bridge), ev.query_relevant)
    if ev.labels is not None:
        out["class"] = class_metrics(items, items, ev.labels[ev.rows], space="cosine")
    return out


def measure_independent(ev: EvalSet, model: EmbeddingModel) -> dict[str, Any]:
    """Class view of a head trained without compatibility, in its own space."""
    if ev.labels is None:
        return {}
    emb = model.embed(ev.new_features[ev.rows])
    return {"class": class_metrics(emb, emb, ev.labels[ev.rows], curv=ev.curv)}


def assemble(
    stay: dict[str, Any],
    reindex: dict[str, Any],
    bridges: dict[str, dict[str, Any]],
    independent: dict[str, Any] | None = None,
) -> dict[str, dict[str, Any]]:
    """One entry per alternative: its views, ARR per view and metric (against ``reindex``) and,
    for bridges in the class view, P_com / P_up against the stronger of the raw new backbone
    (``reindex``'s class metrics) and the independent head."""
    out: dict[str, dict[str, Any]] = {}
    references = {"raw_new": reindex["class"]} if "class" in reindex else {}
    if independent and "class" in independent:
        references["independent"] = independent["class"]

    def with_arr(views: dict[str, Any]) -> dict[str, Any]:
        entry = {k: v for k, v in views.items() if k != "class_new_new"}
        entry["arr"] = {
            view: arr(metrics, reindex[view]) for view, metrics in entry.items() if view in reindex
        }
        return entry

    out["stay"] = with_arr(stay)
    for name, views in bridges.items():
        entry = with_arr(views)
        if "class" in views and references:
            comp = compatibility(views["class"], views["class_new_new"], stay["class"], references)
            entry["class_own_space"] = views["class_new_new"]
            entry.update(comp)
        out[name] = entry
    if independent:
        out["independent"] = {**independent, "role": "class-view reference (not a bridge)"}
    out["reindex"] = with_arr(reindex)
    return out


def primary_value(views: dict[str, Any], view: str, metric: str) -> float:
    value = views.get(view, {}).get(metric)
    return math.nan if value is None else float(value)
