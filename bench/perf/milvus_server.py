"""The Milvus parts of ``bench.perf`` on a real Milvus server (issue 46 item 4), one stage a run.

    python -m bench.perf.milvus_server engines --rows 1000000    # bench/results/milvus_server_engines.json
    python -m bench.perf.milvus_server api-memory                # …_api_memory.json (100k … 1M rows)
    python -m bench.perf.milvus_server attach --points 1000000   # …_attach.json
    python -m bench.perf.milvus_server bridged                   # …_bridged.json (24k synsets)
    python -m bench.perf.milvus_server STAGE --quick             # a few thousand rows, no section
    python -m bench.perf.milvus_server STAGE --uri http://127.0.0.1:19530   # a running server

Each stage starts the Milvus 2.3.5 standalone server of PyPI's ``milvus`` package
(``bench.common.milvus_standalone``) in a temporary folder, at the server's default settings
(its 200 ms time tick: what a user's server runs; ``--server-config KEY=VALUE`` sets others, as
the tests' 20 ms tick), runs an existing benchmark's Milvus part against it, and stops it. With
``--uri`` it uses that server instead and drops the collections it made.

- ``engines``: ``bench.perf.engines``'s Milvus run (``milvus_run``: raw pymilvus, then the engine's
  cosine and poincare galleries) with the server's URI instead of a milvus-lite file, and on each
  cosine gallery the ordered top-10 of ``--equal-queries`` more queries (old→old: the stored
  vectors searched) against float64 brute force.
- ``api-memory``: ``bench.perf.api_memory``'s Milvus run (the API as a uvicorn process, the
  gallery filled through HTTP), the server's process tree measured beside it. The FAISS slope it
  is judged against is ``bench/results/api_memory.json``'s (``bench.perf.api_memory``).
- ``attach``: ``bench.perf.milvus_attach``'s scale run (``qdrant_attach.scale_run``) with the
  collection on the server.
- ``bridged``: the WordNet nouns' MiniLM glosses as an external cosine gallery in two services in
  process (``create_app`` + ``TestClient``, SQLite, inline jobs), one on the FAISS engine, one on
  the Milvus engine with the server; the same procrustes upgrade on a seeded ``--train-share`` of
  the synsets in each; then the held-out synsets' lemmas searched in both, bridged (MPNet
  ``features`` + the model) and old→old (MiniLM ``vectors``): R@10 (the query's own gloss in
  the top 10) per engine, paired by query. The service never seals a Milvus gallery after an
  upload; before searching, this stage seals it (``MilvusGallery.seal``) and waits as
  ``engines`` does (``served``, then ``SETTLE_S``), so the figures are the sealed index's.

The sections and their targets: ``bench.perf.milvus_server_report``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from fastapi.testclient import TestClient
from pymilvus import MilvusClient

from app.main import create_app
from app.ml.geometry.space import EuclideanLift
from app.vectors.lorentz_rows import exact_distances
from app.vectors.milvus.engine import MilvusGallery
from app.vectors.milvus.layouts import DEFAULT_HNSW
from app.vectors.milvus.search import COSINE_MARGIN, MAX_TOPK, SearchHits, search_defaults
from app.vectors.milvus.storage import collection_name, engine_for
from app.vectors.rerank import exact_top_k
from bench.common.machine import load_average, run_record
from bench.common.milvus_standalone import standalone_process
from bench.common.report import command_line, publish
from bench.common.service import BENCH_KEY
from bench.common.tiled import lift_points
from bench.common.wordnet import NEW_MODEL, OLD_MODEL, REPO_ROOT, quick_data_dir
from bench.perf import api_memory, engines, milvus_attach
from bench.perf.backfill_plan import wordnet_arrays
from bench.perf.engine_workload import QUERIES, Data, K
from bench.perf.milvus_server_report import (
    BRIDGED_MARGIN,
    EQUAL_TARGET,
    MEMORY_FRACTION,
    SECTIONS,
    SPEED_TARGET,
    render_api_memory,
    render_attach,
    render_bridged,
    render_engines,
)
from bench.perf.mixed_search import _ok, _part
from bench.perf.qdrant_attach import scale_run, service_settings, top_ids

RESULTS = REPO_ROOT / "bench/results"
FILES = {
    "engines": "milvus_server_engines.json",
    "api-memory": "milvus_server_api_memory.json",
    "attach": "milvus_server_attach.json",
    "bridged": "milvus_server_bridged.json",
}
# The FAISS engine's growth the API-memory target is a fraction of (``bench.perf.api_memory``).
FAISS_MEMORY = RESULTS / "api_memory.json"
EQUAL_QUERIES = 4096
API_SIZES = (100_000, 200_000, 400_000, 600_000, 800_000, 1_000_000)
QUICK_ROWS = 3_000
QUICK_EQUAL_QUERIES = 256
# Four sizes: three after the warm-up, the fewest a slope's standard error needs.
QUICK_SIZES = (1_000, 2_000, 3_000, 4_000)
# bridged: the synsets a quick run keeps (the tests pass the 800-synset fixture: all of them).
QUICK_SYNSETS = 1_000
TRAIN_SHARE = 0.6
MILVUS_INDEXES = ("flat", "hnsw")
# Truth in blocks of queries: ``exact_top_k`` holds queries × LIFT_BLOCK float64 scores.
TRUTH_QUERIES = 256


@dataclass
class Server:
    """The server a stage runs against: its URI and version (``get_server_version``), the
    launcher's process when this run started it (None with ``--uri``), its extra settings."""

    uri: str
    version: str
    process: Any
    config: tuple[str, ...]

    def record(self) -> dict[str, Any]:
        started = self.process is not None
        return {"version": self.version, "started_here": started, "config": list(self.config)}

    def mib(self) -> float | None:
        """Resident memory of the server's process tree (None where it runs elsewhere)."""
        return None if self.process is None else api_memory.tree_rss_mib(self.process.pid)


@contextmanager
def server(uri: str | None, config: Sequence[str]) -> Iterator[Server]:
    """A Milvus standalone started in a temporary folder, or the one at ``uri`` (the
    collections made meanwhile dropped after, as the tests' ``dropped_after`` does)."""
    if uri is None:
        folder = Path(tempfile.mkdtemp(prefix="bench-milvus-standalone-"))
        try:
            with standalone_process(folder, config=config) as (started, version, process):
                yield Server(started, version, process, tuple(config))
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return
    client = MilvusClient(uri=uri)
    before = set(client.list_collections())
    try:
        yield Server(uri, str(client.get_server_version()), None, tuple(config))
    finally:
        for name in set(client.list_collections()) - before:
            client.drop_collection(name)
        client.close()


# -- engines --------------------------------------------------------------------------------------
def equality_queries(data: Data, n: int, seed: int) -> np.ndarray:
    """``n`` more queries made as ``Data``'s (gallery rows plus fresh noise), from their own
    stream, so that the speed and recall queries stay those of ``bench.perf.engines``."""
    rng = np.random.default_rng(seed + 2)
    picks = rng.integers(0, len(data.vectors), n)
    noise = 0.05 * rng.standard_normal((n, data.vectors.shape[1]))
    return (data.vectors[picks] + noise).astype(np.float32)


def ordered_equal(hits: SearchHits, points: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """Per query, whether the search's top-k is the brute-force float64 top-k in order. A place
    holds the true item, or another at the true item's exact distance (a tie, with the
    tolerance of ``recall_within``): the hits' distances are recomputed from the stored points."""
    equal = np.empty(len(queries), dtype=bool)
    for start in range(0, len(queries), TRUTH_QUERIES):
        part = slice(start, start + TRUTH_QUERIES)
        true_pos, true_dist = exact_top_k(queries[part], points, K, 1.0)
        found = np.array([[int(i) if i else -1 for i in row] for row in hits.item_ids[part]])
        dist = exact_distances(queries[part, None, :], points[np.maximum(found, 0)], 1.0)
        dist = np.where(found >= 0, dist, np.inf)
        tolerance = 1e-9 * np.maximum(true_dist, 1.0)
        same = (found == true_pos) | (np.abs(dist - true_dist) <= tolerance)
        equal[part] = same.all(axis=1)
    return equal


def equality(gallery: MilvusGallery, radius: float, raw_queries: np.ndarray, points: np.ndarray):
    """The ordered top-10 equality of a cosine gallery on ``raw_queries`` (lifted as
    ``Data.cosine`` lifts its queries)."""
    lift = EuclideanLift(curv=1.0, scale=radius, metric="cosine")
    queries = lift_points(raw_queries, lift).astype(np.float64)
    tic = time.perf_counter()
    hits = gallery.search(queries, K)
    search_s = time.perf_counter() - tic
    tic = time.perf_counter()
    equal = ordered_equal(hits, points, queries)
    return {
        "queries": len(queries),
        "equal": int(equal.sum()),
        "search_s": search_s,
        "truth_s": time.perf_counter() - tic,
    }


def run_engines(args: argparse.Namespace, at: Server) -> dict[str, Any]:
    rows = QUICK_ROWS if args.quick else args.rows
    n_equal = QUICK_EQUAL_QUERIES if args.quick else args.equal_queries
    torch.set_num_threads(1)
    data = Data(rows, args.seed)
    extra_queries = equality_queries(data, n_equal, args.seed)

    def extra(gallery: MilvusGallery, layout: str, radius: float, points: np.ndarray):
        out: dict[str, Any] = {"server_mib": at.mib()}
        if layout == "cosine":
            out["equal_top_10"] = equality(gallery, radius, extra_queries, points)
            print(f"  ordered top-10 equality: {out['equal_top_10']}", flush=True)
        return out

    store = Path(tempfile.mkdtemp(prefix="bench-milvus-server-engines-"))
    try:
        spread = None if args.cosine_only else args.layout
        measured = engines.milvus_run(data, args.radii, store, spread, at.uri, extra)
    finally:
        shutil.rmtree(store, ignore_errors=True)
    overfetch, factor = search_defaults(args.layout)
    return {
        "rows": rows,
        "queries": QUERIES,
        "k": K,
        "spread_layout": args.layout,
        "cosine_only": bool(args.cosine_only),
        "overfetch": overfetch,
        "ef_factor": factor,
        "hnsw": DEFAULT_HNSW,
        "settle_s": engines.SETTLE_S,
        "milvus": measured,
    }


# -- API memory -----------------------------------------------------------------------------------
def run_api_memory(args: argparse.Namespace, at: Server) -> dict[str, Any]:
    sizes = sorted(QUICK_SIZES if args.quick else args.sizes)
    batch = min(args.batch, 1_000) if args.quick else args.batch
    vectors, queries = api_memory.workload(sizes, args.seed)

    @contextmanager
    def running(_folder: Path) -> Iterator[tuple[str, Any]]:
        yield at.uri, at.process  # started once for the stage: ``server``

    run = api_memory.engine_run("milvus", vectors, queries, sizes, batch, running)
    return {"dim": int(vectors.shape[1]), "batch": batch, "sizes": sizes, "milvus": run}


# -- attach ---------------------------------------------------------------------------------------
def run_attach(
    args: argparse.Namespace, at: Server, arrays: dict[str, np.ndarray] | None
) -> dict[str, Any]:
    points = QUICK_ROWS if args.quick else args.points
    arrays = arrays if arrays is not None else wordnet_arrays()
    workdir = Path(tempfile.mkdtemp(prefix="bench-milvus-server-attach-"))
    try:
        settings = service_settings(workdir).model_copy(update={"milvus_allowed_urls": [at.uri]})
        root = settings.resolved_milvus_attach_root / settings.local_tenant
        source = {**milvus_attach.SOURCE, "uri": at.uri}
        before = at.mib()

        def fill(vectors: np.ndarray) -> float:
            return milvus_attach.fill_store(at.uri, vectors)

        counter = milvus_attach.RowCounter
        run = scale_run(arrays, points, args.seed, settings, root, fill, source, counter)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    run["server_mib"] = {"before": before, "after": at.mib()}
    return {"run": run}


# -- bridged --------------------------------------------------------------------------------------
@contextmanager
def service(workdir: Path, engine: str, uri: str) -> Iterator[TestClient]:
    """The service in process on the FAISS engine, or on the Milvus engine with the server."""
    settings = service_settings(workdir)
    if engine == "milvus":
        settings = settings.model_copy(update={"vector_engine": "milvus", "milvus_uri": uri})
    with TestClient(create_app(settings), raise_server_exceptions=True) as client:
        client.headers["Authorization"] = f"Bearer {BENCH_KEY}"
        yield client


def upload(client: TestClient, index: str, ids: np.ndarray, old: np.ndarray) -> str:
    """An external cosine gallery of ``old`` under ``ids`` (multipart ``.npy`` chunks); its id."""
    body = {"name": f"nouns-{index}", "dim": old.shape[1], "model_name": OLD_MODEL}
    gallery = _ok(
        client.post("/v1/galleries", json=body | {"metric": "cosine", "index": index}), 201
    )
    chunk = client.app.state.service.settings.max_vectors_per_request
    for start in range(0, len(ids), chunk):
        part = slice(start, start + chunk)
        files = {"ids": _part(ids[part]), "vectors": _part(old[part])}
        _ok(client.post(f"/v1/galleries/{gallery['id']}/vectors", files=files))
    return gallery["id"]


def serve_sealed(client: TestClient, gallery_id: str, rows: int) -> float:
    """A Milvus gallery sealed (flush, its index built: ``MilvusGallery.seal``; the service does
    not seal after an upload), then the waits of ``bench.perf.engines``: until the query node
    serves the sealed segments (``served``), then ``SETTLE_S`` untimed. Seconds to served."""
    gallery = engine_for(client.app.state.service.settings).open_gallery(
        collection_name(gallery_id)
    )
    tic = time.perf_counter()
    gallery.seal()
    engines.served(gallery.client, gallery.name, rows)
    ready = time.perf_counter() - tic
    time.sleep(engines.SETTLE_S)
    return ready


def procrustes(client: TestClient, gallery_id: str, ids: np.ndarray, new: np.ndarray, seed: int):
    """A dataset pairing the gallery's items ``ids`` with their ``new`` rows, and a procrustes
    upgrade on it (inline: done when the POST answers); the model's id."""
    dataset = _ok(
        client.post("/v1/datasets", json={"name": f"mpnet-{gallery_id}", "gallery_id": gallery_id}),
        201,
    )
    chunk = client.app.state.service.settings.max_vectors_per_request
    for start in range(0, len(ids), chunk):
        part = slice(start, start + chunk)
        files = {"ids": _part(ids[part]), "features": _part(new[part])}
        _ok(client.post(f"/v1/datasets/{dataset['id']}/items", files=files))
    body = {"dataset_id": dataset["id"], "method": "procrustes", "seed": seed}
    created = _ok(client.post("/v1/upgrades", json=body), 202)
    job = _ok(client.get(f"/v1/upgrades/{created['id']}"))
    if job["status"] != "succeeded":
        raise RuntimeError(f"upgrade {job['status']}: {job.get('error')}")
    return job["model_id"]


def own_hits(top: list[list[str]], own: np.ndarray) -> np.ndarray:
    """Per query, whether its own synset's gloss (item id ``own[q]``) is among its hits."""
    return np.array([str(o) in row for row, o in zip(top, own, strict=True)])


def paired(top: list[list[str]], ref: list[list[str]], own: np.ndarray) -> dict[str, int]:
    """One gallery's hits against the reference's (FAISS), query by query: hits, the queries
    only one of them finds (the paired difference's discordant pairs), identical ordered top-k."""
    hits, ref_hits = own_hits(top, own), own_hits(ref, own)
    return {
        "hits": int(hits.sum()),
        "only_here": int((hits & ~ref_hits).sum()),
        "only_faiss": int((ref_hits & ~hits).sum()),
        "identical": int(sum(a == b for a, b in zip(top, ref, strict=True))),
    }


def run_bridged(
    args: argparse.Namespace, at: Server, arrays: dict[str, np.ndarray] | None
) -> dict[str, Any]:
    arrays = arrays if arrays is not None else wordnet_arrays()
    keep = QUICK_SYNSETS if args.quick else None
    old, new = arrays[f"gloss.{OLD_MODEL}"][:keep], arrays[f"gloss.{NEW_MODEL}"][:keep]
    synsets = len(old)
    ids = np.array([str(i) for i in range(synsets)])
    order = np.random.default_rng(args.seed).permutation(synsets)
    trained = round(args.train_share * synsets)
    train, held = np.sort(order[:trained]), np.sort(order[trained:])
    queries = {
        "bridged": {"features": arrays[f"lemma.{NEW_MODEL}"][held]},
        "old": {"vectors": arrays[f"lemma.{OLD_MODEL}"][held]},
    }
    galleries: dict[str, dict[str, Any]] = {}
    tops: dict[str, dict[str, list[list[str]]]] = {kind: {} for kind in queries}
    workdir = Path(tempfile.mkdtemp(prefix="bench-milvus-server-bridged-"))
    try:
        for engine, indexes in (("faiss", ("flat",)), ("milvus", tuple(args.milvus_index))):
            with service(workdir / engine, engine, at.uri) as client:
                for index in indexes:
                    name, entry = f"{engine}_{index}", {"engine": engine, "index": index}
                    tic = time.perf_counter()
                    gallery_id = upload(client, index, ids, old)
                    entry["upload_s"] = time.perf_counter() - tic
                    if engine == "milvus":
                        entry["ready_s"] = serve_sealed(client, gallery_id, synsets)
                    tic = time.perf_counter()
                    model_id = procrustes(client, gallery_id, ids[train], new[train], args.seed)
                    entry["upgrade_s"] = time.perf_counter() - tic
                    entry["search_s"] = {}
                    for kind, body in queries.items():
                        body = body | ({"model_id": model_id} if kind == "bridged" else {})
                        tic = time.perf_counter()
                        tops[kind][name] = top_ids(client, gallery_id, body, len(held))
                        entry["search_s"][kind] = time.perf_counter() - tic
                    entry["server_mib"] = at.mib() if engine == "milvus" else None
                    galleries[name] = entry
                    print(f"  {name}: {entry}", flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    ref = "faiss_flat"
    searches = {
        kind: {name: paired(top, found[ref], held) for name, top in found.items()}
        for kind, found in tops.items()
    }
    # The engine's search of a cosine gallery (``app.vectors.milvus.search.search``): its top
    # ``candidates`` re-ranked in float64, an HNSW walked at ef = k′ (factor 1 on this layout).
    overfetch, _ = search_defaults("cosine")
    fetched = min(max(K, overfetch), MAX_TOPK)
    candidates = min(fetched, K + COSINE_MARGIN)
    return {
        "synsets": synsets,
        "trained": trained,
        "train_share": args.train_share,
        "queries": len(held),
        "k": K,
        "reference": ref,
        "candidates": candidates,
        "ef": max(fetched, candidates),
        "hnsw": DEFAULT_HNSW,
        "settle_s": engines.SETTLE_S,
        "galleries": galleries,
        "searches": searches,
    }


# -- command line ---------------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    stages = parser.add_subparsers(dest="stage", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--quick", action="store_true", help="a few thousand rows, no section")
    common.add_argument("--seed", type=int, default=0)
    common.add_argument("--out", type=Path, default=None)
    common.add_argument("--no-markdown", action="store_true")
    common.add_argument("--uri", default=None, help="a running Milvus server instead of one")
    common.add_argument(
        "--server-config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a milvus.yaml setting of the server started here (default: none)",
    )
    engines_stage = stages.add_parser("engines", parents=[common])
    engines_stage.add_argument("--rows", type=int, default=1_000_000)
    engines_stage.add_argument("--radii", type=float, nargs="+", default=[1.0])
    engines_stage.add_argument("--layout", choices=("poincare", "tangent"), default="poincare")
    engines_stage.add_argument(
        "--cosine-only",
        action="store_true",
        help="the cosine galleries only (old→old: the issue's targets); no spread layout",
    )
    engines_stage.add_argument("--equal-queries", type=int, default=EQUAL_QUERIES)
    memory_stage = stages.add_parser("api-memory", parents=[common])
    memory_stage.add_argument("--sizes", type=int, nargs="+", default=list(API_SIZES))
    memory_stage.add_argument("--batch", type=int, default=5_000, help="rows per upload")
    attach_stage = stages.add_parser("attach", parents=[common])
    attach_stage.add_argument("--points", type=int, default=1_000_000)
    bridged_stage = stages.add_parser("bridged", parents=[common])
    bridged_stage.add_argument(
        "--train-share", type=float, default=TRAIN_SHARE, help="synsets paired for the upgrade"
    )
    bridged_stage.add_argument(
        "--milvus-index",
        nargs="+",
        choices=MILVUS_INDEXES,
        default=list(MILVUS_INDEXES),
        help="the Milvus galleries' index (flat: the service's default; FAISS stays flat)",
    )
    return parser


def main(
    argv: Sequence[str] | None = None, arrays: dict[str, np.ndarray] | None = None
) -> dict[str, Any]:
    """``arrays``: the attach and bridged stages' gloss/lemma rows by both models (default: the
    WordNet-noun data); the tests pass the small fixture's."""
    args = parser().parse_args(argv)
    if args.stage == "api-memory" and not args.quick and len(args.sizes) < 4:
        parser().error("--sizes: at least four (a warm-up, then three for the slope's interval)")
    if args.quick:
        quick_data_dir(f"bench.perf.milvus_server {args.stage}")
    if args.uri is not None and args.server_config:
        parser().error("--server-config sets the server started here: not with --uri")
    load_start = load_average()
    tic = time.perf_counter()
    with server(args.uri, args.server_config) as at:
        print(f"Milvus {at.version} at {at.uri}", flush=True)
        if args.stage == "engines":
            measured = run_engines(args, at)
        elif args.stage == "api-memory":
            measured = run_api_memory(args, at)
        elif args.stage == "attach":
            measured = run_attach(args, at, arrays)
        else:
            measured = run_bridged(args, at, arrays)
    result = {
        **run_record(command_line("bench.perf.milvus_server", argv), tic, load_start),
        "server": at.record(),
        "targets": {
            "equal_top_10": EQUAL_TARGET,
            "speed_ratio": SPEED_TARGET,
            "memory_fraction": MEMORY_FRACTION,
            "bridged_r10_within": BRIDGED_MARGIN,
        },
        **measured,
    }
    name = FILES[args.stage]
    out = args.out or RESULTS / (name.replace(".json", "_quick.json") if args.quick else name)
    section, title = SECTIONS[args.stage]
    if args.stage == "engines":
        markdown = render_engines(result)
    elif args.stage == "api-memory":
        markdown = render_api_memory(result, json.loads(FAISS_MEMORY.read_text()))
    elif args.stage == "attach":
        markdown = render_attach(result)
    else:
        markdown = render_bridged(result)
    publish(result, out, markdown, None if args.no_markdown or args.quick else section, title)
    return result


if __name__ == "__main__":
    main()
