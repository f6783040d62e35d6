"""Galleries in Milvus, checked against the exact FAISS/float64 search on the real WordNet fixture
rows, on milvus-lite files under tmp_path. A representative subset runs on a real Milvus server
as well (Milvus 2.3.5 standalone, ``tests/service/milvus_server.py``): writes, reads and scans,
a sealed HNSW search of a one-vector and of a two-vector layout, the schema and its reading back,
the storage adapter and the read-only attach (``ON_BOTH``, ``ON_BOTH_TEAMS`` and the parameters
naming ``server``). Every test on both would add about 3 minutes to the suite (each server
collection takes ~3 s to load, each Strong read waits for a time tick); the others check the
engine's arithmetic, which the server does not change."""

from __future__ import annotations

import inspect
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from pymilvus import DataType, MilvusClient

from app.galleries.models import Gallery
from app.ml.geometry.space import EuclideanLift
from app.vectors.engine import VectorStorage
from app.vectors.faiss.index import LorentzIndex
from app.vectors.lorentz_rows import cosine_lift, exact_distances
from app.vectors.milvus import engine as engine_module
from app.vectors.milvus import search as milvus_search
from app.vectors.milvus.attach import AttachedCollection, AttachError
from app.vectors.milvus.engine import CollectionFormat, MilvusEngine, MilvusGallery
from app.vectors.milvus.layouts import GalleryLayout, choose_layout
from app.vectors.milvus.search import DEFAULT_OVERFETCH, POINCARE_OVERFETCH, SearchHits
from app.vectors.milvus.storage import MilvusVectorStorage, collection_name, layout_of
from app.vectors.rerank import exact_top_k, recall_within
from bench.perf.engine_workload import spread_points
from tests.service.milvus_server import (  # noqa: F401  (milvus_server_uri: the fixture)
    dropped_after,
    milvus_server_uri,
)

OLD = "all-MiniLM-L6-v2"
NEW = "all-mpnet-base-v2"
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def engine(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MilvusEngine]:
    """An engine on a milvus-lite file, or, parametrized ``server``, on the shared Milvus server
    (its collections dropped after the module)."""
    if getattr(request, "param", "lite") == "lite":
        engine = MilvusEngine(str(tmp_path_factory.mktemp("milvus") / "galleries.db"))
        yield engine
        engine.close()
        return
    uri = request.getfixturevalue("milvus_server_uri")
    with dropped_after(uri):
        engine = MilvusEngine(uri)
        yield engine
        engine.close()


@pytest.fixture(scope="module")
def rows(wordnet_small: dict) -> dict[str, np.ndarray]:
    """Gallery: the 1,600 gloss and lemma MiniLM rows; queries: the 32 class-name rows and 100
    gallery rows with fresh noise (real rows, never the gallery's own points)."""
    gallery = np.concatenate([wordnet_small[f"gloss.{OLD}"], wordnet_small[f"lemma.{OLD}"]])
    rng = np.random.default_rng(0)
    picks = rng.integers(0, len(gallery), 100)
    noisy = gallery[picks] + 0.05 * rng.standard_normal((100, gallery.shape[1]))
    queries = np.concatenate(
        [wordnet_small[f"class_gloss.{OLD}"], wordnet_small[f"class_lemma.{OLD}"], noisy]
    )
    return {"gallery": gallery.astype(np.float32), "queries": queries.astype(np.float32)}


# The tests of the real-server subset (see the module docstring).
ON_BOTH = pytest.mark.parametrize("engine", ["lite", "server"], indirect=True)


def item_ids(n: int) -> list[str]:
    return [f"item-{i}" for i in range(n)]


def recall(hits: SearchHits, points: np.ndarray, queries: np.ndarray) -> float:
    """Recall@10 of the hits against the brute-force float64 top-10, ties counted as right; the
    hits' distances are recomputed from the stored points, not taken from the search."""
    _, true_dist = exact_top_k(queries, points, 10, 1.0)
    positions = np.array(
        [[int(i.rsplit("-", 1)[1]) if i else -1 for i in row] for row in hits.item_ids]
    )
    found = exact_distances(queries[:, None, :], points[np.maximum(positions, 0)], 1.0)
    return recall_within(np.where(positions >= 0, found, np.inf), true_dist)


def lifted(vectors: np.ndarray, scale: float, metric: str = "cosine") -> np.ndarray:
    lift = EuclideanLift(curv=1.0, scale=scale, metric=metric)
    return lift(torch.from_numpy(vectors.astype(np.float64))).numpy().astype(np.float32)


@pytest.mark.parametrize(
    ("engine", "index_type", "lift_scale"),
    [
        ("lite", "HNSW", 3.0),
        ("lite", "FLAT", 3.0),
        ("lite", "HNSW", None),
        ("server", "HNSW", 3.0),
    ],
    indirect=["engine"],
)
def test_cosine_gallery_ranks_like_the_exact_lorentz_search(
    engine: MilvusEngine, rows: dict, index_type: str, lift_scale: float | None
) -> None:
    """With ``lift_scale`` the collection searches the stored vectors and lifts them itself;
    without, it indexes the points it is given."""
    layout, _ = choose_layout(one_radius=True, exact=index_type == "FLAT")
    name = f"cosine_{index_type.lower()}_{'lift' if lift_scale else 'points'}"
    gallery = engine.create_gallery(
        GalleryLayout(name, 384, 384, 1.0, layout, index_type, lift_scale=lift_scale)
    )
    points = lifted(rows["gallery"], 3.0)
    gallery.upsert(item_ids(len(points)), rows["gallery"], None if lift_scale else points)
    # Sealed: the index then answers (unsealed rows are scanned exactly).
    gallery.seal()
    queries = lifted(rows["queries"], 3.0).astype(np.float64)
    hits = gallery.search(queries, 10)
    measured = recall(hits, points, queries)
    assert measured >= (1.0 if index_type == "FLAT" else 0.99), measured
    # Distances are the float64 Lorentz distances of the stored points, as the FAISS path's
    # (which stores float32 points; the lift computed here from the vectors stays in float64).
    index = LorentzIndex.build(384, 1.0, "flat", {}, np.arange(len(points)), points)
    ids, exact_dist = index.search(queries, 10)
    same = np.array(hits.item_ids) == np.array([[f"item-{i}" for i in row] for row in ids])
    assert same.mean() > 0.95
    tolerance = 1e-6 if lift_scale else 1e-9
    np.testing.assert_allclose(hits.distances[same], exact_dist[same], rtol=tolerance, atol=1e-9)


def test_cosine_lift_is_the_gallery_lift(rows: dict) -> None:
    for scale in (0.5, 3.0, 6.0):
        expected = EuclideanLift(curv=0.7, scale=scale)(
            torch.from_numpy(rows["gallery"].astype(np.float64))
        )
        computed = cosine_lift(rows["gallery"], scale, 0.7)
        np.testing.assert_allclose(computed, expected.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("engine", "radius"),
    [("lite", 1.0), ("lite", 3.0), ("lite", 6.0), ("server", 3.0)],
    indirect=["engine"],
)
def test_poincare_ann_recall_at_radii(engine: MilvusEngine, rows: dict, radius: float) -> None:
    """The L2 HNSW over Poincaré-ball coordinates with the engine's own k′ and ef (fewer
    candidates than the tangent layout's 300) and the float64 re-rank finds the exact top-10;
    the points it returns are the stored ones (rebuilt from the float32 ball row and its gap)."""
    assert POINCARE_OVERFETCH < DEFAULT_OVERFETCH
    gallery = engine.create_gallery(
        GalleryLayout(f"poincare_r{int(radius)}", 384, 384, 1.0, "poincare", "HNSW")
    )
    points = spread_points(rows["gallery"], radius, rows["gallery"])
    gallery.upsert(item_ids(len(points)), rows["gallery"], points)
    gallery.seal()
    queries = spread_points(rows["queries"], radius, rows["gallery"]).astype(np.float64)
    hits = gallery.search(queries, 10)
    measured = recall(hits, points, queries)
    assert measured >= 0.97, measured
    positions = np.array([[int(i.rsplit("-", 1)[1]) for i in row] for row in hits.item_ids])
    np.testing.assert_allclose(hits.points, points[positions], rtol=2e-6, atol=1e-7)
    recomputed = exact_distances(queries[:, None, :], points[positions], 1.0)
    np.testing.assert_allclose(hits.distances, recomputed, rtol=1e-5, atol=1e-5)


def test_poincare_layout_finds_points_far_from_the_origin(engine: MilvusEngine, rows: dict) -> None:
    """At radius 12 the ball coordinates sit within 3e-5 of the boundary: each stored point is
    still its own nearest item, at the distance float32 storage allows (the FAISS path stores
    float32 points too)."""
    gallery = engine.create_gallery(
        GalleryLayout("poincare_far", 384, 384, 1.0, "poincare", "HNSW")
    )
    points = spread_points(rows["gallery"][:400], 12.0, rows["gallery"])
    gallery.upsert(item_ids(400), rows["gallery"][:400], points)
    queries = points[::20].astype(np.float64)
    hits = gallery.search(queries, 1)
    assert [row[0] for row in hits.item_ids] == [f"item-{i}" for i in range(0, 400, 20)]
    np.testing.assert_allclose(hits.points[:, 0], queries, rtol=2e-6, atol=1e-6)
    own = exact_distances(queries, points[::20].astype(np.float32).astype(np.float64), 1.0)
    np.testing.assert_allclose(hits.distances[:, 0], own, atol=2e-3)


@pytest.mark.parametrize("radius", [1.0, 3.0, 6.0])
def test_tangent_ann_recall_at_radii(engine: MilvusEngine, rows: dict, radius: float) -> None:
    """The L2 HNSW over log₀(x) with k′ = 100 candidates (ef = 8 k′, the engine's factor) and the
    float64 re-rank finds the exact top-10 (measured 0.997 / 0.999 / 0.999 at radii 1 / 3 / 6,
    sealed so that the HNSW answers); without the over-fetch it does not (0.36 at radius 6): the
    test sees a bad candidate list."""
    gallery = engine.create_gallery(
        GalleryLayout(f"tangent_r{int(radius)}", 384, 384, 1.0, "tangent", "HNSW")
    )
    points = spread_points(rows["gallery"], radius, rows["gallery"])
    gallery.upsert(item_ids(len(points)), rows["gallery"], points)
    gallery.seal()
    queries = spread_points(rows["queries"], radius, rows["gallery"]).astype(np.float64)
    measured = recall(gallery.search(queries, 10, overfetch=100), points, queries)
    assert measured >= 0.97, measured
    if radius == 6.0:
        without = recall(gallery.search(queries, 10, overfetch=10), points, queries)
        assert without < 0.7, without


def test_lifted_flat_layout_is_exact_at_several_radii(
    engine: MilvusEngine, rows: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    gallery = engine.create_gallery(GalleryLayout("lifted_exact", 384, 384, 1.0, "lifted", "FLAT"))
    points = spread_points(rows["gallery"], 6.0, rows["gallery"])
    gallery.upsert(item_ids(len(points)), rows["gallery"], points)
    queries = spread_points(rows["queries"], 6.0, rows["gallery"]).astype(np.float64)
    whole = gallery.search(queries, 10)
    assert recall(whole, points, queries) == 1.0
    # A batch larger than the re-rank's memory bound is searched in parts, with the same answer.
    monkeypatch.setattr(milvus_search, "RERANK_BUDGET", 7 * DEFAULT_OVERFETCH * 385)
    parts = gallery.search(queries, 10)
    # Equal up to rounding (a block's float64 sums may run in another order) and to the order
    # of exact ties (the fixture holds rows whose gloss and lemma embeddings coincide).
    np.testing.assert_allclose(parts.distances, whole.distances, rtol=1e-12, atol=1e-12)
    assert recall(parts, points, queries) == 1.0
    same = np.array(parts.item_ids) == np.array(whole.item_ids)
    assert same.mean() > 0.99
    np.testing.assert_array_equal(parts.row_ids[same], whole.row_ids[same])


@ON_BOTH
def test_upsert_replaces_and_delete_removes(engine: MilvusEngine, rows: dict) -> None:
    gallery = engine.create_gallery(GalleryLayout("writes", 384, 384, 1.0, "cosine", "HNSW"))
    vectors = rows["gallery"][:50]
    # Ids a filter expression must escape.
    ids = [*item_ids(47), 'quote"d', "back\\slash", "é ünïcode"]
    first = gallery.upsert(
        ids, vectors, lifted(vectors, 1.0), labels=ids, metadata=[{"n": i} for i in range(50)]
    )
    assert gallery.count() == 50
    np.testing.assert_array_equal(first, np.arange(50))

    replaced = rows["gallery"][100:103]
    # Two replaced items and one new: the replaced keep their internal ids.
    again = gallery.upsert(
        [ids[2], ids[0], "new"], replaced, lifted(replaced, 1.0), labels=["new"] * 3
    )
    np.testing.assert_array_equal(again, [2, 0, 50])
    assert gallery.count() == 51
    stored = gallery.fetch([ids[2], "missing", ids[0], ids[48]])
    assert stored.item_ids == [ids[2], ids[0], ids[48]]
    np.testing.assert_array_equal(stored.row_ids, [2, 0, 48])
    np.testing.assert_array_equal(stored.vectors[:2], replaced[:2])
    np.testing.assert_array_equal(stored.vectors[2], vectors[48])
    assert stored.labels == ["new", "new", ids[48]]
    # A replaced item's metadata is what the replacing write gave (none), not the old one.
    assert stored.metadata == [None, None, {"n": 48}]
    assert gallery.lookup([ids[0], "missing", 'quote"d']) == {
        ids[0]: (0, "new"),
        'quote"d': (47, 'quote"d'),
    }
    assert gallery.names([48, 0, 999]) == {48: (ids[48], ids[48]), 0: (ids[0], "new")}
    hits = gallery.search(lifted(replaced[1:2], 1.0), 1)
    assert hits.item_ids == [[ids[0]]] and hits.distances[0, 0] < 1e-3
    assert hits.row_ids.tolist() == [[0]]

    assert gallery.delete([ids[0], 'quote"d', "never-stored"]) == 2
    assert gallery.count() == 49
    assert gallery.existing_ids([*ids[:2], 'quote"d']) == {ids[1]}
    found = gallery.search(lifted(replaced, 1.0), 10)
    found_items = {i for row in found.item_ids for i in row}
    assert ids[0] not in found_items
    names = gallery.names(found.row_ids.ravel())
    assert {names[int(r)][0] for r in found.row_ids.ravel()} == found_items
    batches = list(gallery.scan(batch_size=7))
    scanned = np.concatenate([b.row_ids for b in batches])
    np.testing.assert_array_equal(scanned, sorted(set(range(51)) - {0, 47}))
    every = gallery.names(scanned)
    assert [i for b in batches for i in b.item_ids] == [every[int(r)][0] for r in scanned]
    # Each scanned row is its item's own (a server answers a range of row ids in item id order,
    # "item-10" before "item-8": sorting the answer must keep each row's fields with it).
    scanned_ids = [i for b in batches for i in b.item_ids]
    again = gallery.fetch(scanned_ids)
    np.testing.assert_array_equal(np.concatenate([b.vectors for b in batches]), again.vectors)
    assert [label for b in batches for label in b.labels] == again.labels
    assert [m for b in batches for m in b.metadata] == again.metadata
    # A deleted item that comes back gets a fresh internal id (ids are never reused).
    back = gallery.upsert([ids[0]], replaced[:1], lifted(replaced[:1], 1.0))
    np.testing.assert_array_equal(back, [51])
    assert gallery.delete([ids[0]]) == 1
    assert gallery.delete([ids[0]]) == 0
    # No label and no metadata read back as none, on a server without nullable fields too (issue
    # 46: a Milvus 2.3 server refused the nulls); there an empty label, which would read back as
    # none, is refused.
    gallery.upsert(["bare"], vectors[:1], lifted(vectors[:1], 1.0))
    bare = gallery.fetch(["bare"])
    assert (bare.labels, bare.metadata) == ([None], [None])
    assert gallery.lookup(["bare"]) == {"bare": (52, None)}
    assert gallery.names([52]) == {52: ("bare", None)}
    if not gallery.form.nulls:
        with pytest.raises(ValueError, match="must not be empty"):
            gallery.upsert(["empty"], vectors[:1], lifted(vectors[:1], 1.0), labels=[""])
        assert gallery.existing_ids(["empty"]) == set()


def test_a_collection_without_nullable_fields_stores_absence_as_empty_and_null(
    engine: MilvusEngine, rows: dict
) -> None:
    """The format a Milvus 2.3 server gives a collection (no nullable fields), on milvus-lite:
    an absent label is stored as "" and absent metadata as JSON null, and both read back as
    absent; an empty label is refused there, a given one kept."""
    made = engine.create_gallery(GalleryLayout("no_nulls", 384, 384, 1.0, "cosine", "FLAT"))
    gallery = MilvusGallery(engine, made.layout, CollectionFormat(nulls=False))
    vectors = rows["gallery"][:3]
    gallery.upsert(
        item_ids(3),
        vectors,
        lifted(vectors, 1.0),
        labels=[None, "cat", None],
        metadata=[None, {}, {"n": 1}],
    )
    raw = engine.client.query(
        "no_nulls", filter="row_id >= 0", output_fields=["item_id", "label", "metadata"]
    )
    stored = {row["item_id"]: (row["label"], row["metadata"]) for row in raw}
    assert stored == {"item-0": ("", None), "item-1": ("cat", {}), "item-2": ("", {"n": 1})}
    read = gallery.fetch(item_ids(3))
    assert read.labels == [None, "cat", None] and read.metadata == [None, {}, {"n": 1}]
    labels = {item: label for item, (_, label) in gallery.lookup(item_ids(3)).items()}
    assert labels == {"item-0": None, "item-1": "cat", "item-2": None}
    with pytest.raises(ValueError, match="must not be empty"):
        gallery.upsert(["x"], vectors[:1], lifted(vectors[:1], 1.0), labels=[""])
    assert gallery.count() == 3
    engine.drop_gallery("no_nulls")


def test_bad_writes_change_nothing(engine: MilvusEngine, rows: dict) -> None:
    gallery = engine.create_gallery(GalleryLayout("refusals", 384, 384, 1.0, "cosine", "FLAT"))
    vectors = rows["gallery"][:4]
    gallery.upsert(item_ids(4), vectors, lifted(vectors, 1.0))
    # Points at several radii would make the cosine ranking differ from the Lorentz one.
    with pytest.raises(ValueError, match="one radius"):
        gallery.upsert(item_ids(4), vectors, spread_points(vectors, 3.0, rows["gallery"]))
    with pytest.raises(ValueError, match="unique"):
        gallery.upsert(["a", "a"], vectors[:2], lifted(vectors[:2], 1.0))
    bad = vectors.copy()
    bad[1, 0] = np.nan
    with pytest.raises(ValueError, match="finite"):
        gallery.upsert(item_ids(4), bad, lifted(vectors, 1.0))
    np.testing.assert_array_equal(gallery.fetch(item_ids(4)).vectors, vectors)
    with pytest.raises(ValueError, match="FLAT"):
        GalleryLayout("x", 4, 4, 1.0, "lifted", "HNSW")


def test_search_width_below_the_candidates_is_refused(
    engine: MilvusEngine, rows: dict, tmp_path: Path
) -> None:
    """ef < k′ would cap the candidate list the re-rank sees: refused, not silently replaced."""
    with pytest.raises(ValueError, match="ef_factor"):
        MilvusEngine(str(tmp_path / "never.db"), ef_factor=0)
    assert not (tmp_path / "never.db").exists()
    gallery = engine.create_gallery(GalleryLayout("ef_refusal", 384, 384, 1.0, "tangent", "FLAT"))
    points = spread_points(rows["gallery"][:8], 1.0, rows["gallery"])
    gallery.upsert(item_ids(8), rows["gallery"][:8], points)
    with pytest.raises(ValueError, match="ef_factor"):
        gallery.search(points[:2].astype(np.float64), 3, ef_factor=0)
    assert gallery.search(points[:2].astype(np.float64), 3).item_ids[0][0] == "item-0"


@ON_BOTH
def test_reopened_engine_reads_the_layout_back(engine: MilvusEngine, rows: dict) -> None:
    layout = GalleryLayout(
        "reopen", 384, 384, 2.0, "tangent", "HNSW", {"m": 8, "ef_construction": 40}
    )
    made = engine.create_gallery(layout)
    again = MilvusEngine(engine.uri)
    assert again.open_gallery("reopen").layout == layout
    # The collection's format too, read from its schema (a 2.3 server: no nulls, one vector).
    assert again.open_gallery("reopen").form == made.form
    assert made.form.vector_array == (not engine.multi_vector())
    assert again.create_gallery(layout).layout == layout
    with pytest.raises(ValueError, match="another layout"):
        again.create_gallery(GalleryLayout("reopen", 384, 384, 1.0, "tangent", "HNSW"))
    assert again.drop_gallery("reopen") and not engine.has_gallery("reopen")
    assert not again.drop_gallery("reopen")


def test_acknowledged_writes_survive_kill_9(tmp_path: Path, rows: dict) -> None:
    """The durability the engine relies on: an upsert acknowledged by milvus-lite is in its WAL
    before the call returns, so killing the process right after loses nothing."""
    uri = str(tmp_path / "crash.db")
    np.save(tmp_path / "vectors.npy", rows["gallery"][:300])
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        import numpy as np
        from app.vectors.milvus.layouts import GalleryLayout
        from app.vectors.milvus.engine import MilvusEngine
        vectors = np.load({str(tmp_path / "vectors.npy")!r})
        engine = MilvusEngine({uri!r})
        gallery = engine.create_gallery(GalleryLayout("crash", 384, 384, 1.0, "tangent", "HNSW"))
        points = vectors / np.linalg.norm(vectors, axis=1, keepdims=True) * np.linspace(0.5, 9, 300)[:, None]
        gallery.upsert([f"item-{{i}}" for i in range(300)], vectors, points)
        gallery.delete(["item-7"])
        print("acknowledged", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    assert "acknowledged" in done.stdout
    gallery = MilvusEngine(uri).open_gallery("crash")
    assert gallery.count() == 299
    assert "item-7" not in gallery.existing_ids(["item-7", "item-8"])
    np.testing.assert_array_equal(gallery.fetch(["item-299"]).vectors[0], rows["gallery"][299])


# -- read-only attach -------------------------------------------------------------------------
@pytest.fixture
def team_collection(
    request: pytest.FixtureRequest, tmp_path: Path, wordnet_small: dict
) -> Iterator[tuple[MilvusClient, str]]:
    """A collection as a team would have it: INT64 ids, its own field names, a COSINE index; in
    a milvus-lite file, or, parametrized ``server``, on the shared Milvus server (dropped after
    the test)."""
    if getattr(request, "param", "lite") == "lite":
        uri = str(tmp_path / "team.db")
        yield from _team_collection(MilvusClient(uri), uri, wordnet_small)
        return
    uri = request.getfixturevalue("milvus_server_uri")
    with dropped_after(uri) as client:
        yield from _team_collection(client, uri, wordnet_small)


def _team_collection(
    client: MilvusClient, uri: str, wordnet_small: dict
) -> Iterator[tuple[MilvusClient, str]]:
    schema = client.create_schema(auto_id=False)
    schema.add_field("doc_id", DataType.INT64, is_primary=True)
    schema.add_field("title", DataType.VARCHAR, max_length=256)
    schema.add_field("embedding", DataType.FLOAT_VECTOR, dim=384)
    index = client.prepare_index_params()
    # efConstruction given: a Milvus 2.3 server has no default for it (milvus-lite has).
    index.add_index(
        "embedding",
        index_type="HNSW",
        metric_type="COSINE",
        params={"M": 16, "efConstruction": 64},
    )
    client.create_collection("docs", schema=schema, index_params=index)
    old = wordnet_small[f"gloss.{OLD}"]
    client.insert(
        "docs",
        [
            {"doc_id": 1000 + i, "title": str(wordnet_small["label"][i]), "embedding": old[i]}
            for i in range(len(old))
        ],
    )
    yield client, uri


ON_BOTH_TEAMS = pytest.mark.parametrize("team_collection", ["lite", "server"], indirect=True)


def snapshot(client: MilvusClient) -> list[dict]:
    # Strong: the team's collection has a server's default consistency (Bounded), under which a
    # read right after the fixture's insert may not see it yet (milvus-lite always does).
    rows = client.query(
        "docs",
        filter="doc_id >= 0",
        output_fields=["doc_id", "title", "embedding"],
        consistency_level="Strong",
    )
    return sorted(
        (
            {"doc_id": r["doc_id"], "title": r["title"], "embedding": list(r["embedding"])}
            for r in rows
        ),
        key=lambda r: r["doc_id"],
    )


@ON_BOTH_TEAMS
def test_attached_collection_reads_and_searches_without_writing(
    team_collection: tuple[MilvusClient, str], wordnet_small: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, uri = team_collection
    before = snapshot(client)
    reader = AttachedCollection(uri, "docs", "doc_id", "embedding", "COSINE", client=client)
    assert reader.dim == 384 and reader.count() == 800

    ids, vectors = reader.fetch_vectors([1005, 999_999, 1001])
    assert ids == [1005, 1001]
    np.testing.assert_array_equal(vectors, wordnet_small[f"gloss.{OLD}"][[5, 1]])

    # A model transform: least squares from the new model's gloss rows to the old ones.
    new, old = wordnet_small[f"gloss.{NEW}"], wordnet_small[f"gloss.{OLD}"]
    weights = np.linalg.lstsq(new, old, rcond=None)[0]
    levels: list[object] = []
    search = client.search

    def recording_search(*args: object, **kwargs: object) -> object:
        levels.append(kwargs.get("consistency_level"))
        return search(*args, **kwargs)

    monkeypatch.setattr(client, "search", recording_search)
    hits, scores = reader.search(new[:20], 5, transform=lambda q: q @ weights)
    monkeypatch.undo()
    # Strong, as every read of an attached collection: on a server the owner's collection may
    # have Bounded consistency (the default), under which a search can miss the owner's last
    # writes (milvus-lite always sees them).
    assert levels == ["Strong"]
    direct = client.search(
        "docs",
        data=(new[:20] @ weights).astype(np.float32),
        limit=5,
        anns_field="embedding",
        output_fields=["doc_id"],
    )
    assert hits == [[h["doc_id"] for h in row] for row in direct]
    assert np.all(np.diff(scores, axis=1) <= 1e-6)  # COSINE: similarities, best first
    own = np.mean([1000 + q in row for q, row in enumerate(hits)])
    assert own >= 0.5, own  # the transformed query finds its own old item
    # Above a Milvus server's top-k cap the request is refused here, naming the cap, not sent.
    with pytest.raises(ValueError, match="16384"):
        reader.search(new[:1], milvus_search.MAX_TOPK + 1)

    for write in ("insert", "upsert", "delete", "create_index", "drop", "load", "flush"):
        assert not hasattr(reader, write)
    counted = client.query(
        "docs", filter="", output_fields=["count(*)"], consistency_level="Strong"
    )
    assert counted[0]["count(*)"] == 800
    assert snapshot(client) == before


@ON_BOTH_TEAMS
def test_attach_refuses_what_it_cannot_read_as_described(
    team_collection: tuple[MilvusClient, str],
) -> None:
    client, uri = team_collection
    with pytest.raises(AttachError, match="vector field"):
        AttachedCollection(uri, "docs", "doc_id", "title", "COSINE", client=client)
    with pytest.raises(AttachError, match="id field"):
        AttachedCollection(uri, "docs", "embedding", "embedding", "COSINE", client=client)
    with pytest.raises(AttachError, match="indexed for COSINE"):
        AttachedCollection(uri, "docs", "doc_id", "embedding", "L2", client=client)
    with pytest.raises(AttachError, match="does not exist"):
        AttachedCollection(uri, "nope", "doc_id", "embedding", "COSINE", client=client)
    client.release_collection("docs")
    with pytest.raises(AttachError, match="not loaded"):
        AttachedCollection(uri, "docs", "doc_id", "embedding", "COSINE", client=client)
    # Refusing did not load it either.
    assert str(client.get_load_state("docs")["state"]).endswith("NotLoad")


def external_gallery(gallery_id: str) -> Gallery:
    """An external cosine gallery of MiniLM vectors, lifted at radius 2, searched by HNSW."""
    return Gallery(
        id=gallery_id,
        dim=384,
        metric="cosine",
        lift_curv=1.0,
        lift_scale=2.0,
        bound_model_id=None,
        index_kind="hnsw",
    )


# -- behind the vector-storage interface -----------------------------------------------------
@ON_BOTH
def test_vector_storage_adapter_keeps_the_interface_contract(
    engine: MilvusEngine, rows: dict
) -> None:
    storage = MilvusVectorStorage(engine)
    # The same methods, with the same parameters, as the interface.
    for name, member in inspect.getmembers(VectorStorage, inspect.isfunction):
        if not name.startswith("_"):
            expected = list(inspect.signature(member).parameters)
            assert list(inspect.signature(getattr(storage, name)).parameters) == expected[1:]
    external = external_gallery("gal_external")
    bound, approximate = (
        Gallery(
            id=f"gal_bound_{kind}",
            dim=384,
            metric=None,
            lift_curv=1.0,
            lift_scale=None,
            bound_model_id="mdl_x",
            index_kind=kind,
        )
        for kind in ("flat", "hnsw")
    )
    assert (layout_of(external).layout, layout_of(external).index_type) == ("cosine", "HNSW")
    assert layout_of(external).lift_scale == 2.0 and layout_of(bound).lift_scale is None
    assert (layout_of(bound).layout, layout_of(bound).index_type) == ("lifted", "FLAT")
    assert (layout_of(approximate).layout, layout_of(approximate).index_type) == (
        "poincare",
        "HNSW",
    )

    vectors = rows["gallery"][:20]
    ids = item_ids(20)
    first = storage.upsert(None, external, ids, vectors, ids, [None] * 20)
    np.testing.assert_array_equal(first.ids, np.arange(20))
    assert first.inserted == 20 and len(first.replaced) == 0
    second = storage.upsert(None, external, [ids[3], "x"], vectors[:2], ["a", "b"], [None, None])
    np.testing.assert_array_equal(second.ids, [3, 20])
    np.testing.assert_array_equal(second.replaced, [3])
    assert second.inserted == 1
    assert storage.count(None, external) == 21
    assert storage.lookup(None, external, [ids[3], "zz"]) == {ids[3]: (3, "a")}
    assert storage.names(None, external, [20, 99]) == {20: ("x", "b")}
    fetched = storage.fetch(None, external, [ids[3]])
    np.testing.assert_array_equal(fetched.vectors, vectors[:1])
    np.testing.assert_array_equal(fetched.ids, [3])
    np.testing.assert_array_equal(storage.delete(None, external, [ids[5], ids[1], "zz"]), [1, 5])
    np.testing.assert_array_equal(storage.all_ids(None, external), sorted(set(range(21)) - {1, 5}))
    batches = list(storage.scan(None, external, batch=8))
    assert [len(b) for b in batches] == [8, 8, 3]
    # Searches see the lifted points: the stored vector, lifted, is its own nearest item.
    hits = storage.gallery(external).search(lifted(vectors[:1], 2.0), 1)
    assert hits.item_ids == [[ids[0]]]

    # A model-bound gallery stores space components at many radii, searched exactly.
    points = spread_points(rows["gallery"][:20], 5.0, rows["gallery"])
    storage.upsert(None, bound, ids, points, [None] * 20, [None] * 20)
    hits = storage.gallery(bound).search(points[7:8].astype(np.float64), 1)
    assert hits.item_ids == [[ids[7]]] and hits.distances[0, 0] < 1e-3

    storage.drop("gal_external")
    assert not engine.has_gallery(collection_name("gal_external"))


def test_an_upload_looks_its_ids_up_once_per_write_batch(
    engine: MilvusEngine, rows: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every lookup is a Strong-consistency query, which on a server waits for a time tick
    (issue 46's ingest at 0.20 x pymilvus): an upload through the storage adapter asks once per
    write batch of ids, not once in the adapter and again in the engine, and the second write
    still keeps the internal ids the first gave."""
    storage = MilvusVectorStorage(engine)
    gallery = external_gallery("gal_lookups")
    n = len(rows["gallery"])
    lookups: list[int] = []
    query = type(engine.client).query

    def counted(client, name, *args, **kwargs):
        if kwargs.get("filter", "").startswith("item_id in"):
            lookups.append(kwargs["filter"].count(","))
        return query(client, name, *args, **kwargs)

    monkeypatch.setattr(type(engine.client), "query", counted)
    # One lookup query covers a write batch's ids; smaller batches so the fixture spans several.
    assert engine_module.ID_BATCH >= engine_module.WRITE_BATCH
    monkeypatch.setattr(engine_module, "WRITE_BATCH", 500)
    monkeypatch.setattr(engine_module, "ID_BATCH", 500)
    ids = item_ids(n)
    first = storage.upsert(None, gallery, ids, rows["gallery"], [None] * n, [None] * n)
    batches = -(-n // engine_module.WRITE_BATCH)
    assert len(lookups) == batches and first.inserted == n
    lookups.clear()
    again = storage.upsert(None, gallery, ids[::-1], rows["gallery"][::-1], [None] * n, [None] * n)
    assert len(lookups) == batches and again.inserted == 0
    np.testing.assert_array_equal(again.ids, first.ids[::-1])
    storage.drop(gallery.id)


@pytest.mark.parametrize(
    ("layout", "lift_scale"), [("tangent", None), ("poincare", None), ("cosine", 3.0)]
)
def test_a_top_k_above_the_engines_cap_is_answered_by_an_exact_scan(
    engine: MilvusEngine,
    rows: dict,
    monkeypatch: pytest.MonkeyPatch,
    layout: str,
    lift_scale: float | None,
) -> None:
    """A Milvus server refuses a search limit above its top-k cap (16,384 by default; milvus-lite
    has none), which partial backfill's mixed search can exceed on a gallery with many
    re-embedded items: such a search scans the collection exactly instead, and no request asks
    for more than the cap (here lowered to 64 so that the fixture crosses it)."""
    name = f"topk_cap_{layout}"
    gallery = engine.create_gallery(
        GalleryLayout(name, 384, 384, 1.0, layout, "HNSW", lift_scale=lift_scale)
    )
    points = (
        lifted(rows["gallery"], 3.0)
        if lift_scale
        else spread_points(rows["gallery"], 3.0, rows["gallery"])
    )
    gallery.upsert(item_ids(len(points)), rows["gallery"], None if lift_scale else points)
    gallery.seal()
    queries = points[[3, 400, 1500]].astype(np.float64)
    limits: list[int] = []
    search = gallery.client.search

    def recording_search(*args: object, **kwargs: object) -> object:
        limits.append(int(kwargs["limit"]))
        return search(*args, **kwargs)

    monkeypatch.setattr(gallery.client, "search", recording_search)
    monkeypatch.setattr(milvus_search, "MAX_TOPK", 64)
    hits = gallery.search(queries, 300)
    assert all(limit <= 64 for limit in limits), limits
    _, true_dist = exact_top_k(queries, points, 300, 1.0)
    np.testing.assert_allclose(hits.distances, true_dist, rtol=1e-5, atol=1e-6)
    # The ids name the points at those distances (recomputed from the stored points).
    positions = np.array([[int(i.rsplit("-", 1)[1]) for i in row] for row in hits.item_ids])
    recomputed = exact_distances(queries[:, None, :], points[positions], 1.0)
    np.testing.assert_allclose(recomputed, true_dist, rtol=1e-5, atol=1e-6)
    assert hits.item_ids[0][0] == "item-3"
    assert hits.row_ids.shape == (3, 300) and (hits.row_ids >= 0).all()
    np.testing.assert_allclose(hits.points[:, 0], points[[3, 400, 1500]], rtol=1e-5, atol=1e-6)
    # Below the cap the index answers, its over-fetch clamped to the cap.
    limits.clear()
    small = gallery.search(queries, 10, overfetch=500)
    assert limits and all(limit <= 64 for limit in limits), limits
    assert small.item_ids[0][0] == "item-3"


@pytest.mark.parametrize(
    ("engine", "layout", "index_type"),
    [
        ("lite", "tangent", "HNSW"),
        ("lite", "poincare", "HNSW"),
        ("lite", "lifted", "FLAT"),
        ("server", "poincare", "HNSW"),
    ],
    indirect=["engine"],
)
def test_every_vector_field_is_indexed(engine: MilvusEngine, layout: str, index_type: str) -> None:
    """A Milvus server loads only collections whose every vector field has an index (milvus-lite
    does not check): beside its search row, each layout indexes the stored vector (FLAT). A
    server with one vector field per collection (Milvus 2.3) keeps the stored vector in a float
    array instead, which needs no index; its rows read back exactly all the same."""
    name = f"indexed_{layout}"
    gallery = engine.create_gallery(GalleryLayout(name, 8, 8, 1.0, layout, index_type))
    indexed = {
        engine.client.describe_index(name, i)["field_name"]
        for i in engine.client.list_indexes(name)
    }
    fields = {f["name"]: f["type"] for f in engine.client.describe_collection(name)["fields"]}
    vector_fields = {name for name, kind in fields.items() if kind == DataType.FLOAT_VECTOR}
    assert indexed == vector_fields, (indexed, fields)
    if engine.multi_vector():
        assert vector_fields == {"vector", "search"}
    else:
        assert fields["vector"] == DataType.ARRAY and gallery.form.vector_array
    vectors = np.random.default_rng(1).normal(size=(5, 8)).astype(np.float32) / 4
    gallery.upsert(item_ids(5), vectors, vectors)
    np.testing.assert_array_equal(gallery.fetch(item_ids(5)).vectors, vectors)
    engine.drop_gallery(name)


def test_drop_finishes_when_milvus_lite_loses_a_file_under_it(
    engine: MilvusEngine, rows: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """milvus-lite 3.2 deletes a dropped collection's directory while its own background index
    work may still remove files there; the delete then fails on a file already gone (seen on a
    1M-row collection). The drop is retried, and the collection is gone afterwards."""
    from pymilvus.exceptions import MilvusException

    layout = GalleryLayout("dropped_while_busy", 384, 384, 1.0, "poincare")
    gallery = engine.create_gallery(layout)
    gallery.upsert(["a", "b"], rows["gallery"][:2], rows["gallery"][:2])
    real_drop = engine.client.drop_collection
    calls: list[str] = []

    def racing_drop(name: str, **kwargs: object) -> None:
        calls.append(name)
        if len(calls) == 1:
            real_drop(name, **kwargs)  # drops, then reports the race as milvus-lite did
            raise MilvusException(
                1, "[Errno 2] No such file or directory: 'data_1_2.vector.hnsw.idx'"
            )
        real_drop(name, **kwargs)

    monkeypatch.setattr(engine.client, "drop_collection", racing_drop)
    assert engine.drop_gallery("dropped_while_busy")
    assert len(calls) == 2 and not engine.has_gallery("dropped_while_busy")
    # Any other failure is not swallowed.
    engine.create_gallery(layout)

    def failing_drop(name: str, **kwargs: object) -> None:
        raise MilvusException(1, "permission denied")

    monkeypatch.setattr(engine.client, "drop_collection", failing_drop)
    with pytest.raises(MilvusException, match="permission denied"):
        engine.drop_gallery("dropped_while_busy")
