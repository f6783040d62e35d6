"""What ``bench.perf.soak`` records and how it judges a run: pure functions over plain data, so a
test can hand them a fabricated run (a lost write, a 5xx) and see them fail it.

- ``Tally``: the statuses and latencies of one kind of request;
- ``WriteLog``: which vector each id was last acknowledged with (and, for ids whose last write
  got no clear answer, the vectors it may hold instead);
- ``lost_writes``: acknowledged writes compared with what the API reads back;
- ``evaluate``: every check of a run, each ``{"ok": bool, "detail": str}``;
- ``render_markdown``: the run's BENCHMARKS.md section.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.common.machine import facts_markdown

NO_ANSWER = "no answer"  # the status key of a request that got no HTTP response
CLOSED = "closed"  # the status key of a connection the server closed without an answer

# What each healthy request must get: a cancel may lose the race with a job that just finished.
HEALTHY_EXPECTED: dict[str, set[int]] = {
    "upload_json": {200},
    "upload_npy": {200},
    "search_json": {200},
    "search_npy": {200},
    "job_create": {202},
    "job_poll": {200},
    "job_cancel": {200, 409},
}
# What each hostile request must get: 408 for a body that stalls or trickles past its deadline,
# 429 when its key already sends as many bodies as it may (or after 20 failed authentications),
# 413 for a body over MAX_REQUEST_BYTES or more rows than MAX_VECTORS_PER_REQUEST, 422 for
# content the API refuses (naming the field), 401 for an unknown key (issue 45: before the body
# is read), 422 for a JSON search whose queries × k exceed MAX_HITS_PER_REQUEST, 408 (or 431, or
# the connection closed) for headers that never finish. The one 2xx: the same search asked for
# as NDJSON is streamed in chunks and must end with its ``done`` line (the server's RSS is
# checked beside it).
HOSTILE_EXPECTED: dict[str, set[int]] = {
    "stalled_body": {408, 429},
    "trickle_body": {408, 429},
    "claimed_length": {413},
    "streamed_over_limit": {413},
    "npy_huge_rows": {413, 422},
    "npy_huge_strings": {413, 422},
    "npy_search_huge": {413, 422},
    "json_deep": {422},
    "multipart_deep_metadata": {422},
    "nan_json": {422},
    "nan_npy": {422},
    "wrong_dim_upload": {422},
    "wrong_dim_search": {422},
    "wrong_key": {401, 429},
    "big_search": {422},
    "big_search_streamed": {200},
    "junk_key_body": {401, 429},
    "header_slowloris": {408, 431},
}
# Hostile kinds for which the server closing the connection without an answer is a refusal too.
HOSTILE_MAY_CLOSE = {"header_slowloris"}


@dataclass
class Tally:
    """One kind of request: how many got each status (``NO_ANSWER`` for none), the latency of
    each answered one, and the first few answers it should not have got."""

    statuses: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)

    def add(
        self, status: int | str | None, seconds: float, expected: set[int], text: str = ""
    ) -> None:
        """``status``: the HTTP status, ``None`` for no answer, or ``CLOSED``."""
        self.statuses[NO_ANSWER if status is None else str(status)] += 1
        if status is not None:
            self.latencies.append(seconds)
        if (status is None or status not in expected) and len(self.unexpected) < 5:
            self.unexpected.append(f"{status or NO_ANSWER}: {text[:300]}")

    def summary(self, expected: set[int]) -> dict[str, Any]:
        ms = np.asarray(self.latencies) * 1e3
        return {
            "requests": sum(self.statuses.values()),
            "statuses": dict(sorted(self.statuses.items())),
            "expected": sorted(expected),
            "p50_ms": float(np.percentile(ms, 50)) if len(ms) else None,
            "p99_ms": float(np.percentile(ms, 99)) if len(ms) else None,
            "max_ms": float(ms.max()) if len(ms) else None,
            "unexpected": self.unexpected,
        }


class WriteLog:
    """Per id: the vector of its last acknowledged write, and the vectors of writes sent after
    it that got no clear answer (a 5xx or no answer: stored or not, nobody knows). A 4xx is a
    clear "not stored": such a write is forgotten."""

    def __init__(self) -> None:
        self.acked: dict[str, np.ndarray] = {}
        self.unsettled: dict[str, list[np.ndarray]] = {}
        self.acked_requests = 0

    def settle(self, ids: Sequence[str], vectors: np.ndarray, status: int | None) -> None:
        if status is not None and 200 <= status < 300:
            self.acked_requests += 1
            for item_id, row in zip(ids, vectors, strict=True):
                self.acked[item_id] = row
                self.unsettled.pop(item_id, None)
        elif status is None or status >= 500:
            for item_id, row in zip(ids, vectors, strict=True):
                self.unsettled.setdefault(item_id, []).append(row)


def lost_writes(
    acked: Mapping[str, np.ndarray],
    stored: Mapping[str, np.ndarray],
    unsettled: Mapping[str, Sequence[np.ndarray]] | None = None,
) -> list[str]:
    """One line per acknowledged id the API lost: absent from ``stored`` (what it read back), or
    holding another vector than its last acknowledged one (or one of the ``unsettled`` writes
    sent after it). Vectors compare exactly: float32 in, float32 out."""
    unsettled = unsettled or {}
    lost = []
    for item_id, sent in acked.items():
        got = stored.get(item_id)
        if got is None:
            lost.append(f"{item_id}: acknowledged, not read back")
            continue
        candidates = [sent, *unsettled.get(item_id, ())]
        if not any(np.array_equal(np.asarray(c, np.float32), got) for c in candidates):
            diff = float(np.max(np.abs(np.asarray(sent, np.float32) - got)))
            lost.append(f"{item_id}: read back differs from the acknowledged vector by {diff:g}")
    return lost


def _statuses(kinds: Mapping[str, Mapping[str, Any]]) -> Iterable[tuple[str, str, int]]:
    for kind, s in kinds.items():
        for status, count in s["statuses"].items():
            yield kind, status, count


def evaluate(run: Mapping[str, Any], p99_bound_ms: float) -> dict[str, dict[str, Any]]:
    """Every check of a run (the ``healthy``/``hostile`` summaries, ``writes``, ``jobs`` and
    ``server`` parts of ``bench.perf.soak``'s result): ``{name: {"ok", "detail"}}``."""
    healthy, hostile = run["healthy"], run["hostile"]
    checks: dict[str, dict[str, Any]] = {}

    def check(name: str, ok: bool, detail: str) -> None:
        checks[name] = {"ok": bool(ok), "detail": detail}

    fives = [
        f"{kind} {status} ×{n}"
        for kind, status, n in [*_statuses(healthy), *_statuses(hostile)]
        if status.isdigit() and int(status) >= 500
    ]
    server_5xx = run["server"]["responses_5xx"]
    check(
        "no_5xx",
        not fives and server_5xx == 0,
        f"client saw {fives or 'none'}; the server's /metrics counted {server_5xx}",
    )
    wrong = [
        f"{kind} {status} ×{n}"
        for kind, status, n in _statuses(healthy)
        if status == NO_ANSWER or int(status) not in HEALTHY_EXPECTED[kind]
    ]
    check("healthy_as_expected", not wrong, ", ".join(wrong) or "every one")
    wrong = [
        f"{kind} {status} ×{n}"
        for kind, status, n in _statuses(hostile)
        if status == NO_ANSWER
        or (status == CLOSED and kind not in HOSTILE_MAY_CLOSE)
        or (status != CLOSED and int(status) not in HOSTILE_EXPECTED[kind])
    ]
    check(
        "hostile_refused_4xx",
        not wrong,
        ", ".join(wrong)
        or "every one (the streamed big searches: 200 with their done line, as expected)",
    )
    missing = sorted(
        {*HEALTHY_EXPECTED} - {k for k, s in healthy.items() if s["requests"]}
        | {*HOSTILE_EXPECTED} - {k for k, s in hostile.items() if s["requests"]}
    )
    check("every_kind_ran", not missing, f"never sent: {missing}" if missing else "all")
    writes = run["writes"]
    lost = writes["lost_live"] + writes["lost_after_restart"]
    counts_ok = all(g["count"] == g["acked_ids"] for g in writes["galleries"].values())
    check(
        "no_lost_write",
        not lost and counts_ok and writes["acked_ids"] > 0,
        f"{writes['acked_ids']:,} acknowledged ids read back live and after a restart; "
        f"lost: {lost[:5] or 'none'}; gallery counts "
        + ", ".join(
            f"{n} {g['count']} (acked {g['acked_ids']})" for n, g in writes["galleries"].items()
        ),
    )
    p99s = {k: s["p99_ms"] for k, s in healthy.items() if s["p99_ms"] is not None}
    worst = max(p99s, key=p99s.__getitem__) if p99s else None
    check(
        "healthy_p99",
        worst is not None and p99s[worst] < p99_bound_ms,
        f"worst kind {worst}: p99 {p99s.get(worst, float('nan')):.0f} ms (bound {p99_bound_ms:g} ms)",
    )
    jobs = run["jobs"]
    check(
        "jobs_end_well",
        jobs["created"] > 0 and jobs["failed"] == 0 and jobs["unfinished"] == 0,
        f"{jobs['created']} created: {jobs['succeeded']} succeeded, {jobs['cancelled']} "
        f"cancelled, {jobs['failed']} failed, {jobs['unfinished']} unfinished",
    )
    rss = run["server"]["rss"]
    check(
        "server_rss",
        rss["samples"] > 0 and rss["peak_mib"] < rss["bound_mib"],
        f"VmRSS peak {rss['peak_mib']:,.0f} MiB over {rss['samples']} samples (start "
        f"{rss['start_mib']:,.0f} MiB; bound {rss['bound_mib']:,.0f} MiB: start + "
        f"{rss['bound_mib'] - rss['start_mib']:,.0f} MiB)",
    )
    check(
        "server_log_clean",
        run["server"]["tracebacks"] == 0 and run["server"]["alive"],
        f"{run['server']['tracebacks']} tracebacks in the server log; "
        f"server {'alive' if run['server']['alive'] else 'DEAD'} at the end",
    )
    return checks


def render_markdown(result: dict[str, Any]) -> str:
    a = result["setup"]
    lines = [
        f"Command: `{result['command']}`. "
        + facts_markdown(result["machine"], result["load_start"], result["load_end"]),
        "",
        f"For {a['duration']:g} s (the last request ended after {result['seconds']:.1f} s), "
        "against a real uvicorn server on loopback (embedded "
        "mode, the upgrade jobs in its thread runner), two tenants each ran 2 uploaders (batches "
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
        f"the same search asked for as NDJSON on the first tenant's gallery ({a['streamed']} in "
        f"the run, one at a time, every {a['streamed_interval_s']:g} s, each read to its `done` "
        f"line), from {a['hostile_address']} bodies under a junk key promising "
        f"{a['junk_claimed_bytes'] / 2**20:g} MiB and sending {a['junk_sent_bytes'] / 2**10:g} "
        f"KiB, and {a['slowlorises']} connections trickling header bytes (one every "
        f"{a['slowloris_interval_s']:g} s) that never end them. The server ran as `nobackfill "
        "serve` runs it (bounded headers). Server settings changed from the defaults: "
        + ", ".join(f"`{k}={v}`" for k, v in result["server_env"].items())
        + ". Rows are the committed WordNet-noun fixture's MiniLM rows, each drawn plus noise "
        "of norm 0.1. Client and server shared the machine's cores.",
        "",
        "| healthy requests | count | statuses | p50 ms | p99 ms | max ms |",
        "|---|---|---|---|---|---|",
    ]
    fmt = lambda v: "–" if v is None else f"{v:,.0f}" if v >= 100 else f"{v:.1f}"  # noqa: E731
    status_text = lambda s: ", ".join(f"{k}: {n:,}" for k, n in s["statuses"].items())  # noqa: E731
    for kind, s in result["healthy"].items():
        lines.append(
            f"| {kind} | {s['requests']:,} | {status_text(s)} | {fmt(s['p50_ms'])} "
            f"| {fmt(s['p99_ms'])} | {fmt(s['max_ms'])} |"
        )
    lines += ["", "| hostile requests | count | statuses | expected |", "|---|---|---|---|"]
    for kind, s in result["hostile"].items():
        expected = ", ".join(map(str, s["expected"]))
        lines.append(f"| {kind} | {s['requests']:,} | {status_text(s)} | {expected} |")
    w, j = result["writes"], result["jobs"]
    lines += [
        "",
        f"Writes: {w['acked_requests']:,} uploads acknowledged, {w['acked_ids']:,} distinct ids; "
        f"all read back through the API and compared with the vector last sent for them, live "
        f"and after a restart: {len(w['lost_live'])} and {len(w['lost_after_restart'])} lost. "
        f"Upgrades: {j['created']} created, {j['succeeded']} succeeded, {j['cancelled']} "
        f"cancelled, {j['failed']} failed, {j['unfinished']} unfinished. Server: "
        f"{result['server']['responses_5xx']} 5xx in its /metrics, "
        f"{result['server']['tracebacks']} tracebacks in its log; its VmRSS (sampled every "
        f"{result['server']['rss']['interval_s']:g} s) started the load at "
        f"{result['server']['rss']['start_mib']:,.0f} MiB and peaked at "
        f"{result['server']['rss']['peak_mib']:,.0f} MiB.",
        "",
        "| check | result | detail |",
        "|---|---|---|",
    ]
    for name, c in result["checks"].items():
        lines.append(f"| {name} | {'ok' if c['ok'] else 'FAILED'} | {c['detail']} |")
    lines += [
        "",
        f"Target (issue 24, item 6): no 5xx, every hostile client answered as it should be "
        f"(refused with its 4xx; the streamed big search 200 with its done line), no lost "
        f"acknowledged write, p99 of every healthy kind under "
        f"{result['p99_bound_ms']:g} ms — {'met' if result['ok'] else 'missed'}. Latencies are "
        "measured at the client, from sending to the whole answer; its event loop shares the "
        "cores, so they include its own queueing. " + result["p99_bound_note"],
    ]
    return "\n".join(lines) + "\n"
