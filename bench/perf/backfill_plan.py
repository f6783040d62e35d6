"""Backfill planning time on a large gallery: POST /v1/galleries/{id}/backfill-plan end to end.

    python -m bench.perf.backfill_plan            # 1M items, SQLite and PostgreSQL;
                                                  # bench/results/backfill_plan.json and the
                                                  # bench.perf.backfill_plan section of BENCHMARKS.md
    python -m bench.perf.backfill_plan --quick    # 30k items, SQLite, nothing published

The target (issue 25): planning 1M items < 10 s. What is timed is the whole request the user
makes, with every signal the plan reads present, so that every step of the service's plan runs at
scale: the gallery's points read from storage, the learned gain of every item, the access counts
and the returned tally read from SQL, the neighbourhood search (the 256 most clicked items against
the gallery's own index), the 4-split validation of the traffic estimates, the value order, and
the answer (the ids of the asked fraction, as JSON).

Gallery: the WordNet-noun glosses by the old model (MiniLM), tiled with small noise to ``--items``
rows (``bench.common.tiled``: real-data-derived, not real data), written through the stopped
service's own vector storage (``seed_gallery_rows``); item ``w{i}`` is a copy of gloss
``i mod 24,000``. The upgrade: a dataset pairing the first 3,000 items with their gloss by the new
model (MPNet), 1,000 logged queries (lemma by both models, relevant to their own gloss), method
``procrustes`` with the query objective (the plan's speed does not depend on the method; its gain
estimator is fitted on the upgrade's held-out part either way). Then 1 % of the items re-embedded
(their new gloss features), ``--counts`` access counts Zipf-like over the items (as
``bench.perf.access_upload`` draws them), and ``--searches`` old-model searches so that the
returned tally holds entries. The plan is asked ``--repeats`` times for ``--fraction``; the median
is the figure.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.common.machine import facts_markdown, load_average, run_record
from bench.common.report import command_line, publish
from bench.common.service import (
    create_gallery,
    npy_bytes,
    seed_gallery_rows,
    start_service,
)
from bench.common.tiled import tiled
from bench.common.wordnet import NEW_MODEL, OLD_MODEL, REPO_ROOT, load_wordnet
from bench.perf.access_upload import database, zipf_rows

RESULTS = REPO_ROOT / "bench/results"
SECTION = "bench.perf.backfill_plan"
TARGET_S = 10.0
PAIRED = 3_000
LOGGED = 1_000
BATCH = 10_000


def wordnet_arrays() -> dict[str, np.ndarray]:
    """Gloss and lemma rows by both models (24,000 synsets each)."""
    data = load_wordnet(fields=("gloss", "lemma"), models=(OLD_MODEL, NEW_MODEL))
    return {
        f"{field}.{model}": data.get(field, model)
        for field in ("gloss", "lemma")
        for model in (OLD_MODEL, NEW_MODEL)
    }


def post_npy(client: httpx.Client, url: str, parts: dict[str, np.ndarray], **extra: Any) -> Any:
    files: dict[str, Any] = {k: (f"{k}.npy", npy_bytes(v)) for k, v in parts.items()}
    files.update({k: (None, json.dumps(v), "application/json") for k, v in extra.items()})
    response = client.post(url, files=files)
    response.raise_for_status()
    return response.json()


def upgrade(client: httpx.Client, gallery_id: str, arrays: dict[str, np.ndarray]) -> str:
    """A procrustes upgrade with a query log; returns its model id. Fewer synsets than
    ``PAIRED`` (a test's fixture): every one paired, half of them logged."""
    synsets = len(arrays[f"gloss.{NEW_MODEL}"])
    paired, logged = min(PAIRED, synsets), min(LOGGED, synsets // 2)
    ids = np.array([f"w{i}" for i in range(paired)])
    dataset = client.post("/v1/datasets", json={"name": "plan-bench", "gallery_id": gallery_id})
    dataset.raise_for_status()
    dataset_url = f"/v1/datasets/{dataset.json()['id']}"
    post_npy(
        client,
        f"{dataset_url}/items",
        {"ids": ids, "features": arrays[f"gloss.{NEW_MODEL}"][:paired]},
    )
    post_npy(
        client,
        f"{dataset_url}/queries",
        {
            "ids": np.array([f"lemma:{i}" for i in range(logged)]),
            "features": arrays[f"lemma.{NEW_MODEL}"][:logged],
            "old_vectors": arrays[f"lemma.{OLD_MODEL}"][:logged],
        },
        relevant_ids=[[f"w{i}"] for i in range(logged)],
    )
    body = {"dataset_id": dataset.json()["id"], "method": "procrustes", "objective": "query"}
    created = client.post("/v1/upgrades", json=body)
    created.raise_for_status()
    while True:
        job = client.get(f"/v1/upgrades/{created.json()['id']}").json()
        if job["status"] in ("succeeded", "failed", "cancelled"):
            break
        time.sleep(1.0)
    if job["status"] != "succeeded":
        raise RuntimeError(f"upgrade {job['status']}: {job.get('error')}")
    return str(job["model_id"])


def traffic(
    client: httpx.Client,
    gallery_id: str,
    model_id: str,
    arrays: dict[str, np.ndarray],
    args: argparse.Namespace,
) -> dict[str, float]:
    """Re-embedded items, access counts and searches (the returned tally); seconds of each."""
    rng = np.random.default_rng(args.seed)
    url = f"/v1/galleries/{gallery_id}"
    seconds: dict[str, float] = {}
    tic = time.perf_counter()
    reembedded = np.sort(rng.choice(args.items, size=args.items // 100, replace=False))
    gloss_new = arrays[f"gloss.{NEW_MODEL}"]
    for start in range(0, len(reembedded), BATCH):
        rows = reembedded[start : start + BATCH]
        post_npy(
            client,
            f"{url}/vectors",
            {
                "ids": np.array([f"w{i}" for i in rows]),
                "features": gloss_new[rows % len(gloss_new)],
            },
            model_id=model_id,
        )
    seconds["reembed_upload_s"] = time.perf_counter() - tic
    tic = time.perf_counter()
    rows, counts = zipf_rows(args.items, args.counts, args.zipf, args.seed)
    names = np.array([f"w{i}" for i in range(args.items)])
    for start in range(0, len(rows), BATCH):
        post_npy(
            client,
            f"{url}/access",
            {"ids": names[rows[start : start + BATCH]], "counts": counts[start : start + BATCH]},
        )
    seconds["access_upload_s"] = time.perf_counter() - tic
    tic = time.perf_counter()
    lemma_old = arrays[f"lemma.{OLD_MODEL}"]
    asked = rng.choice(len(lemma_old), size=args.searches, replace=False)
    for start in range(0, len(asked), 128):
        response = client.post(
            f"{url}/search",
            json={"vectors": lemma_old[asked[start : start + 128]].tolist(), "k": 10},
        )
        response.raise_for_status()
    seconds["searches_s"] = time.perf_counter() - tic
    return seconds


def time_plans(
    client: httpx.Client, gallery_id: str, model_id: str, fraction: float, repeats: int
) -> tuple[list[float], dict[str, Any]]:
    """Each plan request's seconds (sent to answer read) and the last answer."""
    times, answer = [], {}
    for _ in range(repeats):
        tic = time.perf_counter()
        response = client.post(
            f"/v1/galleries/{gallery_id}/backfill-plan",
            json={"model_id": model_id, "fraction": fraction},
        )
        times.append(time.perf_counter() - tic)
        response.raise_for_status()
        answer = response.json()
    return times, answer


def run_database(
    kind: str, arrays: dict[str, np.ndarray], args: argparse.Namespace, workdir: Path
) -> dict[str, Any]:
    data_dir = workdir / kind
    out: dict[str, Any] = {}
    with database(kind, workdir) as url:
        env = {"NOBACKFILL_DATABASE_URL": url} if url else {}
        tic = time.perf_counter()
        service = start_service(data_dir, env)
        gallery_id = create_gallery(
            service,
            {"name": "plan", "dim": 384, "model_name": OLD_MODEL, "metric": "cosine"},
        )
        service.stop()
        vectors = tiled(arrays[f"gloss.{OLD_MODEL}"], args.items, seed=args.seed)
        names = [f"w{i}" for i in range(args.items)]
        seed_gallery_rows(data_dir, gallery_id, names, vectors, database_url=url)
        del vectors
        service = start_service(data_dir, env)
        out["gallery_setup_s"] = time.perf_counter() - tic
        try:
            with service.client() as client:
                tic = time.perf_counter()
                model_id = upgrade(client, gallery_id, arrays)
                out["upgrade_s"] = time.perf_counter() - tic
                out.update(traffic(client, gallery_id, model_id, arrays, args))
                times, answer = time_plans(
                    client, gallery_id, model_id, args.fraction, args.repeats
                )
        finally:
            service.stop()
    model = (answer.get("access") or {}).get("model") or {}
    out.update(
        {
            "plan_s": times,
            "plan_median_s": float(np.median(times)),
            "planned_ids": len(answer["ids"]),
            "reembedded": answer["reembedded"],
            "total": answer["total"],
            "signals": answer["signals"],
            "traffic_chosen": model.get("chosen"),
            "candidates": [c["name"] for c in model.get("candidates", [])],
            "splits": model.get("splits"),
            "returned_items": (answer.get("search_returned") or {}).get("items"),
        }
    )
    print(f"{kind}: plan of {args.items:,} items {out['plan_median_s']:.2f} s (median)", flush=True)
    return out


def render_markdown(result: dict[str, Any]) -> str:
    lines = [
        f"Command: `{result['command']}` ({result['seconds'] / 60:.1f} min). "
        + facts_markdown(result["machine"], result["load_start"], result["load_end"]),
        "",
        f"`POST /v1/galleries/{{id}}/backfill-plan` for {result['fraction']:.0%} of a cosine "
        f"gallery of {result['items']:,} items (MiniLM glosses tiled with noise: "
        "real-data-derived), end to end on loopback, over one uvicorn worker; 1 % of the items "
        f"re-embedded, {result['counts']:,} access counts (Zipf-like, exponent {result['zipf']}), "
        f"{result['searches']:,} searches tallied. Median of {result['repeats']} requests.",
        "",
        "| database | plan s (median) | each request s | ids answered | signals used | "
        "traffic estimate | target < 10 s |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind, entry in result["databases"].items():
        median = entry["plan_median_s"]
        verdict = "met" if median < TARGET_S else f"missed by {median - TARGET_S:.1f} s"
        each = ", ".join(f"{t:.2f}" for t in entry["plan_s"])
        lines.append(
            f"| {kind} | {median:.2f} | {each} | {entry['planned_ids']:,} | "
            f"{', '.join(entry['signals'])} | `{entry['traffic_chosen']}` of "
            f"{len(entry['candidates'])} candidates, {entry['splits']} splits | {verdict} |"
        )
    lines += [
        "",
        "Setup per database (not timed against the target): "
        + "; ".join(
            f"{kind}: gallery written {e['gallery_setup_s']:.0f} s, upgrade {e['upgrade_s']:.0f} s, "
            f"re-embedded upload {e['reembed_upload_s']:.0f} s, access upload "
            f"{e['access_upload_s']:.0f} s, searches {e['searches_s']:.0f} s"
            for kind, e in result["databases"].items()
        )
        + ".",
    ]
    return "\n".join(lines) + "\n"


def main(
    argv: Sequence[str] | None = None, arrays: dict[str, np.ndarray] | None = None
) -> dict[str, Any]:
    """``arrays``: gloss/lemma rows by both models, keyed ``"<field>.<model>"`` (default: the
    WordNet-noun data); the tests pass the small fixture's."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="30k items, SQLite only")
    parser.add_argument("--items", type=int, default=None)
    parser.add_argument("--counts", type=int, default=None)
    parser.add_argument("--searches", type=int, default=None)
    parser.add_argument("--fraction", type=float, default=0.1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--zipf", type=float, default=1.1)
    parser.add_argument("--databases", nargs="+", choices=("sqlite", "postgres"), default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--no-markdown", action="store_true")
    parser.add_argument(
        "--keep", type=Path, default=None, help="build the data dirs here and keep them"
    )
    args = parser.parse_args(argv)
    args.items = args.items or (30_000 if args.quick else 1_000_000)
    args.counts = args.counts or (60_000 if args.quick else 2_000_000)
    args.searches = args.searches or (256 if args.quick else 1_024)
    args.databases = args.databases or (["sqlite"] if args.quick else ["sqlite", "postgres"])
    load_start = load_average()
    tic = time.perf_counter()
    arrays = arrays if arrays is not None else wordnet_arrays()
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="nobackfill-bench-plan-"))
    try:
        per_db = {kind: run_database(kind, arrays, args, workdir) for kind in args.databases}
    finally:
        if args.keep is None:
            shutil.rmtree(workdir, ignore_errors=True)
    result = {
        **run_record(command_line("bench.perf.backfill_plan", argv), tic, load_start),
        "items": args.items,
        "counts": args.counts,
        "searches": args.searches,
        "fraction": args.fraction,
        "repeats": args.repeats,
        "zipf": args.zipf,
        "databases": per_db,
    }
    quick_out = REPO_ROOT / "bench/out/backfill_plan_quick.json"
    out = args.out or (quick_out if args.quick else RESULTS / "backfill_plan.json")
    section = None if args.no_markdown or args.quick else SECTION
    publish(
        result,
        out,
        render_markdown(result),
        section,
        "Backfill planning time (bench.perf.backfill_plan)",
    )
    return result


if __name__ == "__main__":
    main()
