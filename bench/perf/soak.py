"""Soak under hostile load: two tenants upload, search and train upgrades while hostile clients
stall, trickle, oversize and forge their requests, flood the job queue and (in a second phase)
wedge the database, for a fixed time, against a real uvicorn server on loopback that the script
starts and stops itself.

    python -m bench.perf.soak            # both phases: bench/results/soak.json and its section
    python -m bench.perf.soak --quick    # short phases, nothing published (bench/out/soak_quick.json)

Two phases, one after the other, each with a server of its own and the same clients:
``embedded`` (SQLite, as the service runs by default) and ``postgresql`` (a fresh database on the
local server, dropped after, reached through a TCP proxy, ``bench.common.fault_proxy``, that is
frozen ``--wedges`` times for ``--wedge-s`` seconds while the load runs: connections stay open,
nothing answers). ``--phases`` picks one.

Checks per phase (``bench.perf.soak_checks.evaluate``; exit status 1 when one fails): no 5xx,
seen by the clients or counted by the server's /metrics, other than a 503 with Retry-After
answered inside a wedge window or within its grace (the longest the configured database
timeouts let a request wait: the pool's wait, then a ping and a reconnect or one read); every
healthy request gets its expected status (or such a 503); every hostile one answered as it
should be (``HOSTILE_EXPECTED``: its 4xx; the streamed big search 200; the flood 202 until its
cap, then 429); every id acknowledged with a 2xx reads back through the API with the vector last
sent for it (or one sent after it without a clear answer), live and after a restart, and each
gallery's count is the number of those ids (no refused write was stored); each healthy kind's
p99 latency, outside the wedge windows, under ``--p99-bound-ms``; every healthy upgrade that
started did so within ``--job-start-bound-s`` of its creation while the flood's tenant held its
slot, and every one ends succeeded or cancelled; the flood's tenant was refused (429) and ran a
job at the end, and its jobs, cancelled then, all end cancelled; after each wedge uploads and
searches succeed again; the server's VmRSS (sampled every 0.25 s while the load runs) under its
value at the load's start + ``--rss-headroom-mib``; no traceback in the server log.

Issue 45's hostile clients: JSON searches of 1,000 queries × k = 1,000 (over
MAX_HITS_PER_REQUEST: 422), the same search asked for as NDJSON (streamed in chunks: 200 with its
``done`` line, read to the end; a few, one at a time, on the first tenant's gallery), bodies under
a junk key that promise 8 MiB and send 32 KiB (401, or 429 once throttled, from the headers),
connections that trickle header bytes and never end them (408 after HEADER_TIMEOUT_S, 431, or
closed), a tenant that keeps the job queue full of the longest upgrades the server accepts (every
parameter the server caps at the maximum its ``/v1/upgrades/methods`` advertises), and the wedged
database. The server runs as ``nobackfill serve`` runs it (uvicorn with the bounded-headers
protocol of ``app.api.http_protocol``), not as the plain ``uvicorn`` command, with two job slots
(``NOBACKFILL_JOB_THREADS=2``: with one, a running job of the flood holds the only slot and no
fairness can start another tenant's job before it ends).

Rows are the committed 800-synset WordNet-noun fixture's MiniLM rows (gloss and lemma), each
drawn at random plus noise of norm 0.1; the upgrades pair 200 synsets' MiniLM gloss rows with
their mpnet gloss rows (``procrustes`` for the healthy tenants). The hostile clients' connections
are raw sockets (``bench.perf.soak_clients``); the wrong keys come from 127.0.0.3, so the
per-address throttle they trip does not hold back the healthy clients on 127.0.0.1. Client and
server share the machine's cores.

This module is the command; a phase is ``bench.perf.soak_phase``'s, its server and tenants
``bench.perf.soak_setup``'s, its load ``bench.perf.soak_load``'s, the checks and records
``bench.perf.soak_checks``' and the BENCHMARKS.md section ``bench.perf.soak_report``'s.
"""

from __future__ import annotations

import argparse
import json
import shlex
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common.machine import load_average, machine_facts
from bench.common.report import command_line, publish
from bench.common.wordnet import REPO_ROOT
from bench.perf.soak_load import (
    BIG_K,
    BIG_ROWS,
    FLOOD_RETRY_S,
    HOSTILE_ADDRESS,
    JUNK_CLAIMED,
    JUNK_SENT,
    RSS_HEADROOM_MIB,
    SLOWLORIS_INTERVAL_S,
    STREAMED_FIRST_S,
    STREAMED_INTERVAL_S,
    WEDGE_S,
    wedge_starts,
)
from bench.perf.soak_phase import run_phase
from bench.perf.soak_report import render_markdown
from bench.perf.soak_setup import JOB_ITEMS, fixture_rows

SECTION = "bench.perf.soak"
TITLE = "Soak under hostile load (bench.perf.soak)"
PHASES = ("embedded", "postgresql")
# The first 60 s run here measured a worst-kind p99 of 1.24 s (upload_json) while other
# engineers' tests shared the 2 cores (load average 2.3 → 5.5): the bound leaves ~2.4× headroom.
P99_BOUND_MS = 3000.0
BOUND_NOTE = (
    "The p99 bound was set after a first 60 s run on this machine measured a worst-kind p99 of "
    "1.24 s (upload_json) with other engineers' tests on the same 2 cores (load average 2.3 at "
    "the start, 5.5 at the end): about 2.4× headroom. `tests/service/test_soak.py` runs "
    "`--quick` and holds it to 5 s (CI machines are slower and busier)."
)
# From a healthy upgrade's creation to its start (the server's timestamps), outside the wedges.
# Set after the first run (under a provisional 30 s) measured a longest wait of about 4 s (the
# two healthy tenants share the slot the flood leaves, and a procrustes job takes seconds on
# the loaded cores): 2.5× headroom. That run's figures are kept in the results file
# (``job_start_first_run``, carried from one run's results to the next; delete it to record a
# new one) and rendered from there.
JOB_START_BOUND_S = 10.0
# Options naming a path on the machine that ran the soak, which change none of its figures: the
# recorded (and published) command leaves them out.
LOCAL_OPTIONS = ("--log-dir",)


def recorded_command(argv: Sequence[str] | None) -> str:
    """The command of a run as its results record it: without ``LOCAL_OPTIONS``."""
    return command_line(SECTION, argv, local=LOCAL_OPTIONS)


def first_run(out: Path, phases: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """The run the job-start bound was set after: carried from the results file this run
    replaces when it names one, else this run (then the first)."""
    try:
        carried = json.loads(out.read_text()).get("job_start_first_run")
    except (OSError, ValueError):
        carried = None
    if carried:
        # Recorded before the command left out machine-local options: recorded again as now,
        # from its arguments (what follows "python -m bench.perf.soak").
        return {**carried, "command": recorded_command(shlex.split(carried["command"])[3:])}
    return {
        "date": result["machine"]["date"],
        "command": result["command"],
        "bound_s": result["job_start_bound_s"],
        "max_s": {name: p["job_waits"]["max_s"] for name, p in phases.items()},
        "p50_s": {name: p["job_waits"]["p50_s"] for name, p in phases.items()},
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short phases, not published")
    parser.add_argument(
        "--phases", default=",".join(PHASES), help=f"comma-separated, of {', '.join(PHASES)}"
    )
    parser.add_argument("--duration", type=float, default=None, help="seconds of load per phase")
    parser.add_argument("--batch", type=int, default=32, help="rows per healthy upload")
    parser.add_argument("--seed-rows", type=int, default=None, help="rows per gallery at start")
    parser.add_argument("--pause", type=float, default=0.02, help="healthy think time, s")
    parser.add_argument("--hostile-pause", type=float, default=0.05, help="s between hostile")
    parser.add_argument("--stallers", type=int, default=10, help="stalled bodies held open")
    parser.add_argument("--tricklers", type=int, default=3, help="trickled bodies held open")
    parser.add_argument("--slowlorises", type=int, default=4, help="trickled headers held open")
    parser.add_argument(
        "--big-search-pause", type=float, default=1.0, help="s between big (422) searches"
    )
    parser.add_argument(
        "--streamed-first-s",
        type=float,
        default=STREAMED_FIRST_S,
        help="s into the load of the first streamed big search (past --duration: none)",
    )
    parser.add_argument(
        "--wedges", type=int, default=None, help="wedges of the database (postgresql phase)"
    )
    parser.add_argument("--wedge-s", type=float, default=WEDGE_S, help="seconds of each wedge")
    parser.add_argument(
        "--rss-headroom-mib",
        type=float,
        default=RSS_HEADROOM_MIB,
        help="server VmRSS bound: its value at the load's start + this",
    )
    parser.add_argument("--p99-bound-ms", type=float, default=P99_BOUND_MS)
    parser.add_argument("--job-start-bound-s", type=float, default=JOB_START_BOUND_S)
    parser.add_argument("--request-timeout", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--no-markdown", action="store_true")
    parser.add_argument(
        "--log-dir", type=Path, default=None, help="keep each phase's server log here"
    )
    args = parser.parse_args(argv)
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    if not phases or set(phases) - set(PHASES):
        parser.error(f"--phases: a comma-separated list of {', '.join(PHASES)}")
    args.duration = args.duration or (16.0 if args.quick else 45.0)
    args.wedges = args.wedges if args.wedges is not None else (1 if args.quick else 3)
    if args.seed_rows is None:
        args.seed_rows = 500 if args.quick else 2000
    if "postgresql" in phases:
        wedge_starts(args)  # refuses a schedule that does not fit before any server starts
    data = fixture_rows()
    load_start = load_average()
    tic = time.monotonic()
    runs = {phase: run_phase(phase, args, data) for phase in phases}
    out = args.out or (
        REPO_ROOT / ("bench/out/soak_quick.json" if args.quick else "bench/results/soak.json")
    )
    result: dict[str, Any] = {
        "command": recorded_command(argv),
        "machine": machine_facts(),
        "load_start": load_start,
        "load_end": load_average(),
        "seconds": time.monotonic() - tic,
        "setup": {
            **{k: vars(args)[k] for k in ("duration", "batch", "pause", "seed_rows")},
            **{k: vars(args)[k] for k in ("stallers", "tricklers", "slowlorises")},
            "big_rows": BIG_ROWS,
            "big_k": BIG_K,
            "big_search_pause": args.big_search_pause,
            "streamed_interval_s": STREAMED_INTERVAL_S,
            "junk_claimed_bytes": JUNK_CLAIMED,
            "junk_sent_bytes": JUNK_SENT,
            "slowloris_interval_s": SLOWLORIS_INTERVAL_S,
            "flood_retry_s": FLOOD_RETRY_S,
            "wedges": args.wedges,
            "wedge_s": args.wedge_s,
            "dim": int(data["old"].shape[1]),
            "job_items": JOB_ITEMS,
            "hostile_address": HOSTILE_ADDRESS,
        },
        "p99_bound_ms": args.p99_bound_ms,
        "p99_bound_note": BOUND_NOTE if args.p99_bound_ms == P99_BOUND_MS else "",
        "job_start_bound_s": args.job_start_bound_s,
        "phases": runs,
        "ok": all(run["ok"] for run in runs.values()),
    }
    result["job_start_first_run"] = first_run(Path(out), runs, result)
    for phase, run in runs.items():
        for name, c in run["checks"].items():
            print(f"{phase} {name}: {'ok' if c['ok'] else 'FAILED'} — {c['detail']}")
    section = None if args.no_markdown or args.quick else SECTION
    publish(result, Path(out), render_markdown(result), section, TITLE)
    return result


if __name__ == "__main__":
    raise SystemExit(0 if main()["ok"] else 1)
