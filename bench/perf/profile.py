"""Where the server spends its time: py-spy samples a uvicorn server during one workload.

    python -m bench.perf.profile ingest --rows 100000 --batch 10000
    python -m bench.perf.profile search --rows 100000 --batch 256

Writes the collapsed stacks (``bench/results/profile_<workload>.txt``, flame-graph input) and
prints the functions under ``app/`` with the largest share of samples (inclusive: a function's
own time and its callees'). py-spy is in the dev extras; it needs permission to read the server's
memory (root, or ptrace allowed).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bench.common.service import create_gallery, npy_bytes, start_service
from bench.common.tiled import tiled, wordnet_rows
from bench.common.wordnet import REPO_ROOT

RESULTS = REPO_ROOT / "bench/results"


def top_functions(collapsed: Path, prefix: str = "app/", most: int = 20) -> list[tuple[str, float]]:
    """(function, share of all samples) for frames whose file lies under ``prefix``."""
    inclusive: Counter[str] = Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        samples = int(count)
        total += samples
        seen = set()
        for frame in stack.split(";"):
            if prefix in frame and frame not in seen:
                seen.add(frame)
                inclusive[frame] += samples
    return [(frame, n / max(total, 1)) for frame, n in inclusive.most_common(most)]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", choices=("ingest", "search"))
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    args = parser.parse_args(argv)
    vectors = tiled(wordnet_rows(with_new=False).old, args.rows)
    workdir = Path(tempfile.mkdtemp(prefix="nobackfill-profile-"))
    service = start_service(workdir)
    out = RESULTS / f"profile_{args.workload}.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        gallery_id = create_gallery(
            service,
            {"name": "p", "dim": vectors.shape[1], "model_name": "m", "metric": "cosine"},
        )
        with service.client() as client:
            upload_url = f"/v1/galleries/{gallery_id}/vectors"
            search_url = f"/v1/galleries/{gallery_id}/search"

            def upload(start: int, stop: int) -> None:
                ids = np.array([f"w{i}" for i in range(start, stop)])
                files = {
                    "ids": ("ids.npy", npy_bytes(ids), "application/octet-stream"),
                    "vectors": (
                        "v.npy",
                        npy_bytes(vectors[start:stop]),
                        "application/octet-stream",
                    ),
                }
                client.post(upload_url, files=files).raise_for_status()

            if args.workload == "search":
                for start in range(0, args.rows, 10_000):
                    upload(start, min(args.rows, start + 10_000))
            spy = subprocess.Popen(
                [
                    str(Path(sys.executable).parent / "py-spy"),
                    "record",
                    "--pid",
                    str(service.process.pid),
                    "--rate",
                    str(args.rate),
                    "--format",
                    "raw",
                    "--output",
                    str(out),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(1.0)  # py-spy attaches
            tic = time.perf_counter()
            if args.workload == "ingest":
                for start in range(0, args.rows, args.batch):
                    upload(start, min(args.rows, start + args.batch))
            else:
                queries = vectors[: args.batch * 5]
                for r in range(5):
                    body = npy_bytes(queries[r * args.batch : (r + 1) * args.batch])
                    client.post(
                        search_url,
                        params={"k": 10},
                        content=body,
                        headers={"Content-Type": "application/x-npy"},
                    ).raise_for_status()
            seconds = time.perf_counter() - tic
            spy.send_signal(2)  # SIGINT: py-spy writes its output and exits
            spy.wait(timeout=60)
    finally:
        service.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"{args.workload}: {seconds:.1f} s; collapsed stacks in {out}")
    for frame, share in top_functions(out):
        print(f"{share:6.1%}  {frame}")
    print(json.dumps({"workload": args.workload, "rows": args.rows, "batch": args.batch}))


if __name__ == "__main__":
    main()
