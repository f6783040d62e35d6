"""Ingest speed: vectors/s through `.npy` and JSON uploads against raw `faiss.add`.

    python -m bench.perf.ingest            # 200k rows in batches of 10k: bench/results/ingest.json
                                      # and the bench.perf.ingest section of BENCHMARKS.md
    python -m bench.perf.ingest --quick    # 20k rows in batches of 5k
    python -m bench.perf.ingest --vector-storage sql --no-markdown   # the server storing SQL rows

Rows: the WordNet-noun MiniLM rows tiled with small noise (``bench.common.tiled``; real-data-derived),
uploaded to one cosine gallery in equal batches, each with string ids. Paths, each from empty:
- ``faiss_add``: ``IndexIDMap2(IndexFlatIP).add_with_ids`` of the lifted rows (no durability);
- ``faiss_add_durable``: the same plus, after every batch, ``faiss.write_index`` to a temp file,
  fsync and rename (what FAISS alone needs for an acknowledged batch to survive a crash);
- ``library``: ``IndexStore.apply`` (lift, append, write the index file atomically, fsync);
- ``http_npy`` / ``http_json``: POST /v1/galleries/{id}/vectors on a uvicorn server (multipart
  `.npy` parts, or a JSON body): validation, the batch appended to the gallery's segment file
  and fsync'd, its manifest committed in one database transaction (SQLite, WAL,
  synchronous=FULL: fsync on commit; ``--vector-storage sql``: one row per vector instead), then
  the index in memory; the server writes its index file in the background
  (``INDEX_FLUSH_INTERVAL_S``), not once per batch as ``library`` does.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from app.ml.geometry.space import EuclideanLift
from app.vectors.faiss.index_store import IndexSpec, IndexStore
from app.vectors.lorentz_rows import lifted_gallery
from bench.common.machine import facts_markdown, load_average, run_record
from bench.common.report import command_line, publish
from bench.common.service import create_gallery, npy_bytes, start_service
from bench.common.tiled import lift_points, tiled, wordnet_rows
from bench.common.wordnet import REPO_ROOT, quick_data_dir

RESULTS = REPO_ROOT / "bench/results"
SECTION = "bench.perf.ingest"
LIFT = EuclideanLift(curv=1.0, scale=1.0, metric="cosine")
PATHS = ("faiss_add", "faiss_add_durable", "library", "http_npy", "http_json")


def run_batches(n_batches: int, ingest: Callable[[int], object]) -> list[float]:
    times = []
    for b in range(n_batches):
        tic = time.perf_counter()
        ingest(b)
        times.append(time.perf_counter() - tic)
    return times


def faiss_paths(lifted: np.ndarray, batch: int, workdir: Path) -> dict[str, list[float]]:
    n_batches = len(lifted) // batch
    out = {}
    for durable in (False, True):
        index = faiss.IndexIDMap2(faiss.IndexFlatIP(lifted.shape[1]))
        path = workdir / "raw.faiss"

        def add(b: int, index=index, durable=durable, path=path) -> None:
            rows = slice(b * batch, (b + 1) * batch)
            index.add_with_ids(lifted[rows], np.arange(rows.start, rows.stop, dtype=np.int64))
            if durable:
                tmp = path.with_suffix(".tmp")
                faiss.write_index(index, str(tmp))
                with open(tmp, "rb+") as fh:
                    os.fsync(fh.fileno())
                os.replace(tmp, path)

        out["faiss_add_durable" if durable else "faiss_add"] = run_batches(n_batches, add)
    return out


def library_path(points: np.ndarray, batch: int, workdir: Path) -> list[float]:
    store = IndexStore(workdir / "indexes")
    n_batches = len(points) // batch

    def load() -> tuple[np.ndarray, np.ndarray]:
        return np.empty(0, dtype=np.int64), np.empty((0, points.shape[1]), dtype=np.float32)

    store.get(IndexSpec("gal_bench", 0, points.shape[1], 1.0, "flat", {}), load)

    def add(b: int) -> None:
        rows = slice(b * batch, (b + 1) * batch)
        spec = IndexSpec("gal_bench", b + 1, points.shape[1], 1.0, "flat", {})
        store.apply(
            spec,
            b,
            load,
            upsert_ids=np.arange(rows.start, rows.stop, dtype=np.int64),
            upsert_points=points[rows],
        )

    return run_batches(n_batches, add)


def http_paths(
    vectors: np.ndarray, batch: int, workdir: Path, vector_storage: str
) -> dict[str, list[float]]:
    # JSON text of 10k float32 rows exceeds the default 64 MiB body limit; the benchmark
    # raises it so both formats upload the same batches.
    service = start_service(
        workdir / "service",
        {
            "NOBACKFILL_MAX_REQUEST_BYTES": str(512 * 2**20),
            "NOBACKFILL_VECTOR_STORAGE": vector_storage,
        },
    )
    n_batches = len(vectors) // batch
    out = {}
    try:
        with service.client() as client:
            for fmt in ("http_npy", "http_json"):
                gallery_id = create_gallery(
                    service,
                    {
                        "name": fmt,
                        "dim": vectors.shape[1],
                        "model_name": "all-MiniLM-L6-v2",
                        "metric": "cosine",
                    },
                )
                url = f"/v1/galleries/{gallery_id}/vectors"

                def upload(b: int, fmt: str = fmt, url: str = url) -> None:
                    rows = slice(b * batch, (b + 1) * batch)
                    ids = [f"w{i}" for i in range(rows.start, rows.stop)]
                    if fmt == "http_npy":
                        files = {
                            "ids": (
                                "ids.npy",
                                npy_bytes(np.array(ids)),
                                "application/octet-stream",
                            ),
                            "vectors": (
                                "v.npy",
                                npy_bytes(vectors[rows]),
                                "application/octet-stream",
                            ),
                        }
                        response = client.post(url, files=files)
                    else:
                        body = json.dumps({"ids": ids, "vectors": vectors[rows].tolist()})
                        response = client.post(
                            url, content=body, headers={"Content-Type": "application/json"}
                        )
                    response.raise_for_status()

                out[fmt] = run_batches(n_batches, upload)
    finally:
        service.stop()
    return out


def summarise(times: list[float], batch: int) -> dict[str, Any]:
    quarter = max(1, len(times) // 4)
    return {
        "vectors_per_s": batch * len(times) / sum(times),
        "first_quarter_ms_per_batch": float(np.mean(times[:quarter]) * 1e3),
        "last_quarter_ms_per_batch": float(np.mean(times[-quarter:]) * 1e3),
        "batch_ms": [t * 1e3 for t in times],
    }


def render_markdown(result: dict[str, Any]) -> str:
    raw = result["paths"]["faiss_add"]["vectors_per_s"]
    durable = result["paths"]["faiss_add_durable"]["vectors_per_s"]
    lines = [
        f"Command: `{result['command']}` ({result['seconds'] / 60:.1f} min). "
        + facts_markdown(result["machine"], result["load_start"], result["load_end"]),
        "",
        f"{result['rows']:,} rows (WordNet-noun MiniLM rows tiled with noise, real-data-derived) "
        f"into one empty cosine gallery in batches of {result['batch']:,}; durability included "
        "where the path has it (index file written atomically with fsync; HTTP: vectors stored "
        f"as {result.get('vector_storage', 'segments')} with fsync, SQLite commit with "
        "synchronous=FULL). Batch times for the first and last quarter of the batches show how "
        "a batch's cost grows with the gallery.",
        "",
        "| path | vectors/s | ÷ raw faiss.add | ÷ raw faiss.add + write_index + fsync | "
        "ms/batch, first quarter | ms/batch, last quarter |",
        "|---|---|---|---|---|---|",
    ]
    for name in PATHS:
        if name in result["paths"]:
            e = result["paths"][name]
            lines.append(
                f"| {name} | {e['vectors_per_s']:,.0f} | {e['vectors_per_s'] / raw:.3f} | "
                f"{e['vectors_per_s'] / durable:.2f} | {e['first_quarter_ms_per_batch']:.0f} | "
                f"{e['last_quarter_ms_per_batch']:.0f} |"
            )
    npy = result["paths"].get("http_npy")
    if npy is not None:
        ratio = npy["vectors_per_s"] / raw
        lines += [
            "",
            f"Target (issue 6): `.npy` uploads ≥ 0.5× raw faiss.add: {ratio:.3f} — "
            f"{'met' if ratio >= 0.5 else 'missed'}; against FAISS with the same per-batch "
            f"durability: {npy['vectors_per_s'] / durable:.2f}.",
        ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20k rows in batches of 5k")
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--no-http", action="store_true")
    parser.add_argument(
        "--vector-storage",
        choices=("segments", "sql"),
        default="segments",
        help="where the server keeps the uploaded vectors (NOBACKFILL_VECTOR_STORAGE)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--no-markdown", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        quick_data_dir("bench.perf.ingest")
    n = args.rows or (20_000 if args.quick else 200_000)
    batch = args.batch or (5_000 if args.quick else 10_000)
    load_start = load_average()
    tic = time.perf_counter()
    vectors = tiled(wordnet_rows(with_new=False).old, n, seed=args.seed)
    points = lift_points(vectors, LIFT)
    lifted = lifted_gallery(points, LIFT.curv)
    workdir = Path(tempfile.mkdtemp(prefix="nobackfill-bench-ingest-"))
    try:
        times = faiss_paths(lifted, batch, workdir)
        times["library"] = library_path(points, batch, workdir)
        if not args.no_http:
            times.update(http_paths(vectors, batch, workdir, args.vector_storage))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    result = {
        **run_record(command_line("bench.perf.ingest", argv), tic, load_start),
        "rows": n,
        "batch": batch,
        "vector_storage": args.vector_storage,
        "paths": {name: summarise(t, batch) for name, t in times.items()},
    }
    raw = result["paths"]["faiss_add"]["vectors_per_s"]
    for name, e in result["paths"].items():
        print(f"{name}: {e['vectors_per_s']:,.0f} vectors/s ({e['vectors_per_s'] / raw:.3f}× raw)")
    out = args.out or RESULTS / ("ingest_quick.json" if args.quick else "ingest.json")
    section = None if args.no_markdown else SECTION
    publish(result, Path(out), render_markdown(result), section, "Ingest speed (bench.perf.ingest)")
    return result


if __name__ == "__main__":
    main()
