"""An attached Qdrant collection against the same vectors copied into the service (issue 27).

    python -m bench.perf.qdrant_attach            # the 24,000 WordNet-noun glosses:
                                                  # bench/results/qdrant_attach.json and the
                                                  # bench.perf.qdrant_attach section of BENCHMARKS.md
    python -m bench.perf.qdrant_attach --quick    # fewer queries and rounds, nothing published
    python -m bench.perf.qdrant_attach --scale 100000   # only the no-copy figures (item 3) on a
                                                  # larger tiled collection: qdrant_attach_scale.json
                                                  # and the bench.perf.qdrant_attach.scale section

Everything runs in this process: the app built by ``create_app`` (SQLite in a temporary data
directory, the inline job runner) driven through a ``TestClient`` (the HTTP layer in process), and
an embedded (local-mode) Qdrant collection under the service's Qdrant root. Local mode locks its
folder to one client, so the direct qdrant-client searches use the service's own client of it.

1. **Equality.** Point i of the collection ``nouns`` is synset i's gloss by the old model
   (MiniLM); the copied gallery holds the same vectors under item ids ``"i"`` (an integer point id
   below 2⁶² is its own internal id, ``app.vectors.attached_ids``, so both galleries name item i
   alike). One upgrade trained on the attached gallery (procrustes, query objective; a dataset
   pairing the first ``PAIRED`` items with their MPNet gloss, a log of ``LOGGED`` lemma queries
   relevant to their own gloss), used on both. Held-out lemma queries (synsets outside the pairs
   and the log) then search both galleries: ``old`` (old-model ``vectors``), ``bridged``
   (``features`` + the model, nothing re-embedded), and, after the same seeded ``--reembed``
   share of the items is re-embedded on both (in place on the attached one: a named vector),
   ``mixed`` (``features`` + model) and ``transition`` (``features`` + ``old_vectors`` + model).
   The figure: the share of queries whose top-10 ids are identical, in order (target ≥ 99.9 %).
2. **Speed.** The service's search function (``app.search.service.search_gallery``, one session
   and the gallery row per call as the endpoint does; no HTTP) on the attached gallery, ``old``
   and ``bridged`` (the bridged call includes the query transform), against qdrant-client's own
   ``query_points`` (batch 1) / ``query_batch_points`` (batch 256) on the same collection, limit
   10, no payload, no vectors, given the old-model query (local mode is an exact scan, so a
   query's values do not change its cost: this is the direct search of an already-transformed
   query). Interleaved round by round in a fresh random order; ratio = direct ÷ service
   (target ≥ 0.8). Measured before anything is re-embedded (one vector per point).
3. **No copy.** Bytes of the service's own store (the data directory without its Qdrant root)
   and this process's RSS before and after the attach and the upgrade, then after the copied
   gallery's upload for contrast; rows read from the collection (``retrieve`` / ``scroll``, with
   and without vectors) per step, counted by wrapping the client's methods.
   ``--scale N`` measures these alone on a collection of N tiled glosses. Local mode fills at
   about 200–300 points/s here (50k random points in 240 s, the 24k glosses in 81 s), so a 1M
   collection (over an hour to build) has not been measured; see BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from fastapi.testclient import TestClient
from qdrant_client import QdrantClient, models
from sqlalchemy import select

from app.core.settings import Settings
from app.galleries.models import Gallery
from app.galleries.service import get_gallery
from app.main import create_app
from app.search.service import SearchQuery, search_gallery
from app.vectors.qdrant.source import QdrantSource, connection
from bench.common.machine import facts_markdown, load_average, run_record
from bench.common.report import command_line, publish
from bench.common.service import BENCH_KEY
from bench.common.tiled import tiled
from bench.common.wordnet import NEW_MODEL, OLD_MODEL, REPO_ROOT
from bench.perf.backfill_plan import wordnet_arrays
from bench.perf.mixed_search import _ok, _part

RESULTS = REPO_ROOT / "bench/results"
SECTION = "bench.perf.qdrant_attach"
TITLE = "Attached Qdrant collection (bench.perf.qdrant_attach)"
COLLECTION = "nouns"
SOURCE = {"engine": "qdrant", "path": COLLECTION, "collection": COLLECTION}
PAIRED = 3_000
LOGGED = 1_000
FILL_BATCH = 2_000
EQUAL_TARGET = 0.999
SPEED_TARGET = 0.8
KINDS = ("old", "bridged", "mixed", "transition")


class ReadCounter:
    """Points returned by the client's ``retrieve`` and ``scroll``, per step, with or without
    vectors (wraps the class's methods; ``close`` puts them back)."""

    def __init__(self) -> None:
        self.step = "setup"
        self.rows: Counter[str] = Counter()
        self._saved = {name: getattr(QdrantClient, name) for name in ("retrieve", "scroll")}
        counter = self

        def retrieve(client, collection_name, ids, *args, **kwargs):
            records = counter._saved["retrieve"](client, collection_name, ids, *args, **kwargs)
            counter.add(kwargs.get("with_vectors", False), len(records))
            return records

        def scroll(client, collection_name, *args, **kwargs):
            records, offset = counter._saved["scroll"](client, collection_name, *args, **kwargs)
            counter.add(kwargs.get("with_vectors", False), len(records))
            return records, offset

        QdrantClient.retrieve = retrieve  # type: ignore[method-assign]
        QdrantClient.scroll = scroll  # type: ignore[method-assign]

    def add(self, with_vectors: Any, n: int) -> None:
        self.rows[f"{self.step}.{'vectors' if with_vectors else 'ids'}"] += n

    def close(self) -> None:
        for name, method in self._saved.items():
            setattr(QdrantClient, name, method)


def service_settings(workdir: Path) -> Settings:
    """The in-process service's settings (data under ``workdir``), its Qdrant root made."""
    settings = Settings(
        _env_file=None,
        data_dir=workdir / "data",
        job_runner="inline",
        bootstrap_key=BENCH_KEY,
        local_key=False,
        log_level="warning",
    )
    (settings.resolved_qdrant_root / settings.local_tenant).mkdir(parents=True, exist_ok=True)
    return settings


def fill_collection(folder: Path, vectors: np.ndarray) -> float:
    """The collection of ``vectors``, point id i = row i (closed: the service opens it next)."""
    tic = time.perf_counter()
    client = QdrantClient(path=str(folder))
    params = models.VectorParams(size=vectors.shape[1], distance=models.Distance.COSINE)
    client.create_collection(COLLECTION, vectors_config=params)
    for start in range(0, len(vectors), FILL_BATCH):
        part = vectors[start : start + FILL_BATCH]
        client.upload_collection(
            COLLECTION, vectors=part, ids=list(range(start, start + len(part))), wait=True
        )
    client.close()
    return time.perf_counter() - tic


def store_bytes(data_dir: Path, qdrant_root: Path) -> int:
    """The service's own files: the data directory less its Qdrant root."""
    return sum(
        p.stat().st_size
        for p in data_dir.rglob("*")
        if p.is_file() and qdrant_root not in p.resolve().parents
    )


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def upgrade(
    client: TestClient, gallery_id: str, arrays: dict[str, np.ndarray], ids, paired, logged
):
    dataset = _ok(client.post("/v1/datasets", json={"name": "q", "gallery_id": gallery_id}), 201)
    url = f"/v1/datasets/{dataset['id']}"
    _ok(
        client.post(
            f"{url}/items",
            files={
                "ids": _part(ids[:paired]),
                "features": _part(arrays[f"gloss.{NEW_MODEL}"][:paired]),
            },
        )
    )
    _ok(
        client.post(
            f"{url}/queries",
            files={
                "ids": _part(np.array([f"lemma:{i}" for i in range(logged)])),
                "features": _part(arrays[f"lemma.{NEW_MODEL}"][:logged]),
                "old_vectors": _part(arrays[f"lemma.{OLD_MODEL}"][:logged]),
                "relevant_ids": (
                    None,
                    json.dumps([[str(i)] for i in ids[:logged]]),
                    "application/json",
                ),
            },
        )
    )
    body = {"dataset_id": dataset["id"], "method": "procrustes", "objective": "query"}
    created = _ok(client.post("/v1/upgrades", json=body), 202)
    job = _ok(client.get(f"/v1/upgrades/{created['id']}"))
    if job["status"] != "succeeded":
        raise RuntimeError(f"upgrade {job['status']}: {job.get('error')}")
    return job["model_id"]


def top_ids(client: TestClient, gallery_id: str, body: dict[str, Any], n: int) -> list[list[str]]:
    """Top-10 ids of every query row, asked 128 rows at a time."""
    out: list[list[str]] = []
    for start in range(0, n, 128):
        part = {
            k: v[start : start + 128].tolist() if isinstance(v, np.ndarray) else v
            for k, v in body.items()
        }
        answer = _ok(client.post(f"/v1/galleries/{gallery_id}/search", json=part | {"k": 10}))
        out += [[hit["id"] for hit in row] for row in answer["results"]]
    return out


def equal_share(a: list[list[str]], b: list[list[str]]) -> float:
    return float(np.mean([x == y for x, y in zip(a, b, strict=True)]))


def speed(
    client: TestClient,
    settings: Settings,
    gallery_id: str,
    model_id: str,
    old_q: np.ndarray,
    new_q: np.ndarray,
    batch: int,
    rounds: int,
    seed: int,
) -> dict[str, Any]:
    state = client.app.state.service
    with state.db.sessions() as session:
        tenant_id = session.scalar(select(Gallery.tenant_id).where(Gallery.id == gallery_id))
    n = len(old_q)

    def rows(r: int) -> np.ndarray:
        return (np.arange(batch) + r * batch) % n

    def service(kind: str) -> Callable[[int], Any]:
        def call(r: int) -> Any:
            at = rows(r)
            if kind == "old":
                query = SearchQuery.build(old_q[at], None, None, 10, None, None)
            else:
                query = SearchQuery.build(None, new_q[at], None, 10, model_id, None)
            with state.db.sessions() as session:
                try:
                    gallery = get_gallery(session, tenant_id, gallery_id)
                    return search_gallery(
                        session, settings, state.indexes, state.models, tenant_id, gallery, query
                    )
                finally:
                    session.rollback()

        return call

    conn = connection(settings, QdrantSource.of({**SOURCE, "folder": settings.local_tenant}))

    def direct(r: int) -> Any:
        at = rows(r)
        with conn.use() as qdrant:
            if batch == 1:
                return qdrant.query_points(
                    COLLECTION, query=old_q[at[0]].tolist(), limit=10, with_payload=False
                )
            requests = [
                models.QueryRequest(query=old_q[i].tolist(), limit=10, with_payload=False)
                for i in at
            ]
            return qdrant.query_batch_points(COLLECTION, requests=requests)

    engines = {
        "direct": direct,
        "service_old": service("old"),
        "service_bridged": service("bridged"),
    }
    for fn in engines.values():
        fn(0)
    times: dict[str, list[float]] = {name: [] for name in engines}
    order = list(engines)
    rng = np.random.default_rng(seed)
    for r in range(rounds):
        rng.shuffle(order)
        for name in order:
            tic = time.perf_counter()
            engines[name](r + 1)
            times[name].append(time.perf_counter() - tic)
    median = {name: float(np.median(t)) for name, t in times.items()}
    return {
        "batch": batch,
        "rounds": rounds,
        "median_ms": {name: 1000 * m for name, m in median.items()},
        "ratio_old": median["direct"] / median["service_old"],
        "ratio_bridged": median["direct"] / median["service_bridged"],
    }


def run(arrays: dict[str, np.ndarray], args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    old = arrays[f"gloss.{OLD_MODEL}"]
    synsets = len(old)
    paired, logged = min(PAIRED, synsets // 2), min(LOGGED, synsets // 4)
    ids = np.array([str(i) for i in range(synsets)])
    settings = service_settings(workdir)
    # The local tenant's own folder under the root (``source_rules.tenant_folder``).
    data_dir, root = settings.data_dir, settings.resolved_qdrant_root / settings.local_tenant
    out["fill_s"] = fill_collection(root / COLLECTION, old)
    print(f"collection of {synsets:,} points filled in {out['fill_s']:.0f} s", flush=True)
    counter = ReadCounter()
    footprint: dict[str, dict[str, float]] = {}

    def measure(step: str) -> None:
        state.indexes.flush()
        footprint[step] = {"store_bytes": store_bytes(data_dir, root), "rss_mib": rss_mib()}

    try:
        with TestClient(create_app(settings), raise_server_exceptions=True) as client:
            client.headers["Authorization"] = f"Bearer {BENCH_KEY}"
            state = client.app.state.service
            measure("started")
            counter.step = "attach"
            tic = time.perf_counter()
            body = {"name": "attached", "model_name": OLD_MODEL, "source": SOURCE}
            attached = _ok(client.post("/v1/galleries", json=body), 201)["id"]
            out["attach_s"] = time.perf_counter() - tic
            measure("attached")
            counter.step = "upgrade"
            tic = time.perf_counter()
            model_id = upgrade(client, attached, arrays, ids, paired, logged)
            out["upgrade_s"] = time.perf_counter() - tic
            measure("upgraded")
            counter.step = "copy"
            tic = time.perf_counter()
            gallery = {"name": "copied", "dim": old.shape[1], "model_name": OLD_MODEL}
            copied = _ok(client.post("/v1/galleries", json=gallery | {"metric": "cosine"}), 201)
            copied = copied["id"]
            chunk = settings.max_vectors_per_request
            for start in range(0, synsets, chunk):
                part = slice(start, start + chunk)
                _ok(
                    client.post(
                        f"/v1/galleries/{copied}/vectors",
                        files={"ids": _part(ids[part]), "vectors": _part(old[part])},
                    )
                )
            out["copy_s"] = time.perf_counter() - tic
            measure("copied")
            print(f"attach {out['attach_s']:.1f} s, upgrade {out['upgrade_s']:.0f} s", flush=True)

            counter.step = "search"
            rng = np.random.default_rng(args.seed)
            held = rng.choice(
                np.arange(paired, synsets), size=min(args.queries, synsets - paired), replace=False
            )
            old_q = arrays[f"lemma.{OLD_MODEL}"][held]
            new_q = arrays[f"lemma.{NEW_MODEL}"][held]
            n = len(held)
            bodies = {
                "old": {"vectors": old_q},
                "bridged": {"features": new_q, "model_id": model_id},
                "mixed": {"features": new_q, "model_id": model_id},
                "transition": {"features": new_q, "old_vectors": old_q, "model_id": model_id},
            }
            answers: dict[str, dict[str, list[list[str]]]] = {}
            for kind in ("old", "bridged"):
                answers[kind] = {g: top_ids(client, g, bodies[kind], n) for g in (attached, copied)}

            out["speed"] = [
                speed(client, settings, attached, model_id, old_q, new_q, batch, rounds, args.seed)
                for batch, rounds in ((1, args.rounds_1), (256, args.rounds_256))
            ]
            for entry in out["speed"]:
                print(f"speed batch {entry['batch']}: {entry['median_ms']}", flush=True)

            counter.step = "reembed"
            chosen = np.sort(rng.choice(synsets, size=round(args.reembed * synsets), replace=False))
            new_gloss = arrays[f"gloss.{NEW_MODEL}"]
            for g in (attached, copied):
                for start in range(0, len(chosen), chunk):
                    part = chosen[start : start + chunk]
                    _ok(
                        client.post(
                            f"/v1/galleries/{g}/vectors",
                            files={
                                "ids": _part(ids[part]),
                                "features": _part(new_gloss[part]),
                                "model_id": (None, f'"{model_id}"', "application/json"),
                            },
                        )
                    )
            counter.step = "search"
            for kind in ("mixed", "transition"):
                answers[kind] = {g: top_ids(client, g, bodies[kind], n) for g in (attached, copied)}
            out["reembedded"] = len(chosen)
    finally:
        counter.close()
    out["equal"] = {kind: equal_share(a[attached], a[copied]) for kind, a in answers.items()}
    out["full_rows"] = {
        kind: float(np.mean([len(r) == 10 for r in a[attached]])) for kind, a in answers.items()
    }
    out["queries"] = n
    out["synsets"] = synsets
    out["paired"], out["logged"] = paired, logged
    out["footprint"] = footprint
    out["rows_read"] = dict(counter.rows)
    out["old_vector_bytes"] = int(old.nbytes)
    return out


def run_scale(
    arrays: dict[str, np.ndarray], points: int, seed: int, workdir: Path
) -> dict[str, Any]:
    """A collection of ``points`` MiniLM glosses tiled with noise, attached and upgraded (the
    same upgrade as the equality run's): store bytes, RSS and rows read per step."""
    settings = service_settings(workdir)
    root = settings.resolved_qdrant_root / settings.local_tenant  # the tenant's folder
    return scale_run(
        arrays,
        points,
        seed,
        settings,
        root,
        lambda vectors: fill_collection(root / COLLECTION, vectors),
        SOURCE,
        ReadCounter,
    )


def scale_run(
    arrays: dict[str, np.ndarray],
    points: int,
    seed: int,
    settings: Settings,
    root: Path,
    fill: Callable[[np.ndarray], float],
    source: dict[str, Any],
    counter_type: Callable[[], Any],
) -> dict[str, Any]:
    """The scale run of either engine: ``points`` tiled glosses written by ``fill`` (its
    seconds) into a store under ``root``, then ``attached_and_upgraded`` counting reads with a
    fresh ``counter_type()`` (closed after)."""
    out: dict[str, Any] = {"points": points}
    old = tiled(arrays[f"gloss.{OLD_MODEL}"], points, seed=seed)
    out["old_vector_bytes"] = int(old.nbytes)
    synsets = len(arrays[f"gloss.{OLD_MODEL}"])
    paired, logged = min(PAIRED, synsets // 2), min(LOGGED, synsets // 4)
    out["fill_s"] = fill(old)
    del old
    print(f"collection of {points:,} points filled in {out['fill_s']:.0f} s", flush=True)
    counter = counter_type()
    try:
        out |= attached_and_upgraded(settings, root, source, counter, arrays, paired, logged)
    finally:
        counter.close()
    return out


def attached_and_upgraded(
    settings: Settings,
    root: Path,
    source: dict[str, Any],
    counter: Any,
    arrays: dict[str, np.ndarray],
    paired: int,
    logged: int,
) -> dict[str, Any]:
    """Start the service, attach ``source`` and upgrade on it (``upgrade``), measuring the store
    (the data dir less ``root``, where the collection lives) and RSS at each step and timing
    them; ``counter`` (``.step``, ``.rows``) counts the rows read from the collection."""
    data_dir = settings.data_dir
    ids = np.array([str(i) for i in range(paired)])
    out: dict[str, Any] = {}
    footprint = {"before": {"store_bytes": store_bytes(data_dir, root), "rss_mib": rss_mib()}}
    tic = time.perf_counter()
    with TestClient(create_app(settings), raise_server_exceptions=True) as client:
        client.headers["Authorization"] = f"Bearer {BENCH_KEY}"
        state = client.app.state.service

        def measure(step: str) -> None:
            state.indexes.flush()
            footprint[step] = {"store_bytes": store_bytes(data_dir, root), "rss_mib": rss_mib()}

        measure("started")
        out["start_s"] = time.perf_counter() - tic
        counter.step = "attach"
        tic = time.perf_counter()
        body = {"name": "attached", "model_name": OLD_MODEL, "source": source}
        attached = _ok(client.post("/v1/galleries", json=body), 201)
        out["attach_s"] = time.perf_counter() - tic
        out["count"] = attached["count"]
        measure("attached")
        counter.step = "upgrade"
        tic = time.perf_counter()
        upgrade(client, attached["id"], arrays, ids, paired, logged)
        out["upgrade_s"] = time.perf_counter() - tic
        measure("upgraded")
    out["paired"], out["logged"] = paired, logged
    out["footprint"] = footprint
    out["rows_read"] = dict(counter.rows)
    return out


def footprint_table(r: dict[str, Any]) -> list[str]:
    """The store / RSS / rows-read table of a scale run (``attached_and_upgraded``)."""
    fp, reads, mib = r["footprint"], r["rows_read"], 2**20
    lines = [
        "| step | store MiB | RSS MiB | rows read from the collection (with vectors / ids only) |",
        "|---|---|---|---|",
    ]
    labels = {"before": "collection built, service not started", "started": "service started"}
    for step, read in (
        ("before", None),
        ("started", "setup"),
        ("attached", "attach"),
        ("upgraded", "upgrade"),
    ):
        rows = (
            f"{reads.get(read + '.vectors', 0):,} / {reads.get(read + '.ids', 0):,}"
            if read
            else "—"
        )
        lines.append(
            f"| {labels.get(step, step)} | {fp[step]['store_bytes'] / mib:.1f} | "
            f"{fp[step]['rss_mib']:.0f} | {rows} |"
        )
    return lines


def verdict(value: float, target: float, unit: str = "") -> str:
    if value >= target:
        return "met"
    return f"missed by {target - value:.3g}{unit}"


def render_markdown(result: dict[str, Any]) -> str:
    r = result["run"]
    fp = r["footprint"]
    lines = [
        f"Command: `{result['command']}` ({result['seconds'] / 60:.1f} min). "
        + facts_markdown(result["machine"], result["load_start"], result["load_end"]),
        "",
        f"In process (`create_app` + `TestClient`, SQLite, inline jobs), an embedded (local-mode) "
        f"Qdrant collection of the {r['synsets']:,} WordNet-noun MiniLM glosses (point i = gloss "
        f'i) attached, and the same vectors copied into an ordinary FAISS gallery (item "i"). '
        f"One upgrade (procrustes, query objective, {r['paired']:,} MPNet gloss pairs, "
        f"{r['logged']:,} logged lemma queries) used on both; {r['queries']:,} held-out lemma "
        f"queries; mixed and transition after {r['reembedded']:,} items "
        f"({result['reembed']:.0%}) were re-embedded on both (a named vector in the collection).",
        "",
        "| search | same top-10 (in order), attached vs copied | target ≥ 99.9 % |",
        "|---|---|---|",
    ]
    for kind, share in r["equal"].items():
        lines.append(f"| {kind} | {share:.2%} | {verdict(share, EQUAL_TARGET)} |")
    lines += [
        "",
        "Speed: the service's search function on the attached gallery (session, gallery row, "
        "transform for `bridged`, Qdrant query with vectors returned, rerank; no HTTP) against "
        "qdrant-client `query_points` / `query_batch_points` on the same collection through the "
        "same client (limit 10, no payload, no vectors). Rounds interleaved in random order; "
        "medians. Ratio = direct ÷ service.",
        "",
        "| batch | rounds | direct ms | service old ms | service bridged ms | ratio old | "
        "ratio bridged | target ≥ 0.8 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in r["speed"]:
        m = s["median_ms"]
        worst = min(s["ratio_old"], s["ratio_bridged"])
        lines.append(
            f"| {s['batch']} | {s['rounds']} | {m['direct']:.1f} | {m['service_old']:.1f} | "
            f"{m['service_bridged']:.1f} | {s['ratio_old']:.2f} | {s['ratio_bridged']:.2f} | "
            f"{verdict(worst, SPEED_TARGET)} |"
        )
    mib = 2**20
    reads = r["rows_read"]
    lines += [
        "",
        f"No copy ({r['synsets']:,} points, old vectors {r['old_vector_bytes'] / mib:.1f} MiB as "
        "float32): the service's own store (data dir without the Qdrant root) and this process's "
        "RSS (which includes the embedded Qdrant's memory) after each step.",
        "",
        "| step | store MiB | RSS MiB | rows read from the collection (with vectors / ids only) |",
        "|---|---|---|---|",
    ]
    for step, read in (
        ("started", None),
        ("attached", "attach"),
        ("upgraded", "upgrade"),
        ("copied", None),
    ):
        rows = (
            f"{reads.get(read + '.vectors', 0):,} / {reads.get(read + '.ids', 0):,}"
            if read
            else "—"
        )
        label = "copied gallery uploaded (for contrast)" if step == "copied" else step
        lines.append(
            f"| {label} | {fp[step]['store_bytes'] / mib:.1f} | {fp[step]['rss_mib']:.0f} | {rows} |"
        )
    sampled = reads.get("upgrade.vectors", 0)
    lines += [
        "",
        f"Upgrade sampling read {sampled:,} vectors for {r['paired']:,} training items "
        f"(target ≤ the training items: {'met' if sampled <= r['paired'] else 'missed'}). "
        "Not measured: a 1M-point (or 200k) collection. Local mode filled at about 210 points/s "
        "on this machine (50,000 points in 240 s), so 1M would take over an hour to build; the "
        f"no-copy figures above are at {r['synsets']:,} points. Setup: collection filled in "
        f"{r['fill_s']:.0f} s, attach {r['attach_s']:.1f} s, upgrade {r['upgrade_s']:.0f} s, "
        f"copy {r['copy_s']:.1f} s.",
    ]
    return "\n".join(lines) + "\n"


def render_scale(result: dict[str, Any]) -> str:
    r = result["run"]
    fp, reads, mib = r["footprint"], r["rows_read"], 2**20
    sampled = reads.get("upgrade.vectors", 0)
    lines = [
        f"Command: `{result['command']}` ({result['seconds'] / 60:.1f} min). "
        + facts_markdown(result["machine"], result["load_start"], result["load_end"]),
        "",
        f"An embedded (local-mode) Qdrant collection of {r['points']:,} points (the MiniLM "
        "glosses tiled with noise: real-data-derived) attached in process (`create_app` + "
        f"`TestClient`, SQLite, inline jobs) and upgraded (procrustes, query objective, "
        f"{r['paired']:,} MPNet gloss pairs, {r['logged']:,} logged lemma queries). Old vectors "
        f"{r['old_vector_bytes'] / mib:.0f} MiB as float32. Store = the data dir without its "
        "Qdrant root; RSS = this process, which holds the embedded Qdrant's points too.",
        "",
    ]
    lines += footprint_table(r)
    attach_grew = fp["attached"]["store_bytes"] - fp["started"]["store_bytes"]
    upgrade_grew = fp["upgraded"]["store_bytes"] - fp["attached"]["store_bytes"]
    lines += [
        "",
        f"The attach wrote {attach_grew / mib:.1f} MiB to the store against "
        f"{r['old_vector_bytes'] / mib:.0f} MiB of old vectors (no copy: "
        f"{'met' if attach_grew < r['old_vector_bytes'] / 100 else 'missed'}); the upgrade "
        f"{upgrade_grew / mib:.1f} MiB (its dataset: {r['paired']:,} MPNet pairs and "
        f"{r['logged']:,} logged queries, and the model; it does not grow with the collection). "
        "The RSS growth on attach is the embedded Qdrant opening the collection in this "
        "process, not the service's store. Upgrade sampling read "
        f"{sampled:,} vectors for {r['paired']:,} training items (target ≤ the training items: "
        f"{'met' if sampled <= r['paired'] else 'missed'}). Collection filled in "
        f"{r['fill_s']:.0f} s, service start {r['start_s']:.0f} s, attach "
        f"{r['attach_s']:.1f} s ({r['count']:,} points), upgrade {r['upgrade_s']:.0f} s. "
        "1M points not measured: local mode fills at about 200 points/s here.",
    ]
    return "\n".join(lines) + "\n"


def main(
    argv: Sequence[str] | None = None, arrays: dict[str, np.ndarray] | None = None
) -> dict[str, Any]:
    """``arrays``: gloss/lemma rows by both models, keyed ``"<field>.<model>"`` (default: the
    WordNet-noun data); the tests pass the small fixture's."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer queries and rounds")
    parser.add_argument("--queries", type=int, default=None)
    parser.add_argument("--reembed", type=float, default=0.1)
    parser.add_argument("--rounds-1", type=int, default=None)
    parser.add_argument("--rounds-256", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--no-markdown", action="store_true")
    parser.add_argument(
        "--scale", type=int, default=None, help="only the no-copy figures, on this many points"
    )
    args = parser.parse_args(argv)
    args.queries = args.queries or (200 if args.quick else 1_000)
    args.rounds_1 = args.rounds_1 or (5 if args.quick else 40)
    args.rounds_256 = args.rounds_256 or (2 if args.quick else 8)
    load_start = load_average()
    tic = time.perf_counter()
    arrays = arrays if arrays is not None else wordnet_arrays()
    workdir = Path(tempfile.mkdtemp(prefix="nobackfill-bench-qdrant-"))
    if args.scale is not None:
        try:
            outcome = run_scale(arrays, args.scale, args.seed, workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        result = {
            **run_record(command_line("bench.perf.qdrant_attach", argv), tic, load_start),
            "run": outcome,
        }
        section = None if args.no_markdown or args.quick else SECTION + ".scale"
        publish(
            result,
            args.out or RESULTS / "qdrant_attach_scale.json",
            render_scale(result),
            section,
            "Attached Qdrant collection at scale (bench.perf.qdrant_attach --scale)",
        )
        return result
    try:
        outcome = run(arrays, args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    result = {
        **run_record(command_line("bench.perf.qdrant_attach", argv), tic, load_start),
        "queries": args.queries,
        "reembed": args.reembed,
        "run": outcome,
    }
    quick_out = REPO_ROOT / "bench/out/qdrant_attach_quick.json"
    out = args.out or (quick_out if args.quick else RESULTS / "qdrant_attach.json")
    section = None if args.no_markdown or args.quick else SECTION
    publish(result, out, render_markdown(result), section, TITLE)
    return result


if __name__ == "__main__":
    main()
