"""An attached milvus-lite collection at scale: no copy of the old vectors (issue 27).

    python -m bench.perf.milvus_attach                 # 1,000,000 points:
                                                       # bench/results/milvus_attach_scale.json and
                                                       # the bench.perf.milvus_attach.scale section
    python -m bench.perf.milvus_attach --points 20000 --no-markdown   # a smaller try

The Qdrant twin (``bench.perf.qdrant_attach --scale``) stops at 100k points: Qdrant's local mode
fills at about 200 points/s here. milvus-lite fills a million points in minutes, so the "attach of
a 1M-point embedded collection" figures are taken on it. A collection of ``--points`` MiniLM
glosses tiled with noise (``bench.common.tiled``: real-data-derived) is written as a team would
(its own field names, a FLAT COSINE index), attached in process (``create_app`` + ``TestClient``,
SQLite, inline jobs) and upgraded (the same procrustes upgrade as ``bench.perf.qdrant_attach``).
Measured per step: the service's own store (the data directory less the milvus-lite store), this
process's RSS (which holds milvus-lite's loaded collection too), and rows read from the
collection (``AttachedCollection.iterate`` pages and ``fetch_vectors``, with and without vectors).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pymilvus import DataType, MilvusClient

from app.vectors.milvus.attach import AttachedCollection
from bench.common.machine import facts_markdown, load_average, run_record
from bench.common.report import command_line, publish
from bench.common.wordnet import REPO_ROOT
from bench.perf.backfill_plan import wordnet_arrays
from bench.perf.qdrant_attach import footprint_table, scale_run, service_settings

RESULTS = REPO_ROOT / "bench/results"
SECTION = "bench.perf.milvus_attach.scale"
TITLE = "Attached Milvus collection at scale (bench.perf.milvus_attach)"
STORE, COLLECTION = "nouns.db", "nouns"
SOURCE = {
    "engine": "milvus",
    "uri": STORE,
    "collection": COLLECTION,
    "id_field": "doc_id",
    "vector_field": "embedding",
}
FILL_BATCH = 20_000


class RowCounter:
    """Rows the attached reader returns, per step, with or without vectors (wraps
    ``AttachedCollection.iterate`` and ``fetch_vectors``; ``close`` puts them back)."""

    def __init__(self) -> None:
        self.step = "setup"
        self.rows: Counter[str] = Counter()
        self._saved = {n: getattr(AttachedCollection, n) for n in ("iterate", "fetch_vectors")}
        counter = self

        def iterate(reader, batch, vectors, only=""):
            for page in counter._saved["iterate"](reader, batch, vectors, only):
                counter.add(vectors, len(page))
                yield page

        def fetch_vectors(reader, item_ids):
            ids, found = counter._saved["fetch_vectors"](reader, item_ids)
            counter.add(True, len(ids))
            return ids, found

        AttachedCollection.iterate = iterate  # type: ignore[method-assign]
        AttachedCollection.fetch_vectors = fetch_vectors  # type: ignore[method-assign]

    def add(self, with_vectors: bool, n: int) -> None:
        self.rows[f"{self.step}.{'vectors' if with_vectors else 'ids'}"] += n

    def close(self) -> None:
        for name, method in self._saved.items():
            setattr(AttachedCollection, name, method)


def fill_store(where: Path | str, vectors: np.ndarray) -> float:
    """The collection of ``vectors``, key i = row i (closed: the service opens it next), in a
    milvus-lite file, or on the Milvus server a URI names (``bench.perf.milvus_server``)."""
    tic = time.perf_counter()
    if isinstance(where, Path):
        where.parent.mkdir(parents=True, exist_ok=True)
    client = MilvusClient(str(where))
    schema = client.create_schema(auto_id=False)
    schema.add_field("doc_id", DataType.INT64, is_primary=True)
    schema.add_field("embedding", DataType.FLOAT_VECTOR, dim=vectors.shape[1])
    index = client.prepare_index_params()
    index.add_index("embedding", index_type="FLAT", metric_type="COSINE")
    client.create_collection(COLLECTION, schema=schema, index_params=index)
    for start in range(0, len(vectors), FILL_BATCH):
        part = vectors[start : start + FILL_BATCH]
        rows = [{"doc_id": start + n, "embedding": row} for n, row in enumerate(part.tolist())]
        client.insert(COLLECTION, rows)
    client.close()
    return time.perf_counter() - tic


def run(arrays: dict[str, np.ndarray], points: int, seed: int, workdir: Path) -> dict[str, Any]:
    settings = service_settings(workdir)
    root = settings.resolved_milvus_attach_root / settings.local_tenant  # the tenant's folder

    def fill(vectors: np.ndarray) -> float:
        return fill_store(root / STORE, vectors)

    return scale_run(arrays, points, seed, settings, root, fill, SOURCE, RowCounter)


def render(result: dict[str, Any]) -> str:
    r = result["run"]
    fp, reads, mib = r["footprint"], r["rows_read"], 2**20
    sampled = reads.get("upgrade.vectors", 0)
    lines = [
        f"Command: `{result['command']}` ({result['seconds'] / 60:.1f} min). "
        + facts_markdown(result["machine"], result["load_start"], result["load_end"]),
        "",
        f"A milvus-lite collection of {r['points']:,} points (the MiniLM glosses tiled with "
        "noise: real-data-derived; INT64 keys, FLAT COSINE index) attached in process "
        "(`create_app` + `TestClient`, SQLite, inline jobs) and upgraded (procrustes, query "
        f"objective, {r['paired']:,} MPNet gloss pairs, {r['logged']:,} logged lemma queries). "
        f"Old vectors {r['old_vector_bytes'] / mib:.0f} MiB as float32. Store = the data dir "
        "without the milvus-lite stores; RSS = this process, which holds milvus-lite's loaded "
        "collection too.",
        "",
    ]
    lines += footprint_table(r)
    attach_grew = fp["attached"]["store_bytes"] - fp["started"]["store_bytes"]
    upgrade_grew = fp["upgraded"]["store_bytes"] - fp["attached"]["store_bytes"]
    no_copy = attach_grew < r["old_vector_bytes"] / 100
    lines += [
        "",
        f"The attach wrote {attach_grew / mib:.1f} MiB to the store against "
        f"{r['old_vector_bytes'] / mib:.0f} MiB of old vectors (no copy: "
        f"{'met' if no_copy else 'missed'}); the upgrade {upgrade_grew / mib:.1f} MiB (its "
        "dataset and the model; it does not grow with the collection). Upgrade sampling read "
        f"{sampled:,} vectors for {r['paired']:,} training items (target ≤ the training items: "
        f"{'met' if sampled <= r['paired'] else 'missed'}). Collection filled in "
        f"{r['fill_s']:.0f} s, service start {r['start_s']:.0f} s, attach "
        f"{r['attach_s']:.1f} s ({r['count']:,} points; it reads only the keys that need a map: none of these INT64 "
        "keys), "
        f"upgrade {r['upgrade_s']:.0f} s.",
    ]
    return "\n".join(lines) + "\n"


def main(
    argv: Sequence[str] | None = None, arrays: dict[str, np.ndarray] | None = None
) -> dict[str, Any]:
    """``arrays``: gloss/lemma rows by both models (default: the WordNet-noun data); the tests
    pass the small fixture's."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--no-markdown", action="store_true")
    args = parser.parse_args(argv)
    load_start = load_average()
    tic = time.perf_counter()
    arrays = arrays if arrays is not None else wordnet_arrays()
    workdir = Path(tempfile.mkdtemp(prefix="nobackfill-bench-milvus-"))
    try:
        outcome = run(arrays, args.points, args.seed, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    result = {
        **run_record(command_line("bench.perf.milvus_attach", argv), tic, load_start),
        "run": outcome,
    }
    out = args.out or RESULTS / "milvus_attach_scale.json"
    publish(result, out, render(result), None if args.no_markdown else SECTION, TITLE)
    return result


if __name__ == "__main__":
    main()
