"""The soak (issue 24, item 6): ``bench.perf.soak --quick`` runs two tenants' uploads, searches
and upgrades beside stalled, trickled, oversized and forged requests against a real server, and
every check holds. Its checker is a pure function: fed a fabricated run with a lost write, a 5xx
or a hostile request that got through, it fails it."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import bench.perf.soak
from bench.perf.soak_checks import (
    CLOSED,
    HEALTHY_EXPECTED,
    HOSTILE_EXPECTED,
    HOSTILE_MAY_CLOSE,
    NO_ANSWER,
    Tally,
    WriteLog,
    evaluate,
    lost_writes,
)

# Generous: the quick run measured a worst-kind p99 of ~0.5 s on the 2 shared cores; a loaded
# CI machine may be several times slower, and a flaky bound would teach people to ignore it.
CI_P99_BOUND_MS = 5000.0


@pytest.mark.slow
def test_quick_soak_passes_every_check(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    argv = ["--quick", "--out", str(out), "--p99-bound-ms", str(CI_P99_BOUND_MS)]
    result = bench.perf.soak.main(argv)
    failed = {name: c["detail"] for name, c in result["checks"].items() if not c["ok"]}
    assert not failed, (failed, result["server"]["log_tail"])
    # The same, spelled out.
    for group in ("healthy", "hostile"):
        for kind, s in result[group].items():
            assert s["requests"] > 0, kind
            assert all(k != NO_ANSWER and int(k) < 500 for k in s["statuses"]), (kind, s)
    for kind, s in result["hostile"].items():
        if kind == "big_search_streamed":  # issue 45: streamed to its done line
            assert set(s["statuses"]) == {"200"}, s
            continue
        assert all(
            (k == CLOSED and kind in HOSTILE_MAY_CLOSE) or 400 <= int(k) < 500
            for k in s["statuses"]
        ), (kind, s)
    rss = result["server"]["rss"]
    assert rss["samples"] > 0 and rss["peak_mib"] < rss["bound_mib"], rss
    assert result["server"]["responses_5xx"] == 0
    writes = result["writes"]
    assert writes["acked_ids"] > 0 and not writes["lost_live"] and not writes["lost_after_restart"]
    assert writes["galleries"]["mallory"] == {"count": 0, "acked_ids": 0}
    assert max(s["p99_ms"] for s in result["healthy"].values()) < CI_P99_BOUND_MS
    assert result["jobs"]["succeeded"] > 0 and result["jobs"]["cancelled"] > 0
    assert json.loads(out.read_text())["checks"] == result["checks"]


def rows(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, 4)).astype(np.float32)


def test_lost_writes_finds_a_missing_and_a_changed_vector() -> None:
    sent = rows(3)
    acked = {"a": sent[0], "b": sent[1], "c": sent[2]}
    assert lost_writes(acked, dict(acked)) == []
    changed = sent[1].copy()
    changed[2] += 1e-3
    lost = lost_writes(acked, {"a": sent[0], "b": changed})
    assert len(lost) == 2
    assert lost[0].startswith("b: read back differs") and lost[1].startswith("c: acknowledged")


def test_write_log_keeps_the_last_acknowledged_vector() -> None:
    log = WriteLog()
    first, second, refused, unknown = rows(4)[:, None, :]
    log.settle(["a"], first, 200)
    log.settle(["a"], second, 200)
    log.settle(["a"], refused, 422)  # a clear refusal: never stored
    assert np.array_equal(log.acked["a"], second[0]) and not log.unsettled
    assert lost_writes(log.acked, {"a": first[0]}, log.unsettled) != []  # the older vector
    assert lost_writes(log.acked, {"a": refused[0]}, log.unsettled) != []
    log.settle(["a"], unknown, None)  # no answer: stored or not
    assert lost_writes(log.acked, {"a": unknown[0]}, log.unsettled) == []
    assert lost_writes(log.acked, {"a": second[0]}, log.unsettled) == []
    assert log.acked_requests == 2


def good_run() -> dict[str, Any]:
    def summary(expected: set[int], status: int) -> dict[str, Any]:
        tally = Tally()
        for _ in range(10):
            tally.add(status, 0.01, expected)
        return tally.summary(expected)

    return {
        "healthy": {k: summary(e, min(e)) for k, e in HEALTHY_EXPECTED.items()},
        "hostile": {k: summary(e, min(e)) for k, e in HOSTILE_EXPECTED.items()},
        "writes": {
            "acked_ids": 10,
            "lost_live": [],
            "lost_after_restart": [],
            "galleries": {"alpha": {"count": 10, "acked_ids": 10}},
        },
        "jobs": {"created": 3, "succeeded": 2, "cancelled": 1, "failed": 0, "unfinished": 0},
        "server": {
            "responses_5xx": 0,
            "tracebacks": 0,
            "alive": True,
            "rss": {"start_mib": 400.0, "peak_mib": 600.0, "bound_mib": 1424.0, "samples": 40},
        },
    }


def failed(run: dict[str, Any], bound: float = 1000.0) -> list[str]:
    return [name for name, c in evaluate(run, bound).items() if not c["ok"]]


def test_evaluate_passes_a_good_run() -> None:
    assert failed(good_run()) == []


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        ("healthy 500", ["no_5xx", "healthy_as_expected"]),
        ("hostile 503", ["no_5xx", "hostile_refused_4xx"]),
        ("server 5xx", ["no_5xx"]),
        ("hostile stored", ["hostile_refused_4xx"]),
        ("hostile no answer", ["hostile_refused_4xx"]),
        ("healthy no answer", ["healthy_as_expected"]),
        ("lost write", ["no_lost_write"]),
        ("lost after restart", ["no_lost_write"]),
        ("phantom write", ["no_lost_write"]),
        ("slow", ["healthy_p99"]),
        ("kind never ran", ["every_kind_ran"]),
        ("job failed", ["jobs_end_well"]),
        ("traceback", ["server_log_clean"]),
        ("rss over bound", ["server_rss"]),
        ("rss never sampled", ["server_rss"]),
        ("stream cut", ["hostile_refused_4xx"]),
        ("big search answered", ["hostile_refused_4xx"]),
        ("closed where an answer is due", ["hostile_refused_4xx"]),
        ("slowloris closed", []),
    ],
)
def test_evaluate_fails_a_damaged_run(damage: str, expected: list[str]) -> None:
    run = copy.deepcopy(good_run())
    healthy, hostile, writes = run["healthy"], run["hostile"], run["writes"]
    if damage == "healthy 500":
        healthy["upload_json"]["statuses"]["500"] = 1
    elif damage == "hostile 503":
        hostile["stalled_body"]["statuses"]["503"] = 1
    elif damage == "server 5xx":
        run["server"]["responses_5xx"] = 1
    elif damage == "hostile stored":
        hostile["nan_json"]["statuses"]["200"] = 1
    elif damage == "hostile no answer":
        hostile["trickle_body"]["statuses"][NO_ANSWER] = 1
    elif damage == "healthy no answer":
        healthy["search_npy"]["statuses"][NO_ANSWER] = 1
    elif damage == "lost write":
        writes["lost_live"] = lost_writes({"x": rows(1)[0]}, {})
    elif damage == "lost after restart":
        writes["lost_after_restart"] = ["x: acknowledged, not read back"]
    elif damage == "phantom write":
        writes["galleries"]["alpha"]["count"] = 11
    elif damage == "slow":
        healthy["search_json"]["p99_ms"] = 1000.5
    elif damage == "kind never ran":
        hostile["wrong_key"] = Tally().summary(HOSTILE_EXPECTED["wrong_key"])
    elif damage == "job failed":
        run["jobs"]["failed"] = 1
    elif damage == "traceback":
        run["server"]["tracebacks"] = 1
    elif damage == "rss over bound":
        run["server"]["rss"]["peak_mib"] = 1424.5
    elif damage == "rss never sampled":
        run["server"]["rss"]["samples"] = 0
    elif damage == "stream cut":
        hostile["big_search_streamed"]["statuses"][NO_ANSWER] = 1
    elif damage == "big search answered":
        hostile["big_search"]["statuses"]["200"] = 1
    elif damage == "closed where an answer is due":
        hostile["junk_key_body"]["statuses"][CLOSED] = 1
    elif damage == "slowloris closed":  # the server may close it instead of answering 408
        hostile["header_slowloris"]["statuses"][CLOSED] = 1
    assert failed(run) == expected
