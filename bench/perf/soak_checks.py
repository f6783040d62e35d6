"""What ``bench.perf.soak`` records and how it judges a run: pure functions over plain data, so a
test can hand them a fabricated run (a lost write, a 5xx) and see them fail it.

- ``Tally``: the statuses and latencies of one kind of request;
- ``WriteLog``: which vector each id was last acknowledged with (and, for ids whose last write
  got no clear answer, the vectors it may hold instead);
- ``lost_writes``: acknowledged writes compared with what the API reads back;
- ``job_waits`` and ``recoveries``: how long healthy upgrades waited to start, and how soon
  uploads and searches succeeded again after each wedge of the database;
- ``evaluate``: every check of a run, each ``{"ok": bool, "detail": str}``.

Its BENCHMARKS.md section is ``bench.perf.soak_report``'s.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np

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
# A wedge of the database (the PostgreSQL phase): (start, end) of a freeze, monotonic seconds.
Window = tuple[float, float]
# Any request, healthy or hostile, may answer 503 with Retry-After while the database is wedged:
# answered inside a freeze or within the grace after it (the longest the configured timeouts let
# a request wait on the database). Nowhere else, and never without Retry-After.
WEDGE_STATUS = 503
# A streamed answer whose 200 went out before the wedge cannot change its status: it ends with
# an error line naming 503 instead (no header can carry Retry-After then). Judged as a wedge's
# 503 is: allowed inside a window, a 5xx anywhere else.
STREAM_503 = "503 in the stream"

# What each hostile request must get: 408 for a body that stalls or trickles past its deadline,
# 429 when its key already sends as many bodies as it may (or after 20 failed authentications),
# 413 for a body over MAX_REQUEST_BYTES or more rows than MAX_VECTORS_PER_REQUEST, 422 for
# content the API refuses (naming the field), 401 for an unknown key (issue 45: before the body
# is read), 422 for a JSON search whose queries × k exceed MAX_HITS_PER_REQUEST, 408 (or 431, or
# the connection closed) for headers that never finish. The 2xx: the same search asked for as
# NDJSON is streamed in chunks and must end with its ``done`` line (the server's RSS is checked
# beside it); and the flood of the longest upgrades the server accepts gets 202 until its
# tenant holds NOBACKFILL_MAX_ACTIVE_JOBS_PER_TENANT jobs, then 429 (too many jobs, or too many
# estimated steps).
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
    "job_flood": {202, 429},
}
# Hostile kinds for which the server closing the connection without an answer is a refusal too.
HOSTILE_MAY_CLOSE = {"header_slowloris"}


@dataclass
class Tally:
    """One kind of request: how many got each status (``NO_ANSWER`` for none), the latency of
    each answered one, when each was sent and answered (for the wedge windows), and the first
    few answers it should not have got."""

    statuses: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    # (sent, answered) in monotonic seconds, the status key, and whether Retry-After came with it
    events: list[tuple[float, float, str, bool]] = field(default_factory=list)

    def add(
        self,
        status: int | str | None,
        seconds: float,
        expected: set[int],
        text: str = "",
        sent: float | None = None,
        retry_after: bool = False,
    ) -> None:
        """``status``: the HTTP status, ``None`` for no answer, or ``CLOSED``; ``sent``: when
        the request was sent (``time.monotonic()``; now − ``seconds`` when not given)."""
        key = NO_ANSWER if status is None else str(status)
        self.statuses[key] += 1
        if status is not None:
            self.latencies.append(seconds)
        start = time.monotonic() - seconds if sent is None else sent
        self.events.append((start, start + seconds, key, retry_after))
        # A 503 with Retry-After (or in a stream) is judged by the wedge windows, in ``summary``.
        judged_later = (status == WEDGE_STATUS and retry_after) or status == STREAM_503
        wrong = (status is None or status not in expected) and not judged_later
        if wrong and len(self.unexpected) < 5:
            self.unexpected.append(f"{status or NO_ANSWER}: {text[:300]}")

    def summary(
        self,
        expected: set[int],
        windows: Sequence[Window] = (),
        grace: float = 0.0,
        slack: float = 0.0,
    ) -> dict[str, Any]:
        """Counts and latencies. With wedge ``windows`` (each extended by ``grace``): the
        latencies are those of requests that overlapped no window, ``wedged`` describes the
        ones that did, and ``wedge_503`` counts the 503s with Retry-After answered inside one
        and at most ``grace`` + ``slack`` s after they were sent (every other 503 is a 5xx like
        any other)."""

        def overlaps(start: float, end: float) -> bool:
            return any(start <= w1 + grace and end >= w0 for w0, w1 in windows)

        def answered_inside(end: float) -> bool:
            return any(w0 <= end <= w1 + grace for w0, w1 in windows)

        answered = [(s, e, k, ra) for s, e, k, ra in self.events if k != NO_ANSWER]
        outside = [e - s for s, e, _, _ in answered if not overlaps(s, e)]
        inside = [(s, e, k, ra) for s, e, k, ra in self.events if overlaps(s, e)]

        def allowed(s: float, e: float) -> bool:
            return answered_inside(e) and e - s <= grace + slack

        wedge_503 = [
            e - s for s, e, k, ra in inside if k == str(WEDGE_STATUS) and ra and allowed(s, e)
        ]
        stream_503 = [e - s for s, e, k, _ in inside if k == STREAM_503 and allowed(s, e)]
        out = {
            "requests": sum(self.statuses.values()),
            "statuses": dict(sorted(self.statuses.items())),
            "expected": sorted(expected),
            **_percentiles(outside if windows else [e - s for s, e, _, _ in answered]),
            "wedge_503": len(wedge_503),
            "wedge_stream_503": len(stream_503),
            "unexpected": self.unexpected,
        }
        if windows:
            out["wedged"] = {
                "requests": len(inside),
                "statuses": dict(sorted(Counter(k for _, _, k, _ in inside).items())),
                **_percentiles([e - s for s, e, k, _ in inside if k != NO_ANSWER]),
                "max_503_ms": max(wedge_503) * 1e3 if wedge_503 else None,
            }
        return out


def _percentiles(seconds: Sequence[float]) -> dict[str, float | None]:
    ms = np.asarray(seconds, dtype=np.float64) * 1e3
    return {
        "p50_ms": float(np.percentile(ms, 50)) if len(ms) else None,
        "p99_ms": float(np.percentile(ms, 99)) if len(ms) else None,
        "max_ms": float(ms.max()) if len(ms) else None,
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


def job_waits(
    jobs: Sequence[tuple[float, float | None, str]],
    windows: Sequence[Window] = (),
    grace: float = 0.0,
) -> dict[str, Any]:
    """How long healthy upgrades waited to start: ``jobs`` holds (created, started or None, last
    status) per job, in seconds on the windows' clock. Waits that overlapped a wedge window
    (extended by ``grace``) are reported apart under ``wedged``: a claim needs the database too.
    A job never started is ``cancelled`` (cancelled before a slot took it) or ``unstarted``
    (still waiting when the client stopped polling: longer than any bound)."""
    started = [(c, s) for c, s, _ in jobs if s is not None]

    def overlaps(c: float, s: float) -> bool:
        return any(c <= w1 + grace and s >= w0 for w0, w1 in windows)

    outside = [s - c for c, s in started if not overlaps(c, s)]
    inside = [s - c for c, s in started if overlaps(c, s)]
    never = [status for _, s, status in jobs if s is None]
    return {
        "jobs": len(jobs),
        "started": len(outside),
        "p50_s": float(np.median(outside)) if outside else None,
        "max_s": max(outside) if outside else None,
        "wedged": {"started": len(inside), "max_s": max(inside) if inside else None},
        "cancelled": sum(status == "cancelled" for status in never),
        "unstarted": sum(status != "cancelled" for status in never),
    }


def recoveries(
    events: Mapping[str, Sequence[tuple[float, float, str, bool]]],
    windows: Sequence[Window],
    end: float,
) -> list[dict[str, float | None]]:
    """Per wedge window and per group of requests (``events``: group → ``Tally.events``): the
    seconds from the thaw to the answer of the first request of the group sent after it that
    succeeded (2xx) before the next window (or ``end``); None when none did."""
    out = []
    for i, (_, thaw) in enumerate(windows):
        upto = windows[i + 1][0] if i + 1 < len(windows) else end
        found: dict[str, float | None] = {}
        for group, group_events in events.items():
            ok = [
                (s, e)
                for s, e, k, _ in group_events
                if thaw <= s < upto and k.isdigit() and 200 <= int(k) < 300
            ]
            found[group] = min(ok)[1] - thaw if ok else None
        out.append(found)
    return out


# A log record of the server (``logging``'s default format, local time) and the exceptions a
# wedged database raises: a traceback ending in one of them, logged inside a wedge window (or its
# grace), is the outage's, counted apart from any other.
_RECORD = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (\w+) (\S+): ", re.M)
_LAST_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Timeout)\b)", re.M)
OUTAGE_EXCEPTIONS = (
    "sqlalchemy.exc.OperationalError",
    "sqlalchemy.exc.TimeoutError",
    "psycopg.OperationalError",
    "psycopg.errors.ConnectionTimeout",
)


def log_tracebacks(log: str, windows: Sequence[Window] = (), grace: float = 0.0) -> dict[str, Any]:
    """The tracebacks of a server log: how many, and how many are a wedged database's (the
    record's last exception is one of ``OUTAGE_EXCEPTIONS`` and its time, on the wall clock
    as ``windows`` are here, falls inside a window or its ``grace``), by logger; the first
    lines of the others."""
    starts = list(_RECORD.finditer(log))
    outage: Counter[str] = Counter()
    others: list[str] = []
    covered = 0
    for i, match in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(log)
        text = log[match.start() : end]
        n = text.count("Traceback (most recent call last)")
        if not n:
            continue
        covered += n
        moment = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        last = _LAST_EXCEPTION.findall(text)
        inside = any(w0 <= moment <= w1 + grace for w0, w1 in windows)
        if inside and last and last[-1] in OUTAGE_EXCEPTIONS:
            outage[match.group(3)] += n
        else:
            others.append(text.splitlines()[0][:300])
    total = log.count("Traceback (most recent call last)")
    if total > covered:  # printed outside any log record (a thread's uncaught exception)
        others.append(f"{total - covered} traceback(s) outside a log record")
    return {
        "total": total,
        "outage": sum(outage.values()),
        "outage_by_logger": dict(sorted(outage.items())),
        "others": others[:10],
        "other_count": total - sum(outage.values()),
    }


def _statuses(kinds: Mapping[str, Mapping[str, Any]]) -> Iterable[tuple[str, str, int]]:
    """(kind, status, count) of every status a kind got, less its 503s with Retry-After
    answered inside a wedge window (``Tally.summary``'s ``wedge_503``)."""
    for kind, s in kinds.items():
        for status, count in s["statuses"].items():
            if status == str(WEDGE_STATUS):
                count -= s.get("wedge_503", 0)
            elif status == STREAM_503:
                count -= s.get("wedge_stream_503", 0)
            if count:
                yield kind, status, count


def _is_5xx(status: str) -> bool:
    return status == STREAM_503 or (status.isdigit() and int(status) >= 500)


def evaluate(
    run: Mapping[str, Any], p99_bound_ms: float, job_start_bound_s: float
) -> dict[str, dict[str, Any]]:
    """Every check of a run (one phase of ``bench.perf.soak``'s result: its ``healthy`` and
    ``hostile`` summaries, ``writes``, ``jobs``, ``job_waits``, ``flood``, ``wedges`` and
    ``server``): ``{name: {"ok", "detail"}}``."""
    healthy, hostile = run["healthy"], run["hostile"]
    wedges = run.get("wedges")
    checks: dict[str, dict[str, Any]] = {}

    def check(name: str, ok: bool, detail: str) -> None:
        checks[name] = {"ok": bool(ok), "detail": detail}

    fives = [
        f"{kind} {status} ×{n}"
        for kind, status, n in [*_statuses(healthy), *_statuses(hostile)]
        if _is_5xx(status)
    ]
    wedge_503 = sum(
        s.get("wedge_503", 0) + s.get("wedge_stream_503", 0)
        for s in [*healthy.values(), *hostile.values()]
    )
    client_503 = sum(
        s["statuses"].get(str(WEDGE_STATUS), 0) for s in [*healthy.values(), *hostile.values()]
    )
    server = run["server"]
    server_503 = server.get("responses_503", 0)
    slowest = max(
        (
            s["wedged"]["max_503_ms"]
            for s in [*healthy.values(), *hostile.values()]
            if s.get("wedged", {}).get("max_503_ms") is not None
        ),
        default=None,
    )
    allowed = (
        f" other than {wedge_503:,} × 503 with Retry-After (or in a stream already answering) "
        "answered inside a wedge window "
        f"(or within {wedges['grace_s']:g} s after it) at most {wedges['grace_s']:g} + "
        f"{wedges['slack_s']:g} s after they were sent"
        + (f" (the slowest after {slowest / 1e3:.2f} s)" if slowest is not None else "")
        if wedges
        else ""
    )
    check(
        "no_5xx",
        not fives and server["responses_5xx"] == 0 and server_503 == client_503,
        f"client saw {', '.join(fives) or 'no 5xx'}{allowed}; the server's /metrics counted "
        f"{server['responses_5xx']} 5xx other than 503, and {server_503} × 503",
    )
    wrong = [
        f"{kind} {status} ×{n}"
        for kind, status, n in _statuses(healthy)
        if not status.isdigit() or int(status) not in HEALTHY_EXPECTED[kind]
    ]
    check("healthy_as_expected", not wrong, ", ".join(wrong) or "every one" + allowed)
    wrong = [
        f"{kind} {status} ×{n}"
        for kind, status, n in _statuses(hostile)
        if (status == CLOSED and kind not in HOSTILE_MAY_CLOSE)
        or (status != CLOSED and not status.isdigit())
        or (status.isdigit() and int(status) not in HOSTILE_EXPECTED[kind])
    ]
    check(
        "hostile_refused_4xx",
        not wrong,
        ", ".join(wrong)
        or "every one (the streamed big searches: 200 with their done line; the flood: 202 "
        "until its cap, then 429)"
        + allowed,
    )
    missing = sorted(
        {*HEALTHY_EXPECTED} - {k for k, s in healthy.items() if s["requests"]}
        | {*HOSTILE_EXPECTED} - {k for k, s in hostile.items() if s["requests"]}
    )
    check("every_kind_ran", not missing, f"never sent: {missing}" if missing else "all")
    writes = run["writes"]
    lost = writes["lost_live"] + writes["lost_after_restart"]
    counts_ok = all(
        g["count"] == g["acked_ids"] + g.get("unsettled_stored", 0)
        for g in writes["galleries"].values()
    )
    check(
        "no_lost_write",
        not lost and counts_ok and writes["acked_ids"] > 0,
        f"{writes['acked_ids']:,} acknowledged ids read back live and after a restart; "
        f"lost: {lost[:5] or 'none'}; gallery counts "
        + ", ".join(
            f"{n} {g['count']} (acked {g['acked_ids']}"
            + (
                f", + {g['unsettled_stored']} of {g['unsettled_ids']} ids whose last write got "
                "no clear answer"
                if g.get("unsettled_ids")
                else ""
            )
            + ")"
            for n, g in writes["galleries"].items()
        ),
    )
    p99s = {k: s["p99_ms"] for k, s in healthy.items() if s["p99_ms"] is not None}
    worst = max(p99s, key=p99s.__getitem__) if p99s else None
    inside = ""
    if wedges:
        wedged = {
            k: s["wedged"]["p99_ms"]
            for k, s in healthy.items()
            if s["wedged"]["p99_ms"] is not None
        }
        slowest = max(wedged, key=wedged.__getitem__) if wedged else None
        inside = (
            f"; overlapping a wedge (not held to the bound): worst {slowest} p99 "
            f"{wedged[slowest]:.0f} ms"
            if slowest
            else "; no request overlapped a wedge"
        )
    check(
        "healthy_p99",
        worst is not None and p99s[worst] < p99_bound_ms,
        f"worst kind {worst}: p99 {p99s.get(worst, float('nan')):.0f} ms (bound "
        f"{p99_bound_ms:g} ms)" + (" outside the wedge windows" if wedges else "") + inside,
    )
    waits = run["job_waits"]
    across = waits["wedged"]["started"]
    check(
        "healthy_jobs_start",
        waits["started"] > 0
        and waits["max_s"] is not None
        and waits["max_s"] < job_start_bound_s
        and waits["unstarted"] == 0,
        f"of {waits['jobs']} healthy upgrades, {waits['started']} started"
        + (f" outside the wedges ({across} across one, not held to the bound)" if wedges else "")
        + f", {waits['cancelled']} never (cancelled first), {waits['unstarted']} never though "
        "not cancelled; from creation to start "
        + (
            f"median {waits['p50_s']:.2f} s, longest {waits['max_s']:.2f} s"
            if waits["max_s"] is not None
            else "none measured"
        )
        + f" (bound {job_start_bound_s:g} s) while the flood's tenant held its slot",
    )
    flood = run["flood"]
    refused = hostile["job_flood"]["statuses"].get("429", 0)
    check(
        "flood_held_its_cap",
        flood["created"] > 0 and refused > 0 and flood["running_at_end"] > 0,
        f"the flood's tenant queued {flood['created']} upgrades ({flood['method']}, "
        + ", ".join(f"{k} {v}" for k, v in flood["params"].items())
        + f"), was refused {refused} more with 429, and ran {flood['running_at_end']} at the "
        "load's end",
    )
    jobs = run["jobs"]
    flood_clean = flood["cancelled"] == flood["created"]
    check(
        "jobs_end_well",
        jobs["created"] > 0 and jobs["failed"] == 0 and jobs["unfinished"] == 0 and flood_clean,
        f"healthy: {jobs['created']} created: {jobs['succeeded']} succeeded, {jobs['cancelled']} "
        f"cancelled, {jobs['failed']} failed, {jobs['unfinished']} unfinished; the flood's "
        f"{flood['created']}, cancelled at the end: {flood['cancelled']} cancelled, "
        f"{flood['succeeded']} succeeded, {flood['failed']} failed, {flood['unfinished']} "
        "unfinished",
    )
    if wedges:
        found = wedges["recoveries"]
        ok = len(found) == len(wedges["windows"]) > 0 and all(
            v is not None for r in found for v in r.values()
        )
        check(
            "wedges_recovered",
            ok,
            f"{len(wedges['windows'])} wedges of {wedges['freeze_s']:g} s; after each thaw the "
            "first successful upload / search answered after "
            + "; ".join(
                " / ".join("never" if v is None else f"{v:.2f} s" for v in r.values())
                for r in found
            ),
        )
    rss = server["rss"]
    check(
        "server_rss",
        rss["samples"] > 0 and rss["peak_mib"] < rss["bound_mib"],
        f"VmRSS peak {rss['peak_mib']:,.0f} MiB over {rss['samples']} samples (start "
        f"{rss['start_mib']:,.0f} MiB; bound {rss['bound_mib']:,.0f} MiB: start + "
        f"{rss['bound_mib'] - rss['start_mib']:,.0f} MiB)",
    )
    logs = server["tracebacks"]
    check(
        "server_log_clean",
        logs["other_count"] == 0 and server["alive"],
        f"{logs['total']} tracebacks in the server log"
        + (
            f": {logs['outage']} of them the wedged database's errors, logged inside a wedge "
            "window ("
            + (", ".join(f"{k} {v}" for k, v in logs["outage_by_logger"].items()) or "none")
            + f"), {logs['other_count']} others"
            if wedges
            else ""
        )
        + (f" ({'; '.join(logs['others'][:3])})" if logs["others"] else "")
        + f"; server {'alive' if server['alive'] else 'DEAD'} at the end",
    )
    return checks
