"""Access-count upload speed: counts/s through POST /v1/galleries/{id}/access with `.npy` parts.

    python -m bench.perf.access_upload           # 1M items; bench/results/access_upload.json and
                                                 # the bench.perf.access_upload section of
                                                 # BENCHMARKS.md
    python -m bench.perf.access_upload --quick   # 20k items, nothing published
    python -m bench.perf.access_upload --databases sqlite --batches 10000 100000 --no-markdown

The target (issue 25): ≥ 1M counts/s end to end. A count is one row of an upload (an item id and
how many times it was opened); the rows are a Zipf-like draw over the gallery's items (a few items
take most of the traffic, so a batch repeats ids, which the service sums), each row's count 1–3.

Per database (SQLite in the data dir, or a fresh PostgreSQL database), a uvicorn server (one
worker, segment-file vector storage) gets one cosine gallery of ``--items`` items of a small
dimension (the counts do not touch the vectors), uploaded over HTTP; then, for each batch size,
``--rows`` counts are uploaded as `.npy` parts (``ids`` as fixed-width unicode, ``counts`` as
int64), one batch after another from one client, each with an Idempotency-Key as the client sends
it. A batch size above the service's default limit (``max_vectors_per_request``, 10k) runs on a
server configured for it (``NOBACKFILL_MAX_VECTORS_PER_REQUEST``). After the uploads, GET /access
must report exactly the distinct ids and the sum uploaded (the run fails otherwise).

The phase breakdown runs the same batches in-process against the same database, the server
stopped: parse (the two `.npy` parts, as the endpoint reads them), then ``add_counts`` with its
steps timed by wrappers (``PHASES``); what the wrappers do not cover is the write (the upsert
statement) and the rest. ``--profile`` adds cProfile's top functions of those in-process calls.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.common.machine import facts_markdown, load_average, run_record
from bench.common.report import command_line, publish
from bench.common.service import BENCH_KEY, create_gallery, npy_bytes, start_service
from bench.common.wordnet import REPO_ROOT

RESULTS = REPO_ROOT / "bench/results"
SECTION = "bench.perf.access_upload"
TARGET = 1_000_000
DEFAULT_LIMIT = 10_000
POSTGRES = os.environ.get(
    "NOBACKFILL_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
# The steps of ``app.migration.access.add_counts`` timed in-process: phase → (module, name)
# of the functions the phase consists of. ``commit`` is the session's commit; ``write`` is what
# is left of ``add_counts`` (the upsert statement, and the glue).
PHASES: dict[str, tuple[tuple[str, str], ...]] = {
    "check": (
        ("app.migration.access", "check_id_values"),
        ("app.migration.access", "as_counts"),
        ("app.migration.access", "summed"),
    ),
    "idempotency": (
        ("app.migration.access", "_fingerprinted"),
        ("app.migration.access", "find_replay"),
        ("app.migration.access", "remember"),
    ),
    "lookup": (
        ("app.migration.access", "_lock_shared"),
        ("app.migration.access", "_lookup"),
    ),
}


def item_ids(n: int) -> np.ndarray:
    """The gallery's item ids: short strings, as a click log would name them, in the narrowest
    unicode dtype that holds them (what ``np.array`` of a list of str gives a client)."""
    ids = np.char.add("item-", np.arange(n).astype(str))
    return ids.astype(f"<U{int(np.char.str_len(ids).max(initial=1))}")


def zipf_rows(
    n_items: int, n_rows: int, exponent: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """(item index, count) of ``n_rows`` rows: item of rank k drawn with weight k^-exponent, the
    ranks shuffled over the items (popular items are not the lowest ids), counts 1–3."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, n_items + 1, dtype=np.float64) ** exponent
    rank = rng.choice(n_items, size=n_rows, p=weights / weights.sum())
    return rng.permutation(n_items)[rank], rng.integers(1, 4, size=n_rows, dtype=np.int64)


@contextmanager
def database(kind: str, workdir: Path) -> Iterator[str | None]:
    """The URL of a fresh database for one server (None: SQLite in its data dir), dropped after."""
    if kind == "sqlite":
        yield None
        return
    import psycopg

    admin = POSTGRES.replace("postgresql+psycopg://", "postgresql://")
    name = f"bench_access_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield POSTGRES.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def upload_items(
    client: httpx.Client, gallery_id: str, ids: np.ndarray, dim: int, batch: int
) -> float:
    """The gallery's items over HTTP (random unit vectors); returns the seconds it took."""
    rng = np.random.default_rng(1)
    tic = time.perf_counter()
    for start in range(0, len(ids), batch):
        part = ids[start : start + batch]
        vectors = rng.standard_normal((len(part), dim)).astype(np.float32)
        files = {"ids": ("ids.npy", npy_bytes(part)), "vectors": ("v.npy", npy_bytes(vectors))}
        response = client.post(f"/v1/galleries/{gallery_id}/vectors", files=files)
        response.raise_for_status()
    return time.perf_counter() - tic


def batches(
    ids: np.ndarray, rows: np.ndarray, counts: np.ndarray, size: int
) -> list[dict[str, bytes]]:
    """The upload bodies' parts, encoded before the clock starts (the client's cost is not the
    service's)."""
    return [
        {
            "ids": npy_bytes(ids[rows[start : start + size]]),
            "counts": npy_bytes(counts[start : start + size]),
        }
        for start in range(0, len(rows), size)
    ]


def http_uploads(
    client: httpx.Client, gallery_id: str, parts: list[dict[str, bytes]]
) -> list[float]:
    """Each batch's seconds, request sent to answer read."""
    times = []
    for part in parts:
        files = {name: (f"{name}.npy", data) for name, data in part.items()}
        headers = {"Idempotency-Key": f"access-{uuid.uuid4()}"}
        tic = time.perf_counter()
        response = client.post(f"/v1/galleries/{gallery_id}/access", files=files, headers=headers)
        times.append(time.perf_counter() - tic)
        response.raise_for_status()
    return times


def check_totals(
    client: httpx.Client, gallery_id: str, rows: np.ndarray, counts: np.ndarray
) -> None:
    """GET /access must hold exactly what was uploaded (distinct items, sum of counts)."""
    body = client.get(f"/v1/galleries/{gallery_id}/access", params={"limit": 1}).json()
    expected = (len(np.unique(rows)), int(counts.sum()))
    if (body["counted_items"], body["total"]) != expected:
        raise AssertionError(
            f"GET /access says {body['counted_items']}, {body['total']}; uploaded {expected}"
        )


class PhaseClock:
    """Seconds per phase, summed over calls, from wrappers put around the timed functions."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def wrap(self, phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            tic = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - tic

        return timed

    @contextmanager
    def patched(self) -> Iterator[None]:
        import importlib

        saved = []
        for phase, targets in PHASES.items():
            for module_name, name in targets:
                module = importlib.import_module(module_name)
                saved.append((module, name, getattr(module, name)))
                setattr(module, name, self.wrap(phase, getattr(module, name)))
        try:
            yield
        finally:
            for module, name, fn in reversed(saved):
                setattr(module, name, fn)


def phase_profile(
    data_dir: Path,
    url: str | None,
    gallery_id: str,
    parts: list[dict[str, bytes]],
    limit: int,
    profile: bool,
) -> dict[str, Any]:
    """The batches' time in-process, by phase (seconds per batch), and cProfile's top functions."""
    import app.db_models  # noqa: F401  (the table registry)
    from app.core.arrays import load_npy_ints, load_npy_strings
    from app.core.db import Database
    from app.core.limits import ArrayLimits
    from app.core.settings import Settings
    from app.galleries.models import Gallery
    from app.migration import access
    from app.vectors.storage import storage_for

    extra = {"database_url": url} if url else {}
    settings = Settings(
        _env_file=None,
        data_dir=data_dir,
        bootstrap_key=BENCH_KEY,
        max_vectors_per_request=limit,
        **extra,
    )
    limits = ArrayLimits.of(settings)
    db = Database(settings)
    clock = PhaseClock()
    total = 0.0
    out: dict[str, Any] = {}
    try:
        with db.sessions() as session:
            gallery = session.get(Gallery, gallery_id)
            assert gallery is not None
            # The gallery's items read once before the clock starts (the server holds them).
            storage_for(session, gallery).lookup(session, gallery, ["item-0"])
            session.commit()

            def upload(part: dict[str, bytes], parse: Callable[..., Any]) -> None:
                ids = parse(load_npy_strings)(part["ids"], "ids", limits)
                counts = parse(load_npy_ints)(part["counts"], "counts", limits)
                gallery = session.get(Gallery, gallery_id)
                access.add_counts(session, settings, gallery, ids, counts, f"p-{uuid.uuid4()}")

            commit = session.commit
            session.commit = clock.wrap("commit", commit)  # type: ignore[method-assign]
            with clock.patched():
                for part in parts:
                    tic = time.perf_counter()
                    upload(part, lambda fn: clock.wrap("parse", fn))
                    total += time.perf_counter() - tic
            session.commit = commit  # type: ignore[method-assign]
            if profile:
                # A second pass of its own: the profiler's overhead stays out of the phases.
                profiler = cProfile.Profile()
                for part in parts:
                    profiler.runcall(upload, part, lambda fn: fn)
                stream = io.StringIO()
                pstats.Stats(profiler, stream=stream).sort_stats("cumulative").print_stats(25)
                out["cprofile"] = stream.getvalue()
    finally:
        db.dispose()
    n = len(parts)
    phases = {name: s / n for name, s in clock.seconds.items()}
    phases["write"] = total / n - sum(phases.values())
    return {"seconds_per_batch": total / n, "phases_s": phases, **out}


def run_database(kind: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Every batch size on one database: a server per limit, one gallery, the uploads, then the
    phase breakdown of the largest batch."""
    ids = item_ids(args.items)
    rows, counts = zipf_rows(args.items, args.rows, args.zipf, args.seed)
    limit = max([DEFAULT_LIMIT, *args.batches])
    out: dict[str, Any] = {"batches": {}}
    data_dir = workdir / kind
    with database(kind, workdir) as url:
        env = {
            "NOBACKFILL_MAX_VECTORS_PER_REQUEST": str(limit),
            "NOBACKFILL_MAX_REQUEST_BYTES": str(256 * 2**20),
        }
        if url:
            env["NOBACKFILL_DATABASE_URL"] = url
        service = start_service(data_dir, env)
        try:
            with service.client() as client:
                gallery_id = create_gallery(
                    service,
                    {"name": "access", "dim": args.dim, "model_name": "bench", "metric": "cosine"},
                )
                seconds = upload_items(client, gallery_id, ids, args.dim, min(limit, 100_000))
                out["items_upload_s"] = seconds
                uploaded_rows, uploaded_counts = [], []
                for size in args.batches:
                    parts = batches(ids, rows, counts, size)
                    times = http_uploads(client, gallery_id, parts)
                    uploaded_rows.append(rows)
                    uploaded_counts.append(counts)
                    out["batches"][str(size)] = {
                        "requests": len(times),
                        "counts_per_s": len(rows) / sum(times),
                        "ms_per_batch_median": float(np.median(times) * 1e3),
                        "distinct_per_batch": float(
                            np.mean(
                                [
                                    len(np.unique(rows[s : s + size]))
                                    for s in range(0, len(rows), size)
                                ]
                            )
                        ),
                    }
                    print(
                        f"{kind} batch {size}: {out['batches'][str(size)]['counts_per_s']:,.0f} counts/s"
                    )
                check_totals(
                    client,
                    gallery_id,
                    np.concatenate(uploaded_rows),
                    np.concatenate(uploaded_counts),
                )
        finally:
            service.stop()
        size = max(args.batches)
        parts = batches(ids, rows, counts, size)[: args.profile_batches]
        out["phases"] = {
            "batch": size,
            **phase_profile(data_dir, url, gallery_id, parts, limit, args.profile),
        }
    return out


def render_markdown(result: dict[str, Any]) -> str:
    lines = [
        f"Command: `{result['command']}` ({result['seconds'] / 60:.1f} min). "
        + facts_markdown(result["machine"], result["load_start"], result["load_end"]),
        "",
        f"One cosine gallery of {result['items']:,} items (dim {result['dim']}, segment files); "
        f"{result['rows']:,} counts per batch size, Zipf-like over the items (exponent "
        f"{result['zipf']}), counts 1–3, uploaded as `.npy` parts (`ids` unicode, `counts` int64) "
        "one batch after another from one client with an Idempotency-Key each; end to end on "
        "loopback, the client encoding excluded. Batches above 10,000 (the default "
        "`max_vectors_per_request`) run with that limit raised.",
        "",
        "| database | batch | counts/s | ms/batch (median) | distinct ids/batch | target 1M/s |",
        "|---|---|---|---|---|---|",
    ]
    for kind, entry in result["databases"].items():
        for size, b in entry["batches"].items():
            rate = b["counts_per_s"]
            verdict = "met" if rate >= TARGET else f"missed ({rate / TARGET:.2f}×)"
            lines.append(
                f"| {kind} | {int(size):,} | {rate:,.0f} | {b['ms_per_batch_median']:.1f} | "
                f"{b['distinct_per_batch']:,.0f} | {verdict} |"
            )
    lines += [
        "",
        "In-process phase breakdown (ms per batch, the largest batch size, server stopped):",
        "",
    ]
    names = sorted({p for e in result["databases"].values() for p in e["phases"]["phases_s"]})
    lines += [
        "| database | batch | " + " | ".join(names) + " | total |",
        "|---|---|" + "---|" * (len(names) + 1),
    ]
    for kind, entry in result["databases"].items():
        ph = entry["phases"]
        cells = " | ".join(f"{ph['phases_s'].get(n, 0.0) * 1e3:.1f}" for n in names)
        lines.append(
            f"| {kind} | {ph['batch']:,} | {cells} | {ph['seconds_per_batch'] * 1e3:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20k items, 40k counts, batch 5k")
    parser.add_argument("--items", type=int, default=None)
    parser.add_argument("--rows", type=int, default=None, help="counts uploaded per batch size")
    parser.add_argument("--batches", type=int, nargs="+", default=None)
    parser.add_argument(
        "--databases", nargs="+", choices=("sqlite", "postgres"), default=["sqlite", "postgres"]
    )
    parser.add_argument("--dim", type=int, default=4)
    parser.add_argument("--zipf", type=float, default=1.1)
    parser.add_argument("--profile-batches", type=int, default=5)
    parser.add_argument(
        "--profile", action="store_true", help="cProfile's top functions in the JSON"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--no-markdown", action="store_true")
    args = parser.parse_args(argv)
    args.items = args.items or (20_000 if args.quick else 1_000_000)
    args.rows = args.rows or (40_000 if args.quick else 2_000_000)
    args.batches = args.batches or ([5_000] if args.quick else [DEFAULT_LIMIT, 100_000])
    load_start = load_average()
    tic = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="nobackfill-bench-access-"))
    try:
        per_db = {kind: run_database(kind, args, workdir) for kind in args.databases}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    result = {
        **run_record(command_line("bench.perf.access_upload", argv), tic, load_start),
        "items": args.items,
        "rows": args.rows,
        "dim": args.dim,
        "zipf": args.zipf,
        "databases": per_db,
    }
    quick_out = REPO_ROOT / "bench/out/access_upload_quick.json"
    out = args.out or (quick_out if args.quick else RESULTS / "access_upload.json")
    section = None if args.no_markdown or args.quick else SECTION
    publish(
        result,
        Path(out),
        render_markdown(result),
        section,
        "Access-count upload (bench.perf.access_upload)",
    )
    return result


if __name__ == "__main__":
    main()
