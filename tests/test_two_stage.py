"""Two-stage search's core (``app.ml.backfill.two_stage``) and its benchmark's rules (issue 43).

On real vectors (tests/fixtures/wordnet_small.npz: lemma queries, gloss documents, MiniLM old,
mpnet new): with every document a candidate the weight-0 rerank *is* the reindex and weight 1
*is* staying; a rerank never returns what stage one did not propose; the fused score is the
formula of the module docstring."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.ml.backfill.two_stage import (
    Candidates,
    FusionScale,
    ceiling,
    embedded_per_search,
    fusion_scale,
    rerank,
    stage_one,
    top_cosine,
    unit,
)
from bench.quality import two_stage as bench
from bench.quality.querydoc import load_arrays


@pytest.fixture(scope="module")
def arrays() -> dict[str, np.ndarray]:
    return load_arrays(quick=True)


def _brute_top(queries: np.ndarray, docs: np.ndarray, k: int) -> np.ndarray:
    sims = unit(queries) @ unit(docs).T
    # Best first, lower id first among ties.
    return np.array([sorted(range(docs.shape[0]), key=lambda j: (-row[j], j))[:k] for row in sims])


def test_top_cosine_is_the_brute_force_order(arrays) -> None:
    ids, sims = top_cosine(arrays["query_old"][:40], arrays["doc_old"], 15, chunk=16)
    np.testing.assert_array_equal(ids, _brute_top(arrays["query_old"][:40], arrays["doc_old"], 15))
    assert np.all(np.diff(sims, axis=1) <= 0)


def test_every_document_a_candidate_gives_reindex_and_stay(arrays) -> None:
    n = arrays["doc_old"].shape[0]
    q = slice(0, 60)
    cands = stage_one(arrays["query_old"][q], arrays["doc_old"], n)
    new_only, _ = rerank(cands, arrays["query_new"][q], arrays["doc_new"], 10)
    reindex, _ = top_cosine(arrays["query_new"][q], arrays["doc_new"], 10)
    np.testing.assert_array_equal(new_only, reindex)
    scale = FusionScale(0.0, 1.0, 0.0, 1.0)
    old_only, _ = rerank(cands, arrays["query_new"][q], arrays["doc_new"], 10, 1.0, scale)
    stay, _ = top_cosine(arrays["query_old"][q], arrays["doc_old"], 10)
    np.testing.assert_array_equal(old_only, stay)


def test_the_fused_score_is_the_documented_formula(arrays) -> None:
    q = slice(0, 20)
    scale = fusion_scale(
        arrays["query_old"][100:200],
        arrays["doc_old"][:300],
        arrays["query_new"][100:200],
        arrays["doc_new"][:300],
    )
    cands = stage_one(arrays["query_old"][q], arrays["doc_old"], 50)
    ids, scores = rerank(cands, arrays["query_new"][q], arrays["doc_new"], 5, 0.3, scale)
    old = unit(arrays["query_old"][q])[:, None, :] * unit(arrays["doc_old"])[ids]
    new = unit(arrays["query_new"][q])[:, None, :] * unit(arrays["doc_new"])[ids]
    expected = (
        0.3 * (old.sum(-1) - scale.old_mean) / scale.old_std
        + 0.7 * (new.sum(-1) - scale.new_mean) / scale.new_std
    )
    np.testing.assert_allclose(scores, expected, rtol=1e-4, atol=1e-4)
    assert np.all(np.diff(scores, axis=1) <= 1e-6)


def test_the_rerank_keeps_to_the_candidates_and_its_ceiling(arrays) -> None:
    q = np.arange(80)
    cands = stage_one(arrays["query_old"][q], arrays["doc_old"], 40)
    relevant = [np.array([i]) for i in q]
    for depth in (5, 20, 40):
        ids, _ = rerank(cands, arrays["query_new"][q], arrays["doc_new"], 10, depth=depth)
        for row, proposed in zip(ids, cands.ids[:, :depth], strict=True):
            assert set(row.tolist()) <= set(proposed.tolist())
        found = np.mean([i in row for i, row in zip(q, ids, strict=True)])
        assert found <= ceiling(cands, relevant, depth) + 1e-12


@settings(max_examples=30, deadline=None)
@given(st.integers(min_value=1, max_value=6), st.integers(min_value=0, max_value=2**31))
def test_ties_keep_stage_one_order(width: int, seed: int) -> None:
    """Documents with one new vector tie in the rerank: they come back in stage one's order."""
    rng = np.random.default_rng(seed)
    docs_new = np.repeat(rng.normal(size=(1, 8)), 12, axis=0)
    ids = np.array([rng.permutation(12)])
    cands = Candidates(ids, np.linspace(1, 0, 12, dtype=np.float32)[None, :])
    ranked, _ = rerank(cands, rng.normal(size=(1, 8)), docs_new, width)
    np.testing.assert_array_equal(ranked[0], ids[0, :width])


def test_refusals() -> None:
    cands = Candidates(np.zeros((1, 2), np.int64), np.zeros((1, 2), np.float32))
    with pytest.raises(ValueError, match="weight"):
        rerank(cands, np.ones((1, 2)), np.ones((1, 2)), 1, 1.5)
    with pytest.raises(ValueError, match="fusion scale"):
        rerank(cands, np.ones((1, 2)), np.ones((1, 2)), 1, 0.5)
    flat = fusion_scale(np.ones((3, 2)), np.ones((4, 2)), np.ones((3, 2)), np.ones((4, 2)))
    assert flat.old_std > 0 and flat.new_std > 0


def test_embedded_per_search_counts_each_document_once() -> None:
    cands = Candidates(np.array([[1, 2, 3], [3, 2, 9]]), np.zeros((2, 3), np.float32))
    assert embedded_per_search(cands, 2) == 1.5  # {1, 2, 3} over two queries
    assert embedded_per_search(cands, 3) == 2.0  # {1, 2, 3, 9}


def test_the_default_depth_is_the_smallest_within_tolerance() -> None:
    curve = {25: (0.0, 0.50), 50: (0.1, 0.540), 100: (0.0, 0.546), 200: (0.3, 0.547)}
    assert bench.choose(curve) == 100  # 0.546 ≥ 0.547 − 0.005; 0.540 is not
    assert bench.choose({25: (0.0, 0.6), 400: (0.0, 0.5)}) == 25


def test_targets_are_met_only_when_the_interval_clears_them() -> None:
    def runs(differences: list[float]) -> list[dict]:
        rows = dict.fromkeys(bench.ROWS, 0.5)
        return [
            {"recall@10": {**rows, "two_stage_old": 0.5 + d, "reindex": 0.5, "stay": 0.5}}
            for d in differences
        ]

    def state(differences: list[float]) -> str:
        return bench.summarise(runs(differences))["targets"][0]["state"]

    assert state([0.010, 0.012, 0.011]) == "met"
    assert state([-0.010, -0.012, -0.011]).startswith("missed")
    assert state([0.03, -0.02, 0.01]) == "not shown"
    assert state([0.01]) == "not shown"  # one seed: no interval


def test_the_splits_never_use_the_held_back_synsets() -> None:
    n = 2_000
    held = set(bench.held_back(n).tolist())
    assert len(held) == round(bench.HELD_BACK_FRACTION * n)
    for seed in (1, 2):
        parts = bench.split(n, seed)
        used = np.concatenate(list(parts.values()))
        assert not held & set(used.tolist())
        assert used.size == len(set(used.tolist())) == n - len(held)
    assert not np.array_equal(bench.split(n, 1)["evaluation"], bench.split(n, 2)["evaluation"])


def test_the_quick_run_chooses_on_validation_and_reports(tmp_path) -> None:
    payload = bench.main(["--quick", "--seeds", "2", "--out", str(tmp_path / "r.json")])
    assert payload["held_back"]["evaluated"] is False
    for run in payload["runs"]:
        assert run["chosen"]["old"]["depth"] in bench.DEPTHS
        assert run["chosen"]["old"]["weight"] in bench.WEIGHTS
        # The validation curve is what the depth was chosen from.
        curve = {
            int(d): (v["weight"], v["recall@10"])
            for d, v in run["chosen"]["old"]["validation"].items()
        }
        assert bench.choose(curve) == run["chosen"]["old"]["depth"]
    assert "| target |" in bench.render(payload)


def test_new_cosines_agree_gathered_and_from_one_product(arrays) -> None:
    from app.ml.backfill.two_stage import new_cosines

    q, docs = arrays["query_new"][:30], arrays["doc_new"]
    few = np.random.default_rng(0).integers(0, docs.shape[0], size=(30, 1))  # gathered
    many = np.tile(np.arange(docs.shape[0]), (30, 1))  # one product with every document
    for ids in (few, many):
        expected = np.einsum("qd,qkd->qk", unit(q), unit(docs)[ids])
        np.testing.assert_allclose(new_cosines(q, docs, ids, budget=4096), expected, atol=1e-5)


def test_the_published_section_is_the_results_file_rendered() -> None:
    """BENCHMARKS' two-stage section is ``render`` of the committed results, to the character:
    no figure there is typed by hand."""
    import json

    from bench.common.report import BENCHMARKS

    payload = json.loads(bench.OUT.read_text())
    text = BENCHMARKS.read_text()
    section = text.split("<!-- two-stage:start -->", 1)[1].split("<!-- two-stage:end -->", 1)[0]
    assert section.strip() == f"## {bench.TITLE}\n\n{bench.render(payload)}".strip()
    assert payload["held_back"]["evaluated"] is False and len(payload["runs"]) >= 5
