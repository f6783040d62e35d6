"""The upgrade report's two-stage depth curve (issue 43, item 8) on real vectors: lemma queries
and gloss documents of tests/fixtures/wordnet_small.npz (MiniLM old, mpnet new).

``two_stage_curve`` must equal an independent numpy two-stage (cosine stage one on the raw old
vectors, new-cosine rerank) on the same queries: for a cosine gallery the service's Lorentz
order is the cosine order. And an upgrade's report carries the curve, whose shallowest depth
reranks stay's own top 10 and whose deepest comes near the reindex."""

from __future__ import annotations

import numpy as np
import torch

from app.ml.geometry.space import EuclideanLift
from app.ml.upgrade.alternatives import EvalSet
from app.ml.upgrade.run import run_backbone_upgrade
from app.ml.upgrade.two_stage_curve import two_stage_curve
from bench.quality.querydoc import build_data, load_arrays

LIFT = EuclideanLift()


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _lift(x: np.ndarray) -> np.ndarray:
    return LIFT(torch.as_tensor(x, dtype=torch.float64)).numpy()


class _Bridge:
    """A fixed linear map of new features into the old space, lifted: the served model's role."""

    def __init__(self, new: np.ndarray, old: np.ndarray) -> None:
        u, _, vt = np.linalg.svd(_unit(new).T @ _unit(old), full_matrices=False)
        self.w = u @ vt

    def embed(self, features: np.ndarray) -> np.ndarray:
        return _lift(_unit(features) @ self.w)


def _two_stage(stage: np.ndarray, docs_old, query_new, docs_new, depth: int) -> np.ndarray:
    sims_old = _unit(stage) @ _unit(docs_old).T
    cands = np.argsort(-sims_old, axis=1, kind="stable")[:, :depth]
    new = np.take_along_axis(_unit(query_new) @ _unit(docs_new).T, cands, axis=1)
    return np.take_along_axis(cands, np.argsort(-new, axis=1, kind="stable"), axis=1)


def _r10(ranked: np.ndarray, queries: np.ndarray) -> float:
    return float(np.mean([q in row[:10] for q, row in zip(queries, ranked, strict=True)]))


def test_the_curve_is_an_independent_two_stage() -> None:
    a = load_arrays(quick=True)
    queries = np.arange(300, 500)
    bridge = _Bridge(a["doc_new"][:300], a["doc_old"][:300])
    ev = EvalSet(
        old_points=_lift(a["doc_old"]),
        new_features=a["doc_new"],
        rows=queries,
        curv=LIFT.curv,
        query_features=a["query_new"][queries],
        query_old_points=_lift(a["query_old"][queries]),
        query_relevant=[np.array([q]) for q in queries],
    )
    curve = two_stage_curve(ev, bridge)  # type: ignore[arg-type]
    assert curve is not None and curve["queries"] == queries.size
    bridged = _unit(a["query_new"][queries]) @ bridge.w
    for depth in curve["depths"]:
        for source, stage in (("old", a["query_old"][queries]), ("bridge", bridged)):
            expected = _r10(
                _two_stage(stage, a["doc_old"], a["query_new"][queries], a["doc_new"], depth),
                queries,
            )
            assert abs(curve[source][str(depth)]["recall@10"] - expected) < 1e-9, (source, depth)


def test_an_upgrade_report_carries_the_curve() -> None:
    a = load_arrays(quick=True)
    out = run_backbone_upgrade(
        "procrustes", build_data(a, with_log=True, seed=3), LIFT, seed=3, eval_fraction=0.4
    )
    curve, metrics = out.report["two_stage"], out.report["metrics"]
    assert curve["depths"] == [10, 25, 50, 100, 200] and curve["weight"] == 0.0
    # Depth 10 reorders stay's own top 10 (the same recall@10); the bridged depth 10 the
    # bridge's; the deepest comes near the reindex.
    assert curve["old"]["10"]["recall@10"] == metrics["stay"]["query"]["recall@10"]
    assert curve["bridge"]["10"]["recall@10"] == metrics["procrustes"]["query"]["recall@10"]
    assert abs(curve["old"]["200"]["recall@10"] - metrics["reindex"]["query"]["recall@10"]) < 0.05


def test_the_served_default_depth_is_the_one_verdicts_judge() -> None:
    from app.core.settings import Settings
    from app.ml.upgrade.two_stage_curve import DEFAULT_DEPTH

    assert Settings(_env_file=None).rerank_default_depth == DEFAULT_DEPTH


def test_the_fusion_weight_is_chosen_on_one_half_and_reported_on_the_other() -> None:
    from app.ml.upgrade.two_stage_curve import FUSION_WEIGHTS

    a = load_arrays(quick=True)
    queries = np.arange(300, 500)
    ev = EvalSet(
        old_points=_lift(a["doc_old"]),
        new_features=a["doc_new"],
        rows=queries,
        curv=LIFT.curv,
        query_features=a["query_new"][queries],
        query_old_points=_lift(a["query_old"][queries]),
        query_relevant=[np.array([q]) for q in queries],
    )
    bridge = _Bridge(a["doc_new"][:300], a["doc_old"][:300])
    curve = two_stage_curve(ev, bridge)  # type: ignore[arg-type]
    fusion = curve["fusion"]
    assert fusion["weight"] in FUSION_WEIGHTS and fusion["depth"] == curve["default_depth"]
    assert fusion["fit_queries"] + fusion["report_queries"] == queries.size
    assert set(fusion["scale"]) == {"old_mean", "old_std", "new_mean", "new_std"}
    if fusion["weight"] == 0:
        assert fusion["recall@10"] == fusion["recall@10_weight_0"]
    # Seeded: the same report again.
    assert two_stage_curve(ev, bridge)["fusion"] == fusion  # type: ignore[arg-type]
    # Without the old model's query vectors there is nothing to fuse with.
    no_old = EvalSet(
        ev.old_points,
        ev.new_features,
        ev.rows,
        ev.curv,
        None,
        ev.query_features,
        None,
        ev.query_relevant,
    )
    assert "fusion" not in two_stage_curve(no_old, bridge)  # type: ignore[arg-type]
