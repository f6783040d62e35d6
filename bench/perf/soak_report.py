"""The BENCHMARKS.md section of ``bench.perf.soak`` (``render_markdown``), written from its
results file alone: what ran, each phase's tables and checks (``bench.perf.soak_checks``
judged them), and the targets with the runs their bounds were set after."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bench.common.machine import facts_markdown

PHASE_TITLES = {
    "embedded": "Embedded (SQLite)",
    "postgresql": "PostgreSQL behind a proxy that wedges it",
}


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _status_text(s: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}: {n:,}" for k, n in s["statuses"].items())


def _phase_markdown(name: str, run: Mapping[str, Any], setup: Mapping[str, Any]) -> list[str]:
    wedges = run["wedges"]
    defaults = ", ".join(f"`{k}={v}`" for k, v in run["server_env"].items())
    lines = [
        f"**{PHASE_TITLES.get(name, name)}.** For {run['duration']:g} s (the last request ended "
        f"after {run['seconds']:.1f} s; load average at start {run['load_start']}, at end "
        f"{run['load_end']}). Server settings changed from the defaults: {defaults}."
    ]
    if wedges:
        windows = "; ".join(f"{a:.1f}–{b:.1f} s" for a, b in wedges["windows"])
        lines[0] += (
            f" The database is a fresh PostgreSQL database reached through a TCP proxy, frozen "
            f"{len(wedges['windows'])} times for {wedges['freeze_s']:g} s (connections open, "
            f"nothing forwarded; into the load: {windows}). A request overlapping a freeze or "
            f"the {wedges['grace_s']:g} s after it (the pool's wait, then a ping and a reconnect "
            "or one read, as the settings above bound them) is counted apart: its latency is "
            "in the wedged columns, and it may answer 503 with Retry-After, answered in the "
            f"window and at most {wedges['grace_s']:g} + {wedges['slack_s']:g} s (the client's "
            "own queueing) after it was sent."
        )
    lines += ["", "| healthy requests | count | statuses | p50 ms | p99 ms | max ms |"]
    if wedges:
        lines[-1] = (
            "| healthy requests | count | statuses | 503 + Retry-After in a wedge | p50 ms | "
            "p99 ms | max ms | wedged: count | wedged p99 ms | wedged max ms |"
        )
        lines.append("|---|---|---|---|---|---|---|---|---|---|")
    else:
        lines.append("|---|---|---|---|---|---|")
    for kind, s in run["healthy"].items():
        row = f"| {kind} | {s['requests']:,} | {_status_text(s)} |"
        if wedges:
            row += f" {s['wedge_503'] + s.get('wedge_stream_503', 0):,} |"
        row += f" {_ms(s['p50_ms'])} | {_ms(s['p99_ms'])} | {_ms(s['max_ms'])} |"
        if wedges:
            w = s["wedged"]
            row += f" {w['requests']:,} | {_ms(w['p99_ms'])} | {_ms(w['max_ms'])} |"
        lines.append(row)
    head = "| hostile requests | count | statuses | expected |"
    lines += ["", head + (" 503 + Retry-After in a wedge |" if wedges else "")]
    lines.append("|---|---|---|---|" + ("---|" if wedges else ""))
    for kind, s in run["hostile"].items():
        expected = ", ".join(map(str, s["expected"]))
        row = f"| {kind} | {s['requests']:,} | {_status_text(s)} | {expected} |"
        wedge_503 = s["wedge_503"] + s.get("wedge_stream_503", 0)
        lines.append(row + (f" {wedge_503:,} |" if wedges else ""))
    w, j, f, waits = run["writes"], run["jobs"], run["flood"], run["job_waits"]
    server = run["server"]
    params = ", ".join(f"`{k}` {v:,}" for k, v in f["params"].items())
    unsettled = sum(g.get("unsettled_ids", 0) for g in w["galleries"].values())
    stored = sum(g.get("unsettled_stored", 0) for g in w["galleries"].values())
    lines += [
        "",
        f"Writes: {w['acked_requests']:,} uploads acknowledged, {w['acked_ids']:,} distinct ids; "
        f"all read back through the API and compared with the vector last sent for them, live "
        f"and after a restart: {len(w['lost_live'])} and {len(w['lost_after_restart'])} lost"
        + (
            f" ({unsettled:,} more ids were sent only in writes that got no clear answer; "
            f"{stored:,} of them were stored)"
            if unsettled
            else ""
        )
        + f". Healthy upgrades: {j['created']} created, {j['succeeded']} succeeded, "
        f"{j['cancelled']} cancelled, {j['failed']} failed, {j['unfinished']} unfinished; "
        f"{waits['started']} started"
        + (" (outside the wedges)" if wedges else "")
        + (
            f" {waits['p50_s']:.2f} s after their creation at the median, "
            f"{waits['max_s']:.2f} s at the longest"
            if waits["max_s"] is not None
            else ""
        )
        + (
            f", {waits['wedged']['started']} across a wedge"
            + (
                f" (longest {waits['wedged']['max_s']:.2f} s)"
                if waits["wedged"]["max_s"] is not None
                else ""
            )
            if wedges
            else ""
        )
        + f". The flood (`{f['method']}`, {params}): {f['created']} upgrades queued, "
        f"{run['hostile']['job_flood']['statuses'].get('429', 0):,} refused with 429; at the "
        f"load's end {f['running_at_end']} running and {f['queued_at_end']} queued, then "
        f"cancelled: {f['cancelled']} cancelled, {f['succeeded']} succeeded, {f['failed']} "
        f"failed, {f['unfinished']} unfinished. Server: {server['responses_5xx']} 5xx other "
        f"than 503 and {server['responses_503']} × 503 in its /metrics, "
        f"{server['tracebacks']['total']} tracebacks in its log"
        + (
            f" ({server['tracebacks']['outage']} of them the wedged database's errors)"
            if wedges
            else ""
        )
        + f"; its VmRSS (sampled every {server['rss']['interval_s']:g} s) "
        f"started the load at {server['rss']['start_mib']:,.0f} MiB and peaked at "
        f"{server['rss']['peak_mib']:,.0f} MiB.",
        "",
        "| check | result | detail |",
        "|---|---|---|",
    ]
    for check_name, c in run["checks"].items():
        lines.append(f"| {check_name} | {'ok' if c['ok'] else 'FAILED'} | {c['detail']} |")
    return lines


def render_markdown(result: dict[str, Any]) -> str:
    a = result["setup"]
    lines = [
        f"Command: `{result['command']}`. "
        + facts_markdown(result["machine"], result["load_start"], result["load_end"])
        + f" Both phases took {result['seconds']:.0f} s in all.",
        "",
        "In each phase, against a real uvicorn server of its own on loopback (the upgrade jobs "
        "in its thread runner, two slots), two tenants each ran 2 uploaders (batches "
        f"of {a['batch']} rows, JSON and .npy; every fourth batch re-upserts an earlier one), "
        "2 searchers (1 JSON query or 8 as .npy, k=10) and 1 upgrade client (`procrustes` on "
        f"{a['job_items']} paired items, polled every 0.25 s, every third cancelled at once), each "
        f"pausing {a['pause'] * 1e3:g} ms between requests, on cosine galleries of "
        f"{a['dim']}-d rows seeded with {a['seed_rows']:,} rows each. Meanwhile a third tenant "
        f"held {a['stallers']} stalled bodies and {a['tricklers']} trickled ones (a byte every "
        "0.5 s) open, sent bodies over the size limit, lying `.npy` headers, deep JSON, NaN/Inf "
        "and wrong dimensions (also with the first tenant's key, to its gallery), and a client "
        f"on {a['hostile_address']} guessed keys. Issue 45's hostile clients ran too: JSON "
        f"searches of {a['big_rows']:,} queries × k = {a['big_k']:,} (over MAX_HITS_PER_REQUEST), "
        "the same search asked for as NDJSON on the first tenant's gallery (one at a time, every "
        f"{a['streamed_interval_s']:g} s, each read to its `done` line), from "
        f"{a['hostile_address']} bodies under a junk key promising "
        f"{a['junk_claimed_bytes'] / 2**20:g} MiB and sending {a['junk_sent_bytes'] / 2**10:g} "
        f"KiB, {a['slowlorises']} connections trickling header bytes (one every "
        f"{a['slowloris_interval_s']:g} s) that never end them, and the third tenant flooding the "
        "job queue with the longest upgrades the server accepts (every parameter it caps at the "
        "maximum its method catalogue advertises), submitted again as soon as one is accepted "
        f"and {a['flood_retry_s']:g} s after a refusal, all cancelled when the load ends. The "
        "second phase runs the same load on PostgreSQL and wedges the database. The server ran "
        "as `nobackfill serve` runs it (bounded headers). Rows are the committed WordNet-noun "
        "fixture's MiniLM rows, each drawn plus noise of norm 0.1. Client and server shared the "
        "machine's cores.",
    ]
    for name, run in result["phases"].items():
        lines += ["", *_phase_markdown(name, run, a)]
    first = result["job_start_first_run"]
    measured = ", ".join(
        f"{PHASE_TITLES.get(name, name)} {value:.2f} s"
        for name, value in first["max_s"].items()
        if value is not None
    )
    lines += [
        "",
        "Target (issue 24, item 6; issue 45): no 5xx but a wedged database's 503 with "
        "Retry-After inside its window, every hostile client answered as it should be (refused "
        "with its 4xx; the streamed big search 200 with its done line; the flood 202 until its "
        "cap, then 429), no lost acknowledged write, p99 of every healthy kind (outside the "
        f"wedges) under {result['p99_bound_ms']:g} ms, every healthy upgrade started within "
        f"{result['job_start_bound_s']:g} s of its creation while the flood held its slot, and "
        f"uploads and searches served again after each wedge — "
        f"{'met' if result['ok'] else 'missed'}. Latencies are measured at the client, from "
        "sending to the whole answer; its event loop shares the cores, so they include its own "
        "queueing. "
        + result["p99_bound_note"]
        + " The server-memory bound (start of the load + the headroom in each phase's "
        "server_rss check) holds the load's and the streamed searches' share and the flood's "
        "training, which runs in the server's process."
        + f" The job-start bound was set after a first run ({first['date']}, "
        f"`{first['command']}`, under a provisional bound of {first['bound_s']:g} s) measured "
        f"a longest wait from creation to start of {measured}.",
    ]
    return "\n".join(lines) + "\n"
