"""Speed of mixed and transition search (partial backfill) against a plain search of the same
gallery at the same k (issue 29, item 7: ≤ 1.5× at 100k rows, 25 % re-embedded, batches 1 and 256).

    python -m bench.perf.mixed_search          # 100k rows, batches 1 and 256, k 10, 25 % re-embedded:
                                               # bench/results/mixed_search.json and the
                                               # bench.perf.mixed_search section of BENCHMARKS.md
    python -m bench.perf.mixed_search --quick  # a 20k gallery, few rounds (about a minute):
                                               # bench/results/mixed_search-quick.json only
    python -m bench.perf.mixed_search --profile  # also cProfile the mixed and transition paths

Everything runs in this process through the service's own search function
(``app.search.service.search_gallery``), on the state the app's lifespan builds (a SQLite file in a
temporary data directory, the ``IndexStore``, the ``ModelCache``), one database session per call
as a request gets; the HTTP layer is left out (``bench.perf.search`` times it).

Gallery: the WordNet-noun MiniLM rows (gloss and lemma of 24,000 synsets, 48,000 real rows) tiled
with noise of norm 0.1 to N rows (``bench.common.tiled``), uploaded as a cosine gallery. Each
item's new-backbone features are the MPNet rows tiled the same way. A dataset pairs the first
min(N, 8,000) items with their MPNet features (``--pairs``), and two upgrades on it train the same
``procrustes`` backbone model through the service's own job (inline runner): the *mixed* model,
for which a seeded random ``fraction`` of the items is re-embedded
(``app.migration.reembed.store_reembedded``), and the *bridge* model, for which nothing is. One
gallery, one index, so every engine scans the same rows. Queries: MPNet (``features``) and MiniLM
(old-space ``vectors`` / ``old_vectors``) rows of the same WordNet texts.

Engines, interleaved round by round in a fresh random order (contention from other processes falls
on all alike), each on the same query rows:
- ``plain``: ``vectors`` = the old model's vectors, no model (the gallery's own search);
- ``bridged``: ``features`` + the bridge model (nothing re-embedded: the bridge alone);
- ``mixed``: ``features`` + the mixed model (the fraction re-embedded);
- ``transition``: ``features`` + ``old_vectors`` + the mixed model.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from fastapi.testclient import TestClient
from sqlalchemy import select

from app.core.settings import Settings
from app.galleries.models import Gallery
from app.galleries.service import get_gallery
from app.main import create_app
from app.migration.reembed import store_reembedded
from app.models.service import get_model
from app.search.service import SearchQuery, search_gallery
from bench.common.machine import facts_markdown, load_average, run_record, source_state
from bench.common.report import command_line, publish
from bench.common.service import BENCH_KEY, npy_bytes
from bench.common.tiled import DEFAULT_NOISE, tiled, wordnet_rows
from bench.common.wordnet import NEW_MODEL, OLD_MODEL, REPO_ROOT
from bench.perf.search import percentile_ms, run_rounds

RESULTS = REPO_ROOT / "bench/results"
SECTION = "bench.perf.mixed_search"
TITLE = "Mixed and transition search speed (bench.perf.mixed_search)"
ENGINES = ("plain", "bridged", "mixed", "transition")
COMPARED = ("bridged", "mixed", "transition")
TARGET = 1.5  # issue 29, item 7: mixed and transition ≤ 1.5× plain
# Dataset items the upgrades train on (at most the gallery's size). A search's cost does not depend
# on it (the backfill fit's reference sample is REFERENCE_SIZE = 2,048 pairs either way), and one
# procrustes upgrade job takes about 8 s at 8,000 pairs, 40 s at 20,000 on a 2-core machine.
PAIRS = 8_000


@dataclass
class Setup:
    client: TestClient
    settings: Settings
    gallery_id: str
    tenant_id: str
    mixed_model: str  # ``fraction`` of the items re-embedded for it
    bridge_model: str  # nothing re-embedded for it
    reembedded: int
    seconds: dict[str, float]

    @property
    def state(self):
        return self.client.app.state.service


def _ok(response, status: int = 200) -> dict[str, Any]:
    if response.status_code != status:
        raise RuntimeError(f"{response.request.url}: {response.status_code} {response.text[:500]}")
    return response.json()


def _part(array: np.ndarray) -> tuple[str, bytes, str]:
    return ("part.npy", npy_bytes(array), "application/octet-stream")


def build(data_dir: Path, size: int, rows, fraction: float, seed: int, pairs: int) -> Setup:
    """The gallery, its dataset, two procrustes upgrades and the re-embedded items (the setup's
    client is left open: the caller closes it)."""
    settings = Settings(
        _env_file=None,
        data_dir=data_dir,
        job_runner="inline",
        bootstrap_key=BENCH_KEY,
        local_key=False,
        log_level="warning",
    )
    client = TestClient(create_app(settings), raise_server_exceptions=True)
    client.__enter__()
    client.headers["Authorization"] = f"Bearer {BENCH_KEY}"
    try:
        return _populate(client, settings, size, rows, fraction, seed, pairs)
    except BaseException:
        client.__exit__(None, None, None)
        raise


def _populate(
    client: TestClient, settings: Settings, size: int, rows, fraction: float, seed: int, pairs: int
) -> Setup:
    seconds: dict[str, float] = {}
    chunk = settings.max_vectors_per_request
    ids = np.array([f"w{i}" for i in range(size)])
    old = tiled(rows.old, size, seed=seed)
    new = tiled(rows.new, size, seed=seed + 1)

    tic = time.perf_counter()
    gallery_id = _ok(
        client.post(
            "/v1/galleries",
            json={
                "name": "bench",
                "dim": old.shape[1],
                "model_name": OLD_MODEL,
                "metric": "cosine",
            },
        ),
        201,
    )["id"]
    for start in range(0, size, chunk):
        part = slice(start, start + chunk)
        _ok(
            client.post(
                f"/v1/galleries/{gallery_id}/vectors",
                files={"ids": _part(ids[part]), "vectors": _part(old[part])},
            )
        )
    seconds["upload"] = time.perf_counter() - tic

    tic = time.perf_counter()
    n_pairs = min(size, pairs)
    dataset_id = _ok(
        client.post("/v1/datasets", json={"name": "bench-mpnet", "gallery_id": gallery_id}), 201
    )["id"]
    for start in range(0, n_pairs, chunk):
        part = slice(start, min(n_pairs, start + chunk))
        _ok(
            client.post(
                f"/v1/datasets/{dataset_id}/items",
                files={"ids": _part(ids[part]), "features": _part(new[part])},
            )
        )
    seconds["dataset"] = time.perf_counter() - tic

    models = []
    for _ in range(2):
        tic = time.perf_counter()
        created = _ok(
            client.post("/v1/upgrades", json={"dataset_id": dataset_id, "method": "procrustes"}),
            202,
        )
        job = _ok(client.get(f"/v1/upgrades/{created['id']}"))
        if job["status"] != "succeeded":
            raise RuntimeError(f"upgrade {job['id']}: {job['status']} {job.get('error')}")
        models.append(job["model_id"])
        seconds["upgrades"] = seconds.get("upgrades", 0.0) + time.perf_counter() - tic

    state = client.app.state.service
    tic = time.perf_counter()
    chosen = np.sort(
        np.random.default_rng(seed + 2).choice(size, round(fraction * size), replace=False)
    )
    with state.db.sessions() as session:
        gallery = session.scalar(select(Gallery).where(Gallery.id == gallery_id))
        tenant_id = gallery.tenant_id
        row = get_model(session, tenant_id, models[0])
        for start in range(0, len(chosen), chunk):
            picked = chosen[start : start + chunk]
            gallery = get_gallery(session, tenant_id, gallery_id)
            store_reembedded(
                session, settings, state.indexes, gallery, row, ids[picked].tolist(), new[picked]
            )
    seconds["reembed"] = time.perf_counter() - tic
    # Nothing left for the background flush to write while the rounds run.
    state.indexes.flush()
    return Setup(
        client, settings, gallery_id, tenant_id, models[0], models[1], len(chosen), seconds
    )


def searcher(setup: Setup, requests: list[SearchQuery]) -> Callable[[int], list]:
    """Round r's search as the endpoint runs it: a session, the gallery row, search_gallery."""
    state = setup.state

    def call(r: int) -> list:
        with state.db.sessions() as session:
            try:
                gallery = get_gallery(session, setup.tenant_id, setup.gallery_id)
                return search_gallery(
                    session,
                    state.settings,
                    state.indexes,
                    state.models,
                    setup.tenant_id,
                    gallery,
                    requests[r],
                )
            finally:
                session.rollback()

    return call


def engines_for(
    setup: Setup, features: list[np.ndarray], old: list[np.ndarray], k: int
) -> dict[str, Callable[[int], list]]:
    def query(vectors, feats, old_vectors, model_id) -> list[SearchQuery]:
        return [
            SearchQuery.build(
                None if vectors is None else vectors[r],
                None if feats is None else feats[r],
                None if old_vectors is None else old_vectors[r],
                k,
                model_id,
                None,
            )
            for r in range(len(features))
        ]

    return {
        "plain": searcher(setup, query(old, None, None, None)),
        "bridged": searcher(setup, query(None, features, None, setup.bridge_model)),
        "mixed": searcher(setup, query(None, features, None, setup.mixed_model)),
        "transition": searcher(setup, query(None, features, old, setup.mixed_model)),
    }


def rounds_for(size: int, batch: int, quick: bool) -> int:
    if quick:
        return 5
    work = size * batch
    if work <= 100_000 * 16:
        return 60
    if work <= 100_000 * 256:
        return 25
    return 8


def summarise(times: list[float], batch: int) -> dict[str, Any]:
    return {
        "calls": len(times),
        "median_ms": percentile_ms(times, 50),
        "p90_ms": percentile_ms(times, 90),
        "queries_per_s": batch / float(np.median(times)),
    }


def hit_ids(results: list) -> list[list[str]]:
    return [[hit["id"] for hit in row] for row in results]


def checks(
    setup: Setup, features: list[np.ndarray], old: list[np.ndarray], k: int, rounds: int
) -> dict[str, Any]:
    """What the timed searches return, on a few of the rounds' query batches: the transition
    search with nothing re-embedded (the bridge model) against the plain search (the same ids,
    every hit ``space: old``), and the share of hits scored natively in the mixed gallery."""
    n = min(rounds, 3)
    zero = engines_for(setup, features, old, k)
    zero["transition_0"] = searcher(
        setup,
        [
            SearchQuery.build(None, features[r], old[r], k, setup.bridge_model, None)
            for r in range(n)
        ],
    )
    plain = [zero["plain"](r) for r in range(n)]
    at_zero = [zero["transition_0"](r) for r in range(n)]
    mixed = [zero["mixed"](r) for r in range(n)]
    transition = [zero["transition"](r) for r in range(n)]

    def new_share(results: list[list]) -> float:
        hits = [h for res in results for row in res for h in row]
        return sum(h.get("space") == "new" for h in hits) / max(len(hits), 1)

    full = all(len(row) == k for res in (*plain, *mixed, *transition) for row in res)
    return {
        "transition_at_0_ids_equal_plain": all(
            hit_ids(a) == hit_ids(b) for a, b in zip(at_zero, plain, strict=True)
        ),
        "transition_at_0_all_old": all(
            h.get("space") == "old" for res in at_zero for row in res for h in row
        ),
        "every_row_has_k_hits": full,
        "mixed_new_share": new_share(mixed),
        "transition_new_share": new_share(transition),
    }


def profile_calls(
    fn: Callable[[int], object], calls: int, rounds: int, top: int = 20
) -> dict[str, Any]:
    """cProfile of ``calls`` calls (round r's queries for the r-th, cycling over ``rounds``): the functions with the most own time and the service's own
    functions (app/) with the most cumulative time, as shares of the profiled wall time."""
    profiler = cProfile.Profile()
    tic = time.perf_counter()
    profiler.enable()
    for r in range(calls):
        fn(r % rounds)
    profiler.disable()
    wall = time.perf_counter() - tic
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]

    def name(key: tuple[str, int, str]) -> str:
        path, line, func = key
        if path == "~":
            return func
        try:
            path = str(Path(path).resolve().relative_to(REPO_ROOT))
        except ValueError:
            path = "/".join(Path(path).parts[-2:])
        return f"{path}:{line}({func})"

    def entry(key, value) -> dict[str, Any]:
        _, ncalls, own, cumulative, _ = value
        return {
            "function": name(key),
            "calls_per_search": ncalls / calls,
            "own_share": own / wall,
            "cumulative_share": cumulative / wall,
            "own_ms_per_search": own / calls * 1e3,
        }

    by_own = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    own_app = [
        kv
        for kv in sorted(stats.items(), key=lambda kv: -kv[1][3])
        if str(REPO_ROOT / "app") in str(Path(kv[0][0]).resolve())
    ][:top]
    return {
        "calls": calls,
        "wall_ms_per_search": wall / calls * 1e3,
        "by_own_time": [entry(k, v) for k, v in by_own],
        "app_by_cumulative_time": [entry(k, v) for k, v in own_app],
    }


def bench_size(
    size: int,
    batches: Sequence[int],
    rows,
    k: int,
    fraction: float,
    quick: bool,
    rounds_override: int | None,
    profile: bool,
    seed: int,
    device: torch.device,
    pairs: int = PAIRS,
) -> dict[str, Any]:
    print(f"— gallery of {size:,} rows, {fraction:.0%} re-embedded", flush=True)
    data_dir = Path(tempfile.mkdtemp(prefix="nobackfill-bench-mixed-"))
    tic = time.perf_counter()
    setup = None
    try:
        setup = build(data_dir, size, rows, fraction, seed, pairs)
        result: dict[str, Any] = {
            "size": size,
            "fraction": fraction,
            "reembedded": setup.reembedded,
            "pairs": min(size, pairs),
            "setup_s": {**setup.seconds, "total": time.perf_counter() - tic},
            "batches": {},
        }
        print(
            "  setup " + ", ".join(f"{name} {s:.1f} s" for name, s in result["setup_s"].items()),
            flush=True,
        )
        rng = np.random.default_rng(seed + 3)
        for batch in batches:
            rounds = rounds_override or rounds_for(size, batch, quick)
            picks = [rng.integers(0, len(rows.new), batch) for _ in range(rounds)]
            features = [np.ascontiguousarray(rows.new[p], dtype=np.float32) for p in picks]
            old = [np.ascontiguousarray(rows.old[p], dtype=np.float32) for p in picks]
            engines = engines_for(setup, features, old, k)
            # run_rounds warms every engine up once (the mixed model's backfill fit is fitted and
            # stored on its first search, and its re-embedded features read into memory).
            times = run_rounds(engines, rounds, seed + batch, device)
            entry: dict[str, Any] = {"rounds": rounds}
            entry.update({name: summarise(times[name], batch) for name in ENGINES})
            plain = np.asarray(times["plain"])
            for name in COMPARED:
                entry[f"{name}_vs_plain"] = entry[name]["median_ms"] / entry["plain"]["median_ms"]
                entry[f"{name}_vs_plain_p90"] = entry[name]["p90_ms"] / entry["plain"]["p90_ms"]
                # The same round's calls against each other (each round's contention shared).
                entry[f"{name}_vs_plain_paired_median"] = float(
                    np.median(np.asarray(times[name]) / plain)
                )
            entry["checks"] = checks(setup, features, old, k, rounds)
            if profile:
                calls = max(3, min(rounds, 2_000 // batch))
                entry["profile"] = {
                    name: profile_calls(engines[name], calls, rounds)
                    for name in ("mixed", "transition")
                }
            result["batches"][str(batch)] = entry
            line = ", ".join(
                f"{name} {entry[name]['median_ms']:.1f} ms (p90 {entry[name]['p90_ms']:.1f})"
                for name in ENGINES
            )
            ratios = ", ".join(f"{n} ÷ plain {entry[f'{n}_vs_plain']:.2f}" for n in COMPARED)
            print(f"  batch {batch} ({rounds} rounds): {line}; {ratios}", flush=True)
            print(f"  checks: {entry['checks']}", flush=True)
            if profile:
                for name, prof in entry["profile"].items():
                    print(f"  profile {name} ({prof['wall_ms_per_search']:.1f} ms/search):")
                    for e in prof["by_own_time"][:12]:
                        print(
                            f"    own {e['own_share']:6.1%} cum {e['cumulative_share']:6.1%} "
                            f"{e['calls_per_search']:8.1f}×  {e['function']}"
                        )
    finally:
        if setup is not None:
            setup.client.__exit__(None, None, None)
        shutil.rmtree(data_dir, ignore_errors=True)
    return result


def verdict(value: float) -> str:
    if value <= TARGET:
        return f"met ({TARGET - value:.2f}× to spare)"
    return f"missed by {value - TARGET:.2f}×"


def render_markdown(result: dict[str, Any]) -> str:
    lines = [
        f"Command: `{result['command']}` ({result['seconds'] / 60:.1f} min). "
        + facts_markdown(result["machine"], result["load_start"], result["load_end"]),
        "",
        "In-process through the service's own `search_gallery` (one database session per call, "
        "SQLite, the app's `IndexStore` and `ModelCache`; no HTTP). Gallery: the 48,000 real "
        "WordNet-noun MiniLM rows tiled with Gaussian noise of norm "
        f"{result['noise']} to N rows — real-data-derived, not real data — as a cosine gallery; "
        "each item's new features are the MPNet rows tiled the same way. Two `procrustes` "
        "backbone models trained by the service's upgrade job on the first "
        f"{result['sizes'][0]['pairs']:,} items' pairs: one with a seeded random share of the items re-embedded "
        "(`store_reembedded`), one with none. Queries: MPNet and MiniLM rows of the same "
        f"WordNet texts, k = {result['k']}. Engines interleaved round by round in random "
        "order: `plain` = old-space `vectors`, no model; `bridged` = `features` + the model "
        "with nothing re-embedded; `mixed` = `features` + the model with the share re-embedded; "
        "`transition` = `features` + `old_vectors` + that model. Ratios: median ÷ plain's "
        "median (p90 ÷ p90 beside).",
        "",
    ]
    source = result.get("source", {})
    if source.get("commit"):
        changed = len(source.get("app_changed", []))
        lines += [
            f"Code: commit `{source['commit'][:10]}`"
            + (
                f" with uncommitted changes to {changed} app/ files (listed in the JSON)."
                if changed
                else "."
            )
            + "",
            "",
        ]
    cores = result["machine"]["cores"] or 1
    if max(result["load_start"][0], result["load_end"][0]) > cores:
        lines += [
            f"The machine was shared: a 1-min load average above its {cores} cores. Absolute "
            "times are inflated by the contention; the engines shared it round by round, so the "
            "ratios are the figures to read.",
            "",
        ]
    for size in result["sizes"]:
        lines += [
            f"**N = {size['size']:,}**, {size['reembedded']:,} items ({size['fraction']:.0%}) "
            f"re-embedded (setup {size['setup_s']['total']:.0f} s).",
            "",
            "| batch | engine | median ms | p90 ms | queries/s | ÷ plain (median) | ÷ plain (p90) |",
            "|---|---|---|---|---|---|---|",
        ]
        for batch, e in size["batches"].items():
            for name in ENGINES:
                ratio = "—" if name == "plain" else f"{e[f'{name}_vs_plain']:.2f}"
                ratio90 = "—" if name == "plain" else f"{e[f'{name}_vs_plain_p90']:.2f}"
                lines.append(
                    f"| {batch} | {name} | {e[name]['median_ms']:.1f} | {e[name]['p90_ms']:.1f} "
                    f"| {e[name]['queries_per_s']:.0f} | {ratio} | {ratio90} |"
                )
        lines.append("")
        for batch, e in size["batches"].items():
            for name in ("mixed", "transition"):
                value = e[f"{name}_vs_plain"]
                lines.append(
                    f"- N {size['size']:,}, batch {batch}: {name} ÷ plain {value:.2f} "
                    f"(target ≤ {TARGET}×) — {verdict(value)}"
                )
            c = e["checks"]
            lines.append(
                f"- N {size['size']:,}, batch {batch}: transition at 0 % re-embedded returns the "
                f"plain search's ids: {c['transition_at_0_ids_equal_plain']}; hits scored "
                f"natively: mixed {c['mixed_new_share']:.0%}, transition "
                f"{c['transition_new_share']:.0%}"
            )
        profiled = [(b, e["profile"]) for b, e in size["batches"].items() if "profile" in e]
        if profiled:
            lines += ["", "Where the time goes (cProfile, own time as a share of the call):", ""]
            for batch, prof in profiled:
                for name, p in prof.items():
                    top = "; ".join(
                        f"{x['function'].split('/')[-1]} {x['own_share']:.0%}"
                        for x in p["by_own_time"][:5]
                    )
                    lines.append(f"- batch {batch}, {name}: {top}")
        lines.append("")
    lines.append(
        "Reading it: a mixed or transition search is a scan of the items not re-embedded (the "
        "flat scan skips the re-embedded ones: FAISS's through a bitmap selector, torch's over "
        "a copy of the other rows made once per set of re-embedded items and state of the "
        "gallery, up to `COMPACT_SCAN_BYTES` = 1 GiB; a copy larger than that, or a set under "
        "10 % of the rows, is scanned whole with the re-embedded rows biased to −inf) plus an "
        "exact scan of the re-embedded items' new features (MPNet, 768 dimensions, against the "
        "gallery's 384), the two reference tails (2,048 documents per space, normalised and "
        "lifted once per gallery and model, scored by torch like the scans) and the merge. At "
        "25 % re-embedded the first scan multiplies three quarters of the plain scan's rows and "
        "the second about half its multiply-adds, so about 1.25× is the floor of this design; "
        "what is left above it is the reference tails, the merge and the query for the "
        "re-embedded features' version (their in-memory copy is read again only after a write). "
        "Galleries whose index cannot skip rows (HNSW, IVF, Milvus) fetch the items not "
        "re-embedded with room for the re-embedded share and search again only the queries "
        "still short of k."
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a 20k gallery, 5 rounds")
    parser.add_argument("--sizes", type=int, nargs="+", default=None)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 256])
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--fraction", type=float, default=0.25, help="share re-embedded")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per batch (all sizes)")
    parser.add_argument(
        "--pairs", type=int, default=PAIRS, help="dataset items the upgrades train on (≤ N)"
    )
    parser.add_argument(
        "--profile", action="store_true", help="cProfile the mixed and transition searches"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--no-markdown", action="store_true")
    parser.add_argument("--section", default=SECTION)
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    sizes = args.sizes or ([20_000] if args.quick else [100_000])
    load_start = load_average()
    tic = time.perf_counter()
    rows = wordnet_rows()
    results = [
        bench_size(
            size,
            args.batches,
            rows,
            args.k,
            args.fraction,
            args.quick,
            args.rounds,
            args.profile,
            args.seed,
            device,
            args.pairs,
        )
        for size in sizes
    ]
    result = {
        **run_record(command_line("bench.perf.mixed_search", argv), tic, load_start),
        "device": str(device),
        "noise": DEFAULT_NOISE,
        "k": args.k,
        "target_ratio": TARGET,
        "old_model": OLD_MODEL,
        "new_model": NEW_MODEL,
        "source": source_state(),
        "sizes": results,
    }
    out = args.out or RESULTS / ("mixed_search-quick.json" if args.quick else "mixed_search.json")
    section = None if (args.no_markdown or args.quick) else args.section
    publish(result, Path(out), render_markdown(result), section, TITLE)
    return result


if __name__ == "__main__":
    main()
