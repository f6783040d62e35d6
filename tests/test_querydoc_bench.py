"""bench.quality.querydoc --quick: the lemma → gloss scenario end to end on the committed fixture."""

import json
from pathlib import Path

import pytest

from bench.common.stats import t_interval, target_state
from bench.quality import querydoc

# The targets, restated here so that the lines are checked against the figures.
R10_NO_LOG, ARR_R10_LOG, INSTANCE_SHARE = 0.46, 0.87, 0.95


def expected_targets(summary: dict, runs: list[dict]) -> list[tuple[str, tuple]]:
    """Per target line, in order: (the verdict it must state, the interval it is judged on) —
    a 95 % t interval over the seeds of the paired per-seed difference to the threshold."""

    def seeds(variant: str, name: str, view: str, metric: str) -> list[float]:
        rows = sorted((r for r in runs if r["variant"] == variant), key=lambda r: r["seed"])
        return [r["rows"][name][view][metric] for r in rows]

    out = []
    for variant in querydoc.VARIANTS:
        if variant in summary:
            a = seeds(variant, "auto", "instance", "recall@1")
            p = seeds(variant, "procrustes", "instance", "recall@1")
            out.append(t_interval([x - INSTANCE_SHARE * y for x, y in zip(a, p, strict=True)]))
    if querydoc.VARIANTS[0] in summary:
        r10 = seeds(querydoc.VARIANTS[0], "auto", "query", "recall@10")
        out.append(t_interval([x - R10_NO_LOG for x in r10]))
        a = seeds(querydoc.VARIANTS[0], "auto", "query", "recall@1")
        p = seeds(querydoc.VARIANTS[0], "procrustes", "query", "recall@1")
        out.append(t_interval([x - y for x, y in zip(a, p, strict=True)]))
    if querydoc.VARIANTS[1] in summary:
        arr = seeds(querydoc.VARIANTS[1], "auto", "arr_query", "recall@10")
        out.append(t_interval([x - ARR_R10_LOG for x in arr]))
    return [(target_state(interval, 0.0), interval) for interval in out]


def check_target_lines(lines: list[str], summary: dict, runs: list[dict]) -> None:
    """Each line states the verdict its interval gives: "met" when it clears the threshold,
    "missed by" when it lies below, else "not shown"."""
    expected = expected_targets(summary, runs)
    assert len(lines) == len(expected), lines
    for line, (verdict, _) in zip(lines, expected, strict=True):
        state = line.rsplit(" — ", 1)[1]
        assert state.split(" by ")[0] == verdict.split(" by ")[0], (line, verdict)


def _runs(auto_no_log: list[tuple], auto_log: list[tuple]) -> list[dict]:
    """Runs per seed: auto's (own-item R@1, R@1, R@10, ARR@10) per variant; procrustes fixed."""

    def rows(own_r1: float, r1: float, r10: float, arr10: float) -> dict:
        return {
            "query": {"recall@1": r1, "recall@10": r10},
            "instance": {"recall@1": own_r1},
            "arr_query": {"recall@10": arr10},
        }

    procrustes = rows(1.0, 0.25, 0.45, 0.80)
    out = []
    for variant, per_seed in zip(querydoc.VARIANTS, (auto_no_log, auto_log), strict=True):
        for seed, figures in enumerate(per_seed):
            out.append(
                {
                    "seed": seed,
                    "variant": variant,
                    "rows": {"auto": {**rows(*figures), "chosen": "x"}, "procrustes": procrustes},
                }
            )
    return out


LOW = [(0.90, 0.20, 0.40, 0.0), (0.89, 0.21, 0.41, 0.0), (0.91, 0.19, 0.39, 0.0)]
LOW_LOG = [(0.91, 0.0, 0.0, 0.80), (0.90, 0.0, 0.0, 0.79), (0.92, 0.0, 0.0, 0.81)]
HIGH = [(0.97, 0.30, 0.50, 0.0), (0.972, 0.31, 0.51, 0.0), (0.971, 0.29, 0.49, 0.0)]
HIGH_LOG = [(0.965, 0.0, 0.0, 0.90), (0.966, 0.0, 0.0, 0.91), (0.967, 0.0, 0.0, 0.89)]


def test_targets_are_judged_on_intervals_over_the_seeds() -> None:
    assert (querydoc.TARGET_R10_NO_LOG, querydoc.TARGET_ARR_R10_LOG) == (R10_NO_LOG, ARR_R10_LOG)
    assert querydoc.TARGET_INSTANCE_SHARE == INSTANCE_SHARE
    low = _runs(LOW, LOW_LOG)
    lines = querydoc.targets(querydoc.summarise(low), low)
    assert [line.rsplit(" — ", 1)[1] for line in lines] == [
        "missed by 0.050",
        "missed by 0.040",
        "missed by 0.060",
        "missed by 0.050",
        "missed by 0.070",
    ]
    check_target_lines(lines, querydoc.summarise(low), low)
    high = _runs(HIGH, HIGH_LOG)
    lines = querydoc.targets(querydoc.summarise(high), high)
    assert all(line.endswith(" — met") for line in lines)
    check_target_lines(lines, querydoc.summarise(high), high)
    # Seeds on both sides of a threshold: not shown, whatever the mean says.
    mixed = _runs([(0.97, 0.30, 0.50, 0.0), (0.90, 0.20, 0.40, 0.0)], HIGH_LOG[:2])
    lines = querydoc.targets(querydoc.summarise(mixed), mixed)
    assert lines[0].endswith("not shown") and lines[2].endswith("not shown"), lines
    # One seed has no interval: nothing is met.
    one = _runs(HIGH[:1], HIGH_LOG[:1])
    assert all(
        line.endswith("not shown") for line in querydoc.targets(querydoc.summarise(one), one)
    )


def test_the_target_check_fails_on_a_wrong_line() -> None:
    low = _runs(LOW, LOW_LOG)
    summary = querydoc.summarise(low)
    lines = querydoc.targets(summary, low)
    high = _runs(HIGH, HIGH_LOG)
    for wrong in (
        [lines[0].replace("missed by 0.050", "met"), *lines[1:]],
        querydoc.targets(querydoc.summarise(high), high),
        lines[:-1],
    ):
        with pytest.raises(AssertionError):
            check_target_lines(wrong, summary, low)


@pytest.mark.slow
def test_quick_run_reports_every_alternative_and_the_targets(tmp_path: Path) -> None:
    out = querydoc.main(["--quick", "--out", str(tmp_path / "q.json")])
    payload = json.loads(out.read_text())
    assert payload["quick"] and payload["n_items"] == 800
    for variant in querydoc.VARIANTS:
        table = payload["summary"][variant]
        assert {"stay", "reindex", "procrustes", "instance-map", "auto"} <= set(table)
        assert table["reindex"]["arr@10"][0] == 1.0
        assert table["stay"]["recall@10"][0] > 0
    lines = querydoc.targets(payload["summary"], payload["runs"])
    assert len(lines) == 5
    check_target_lines(lines, payload["summary"], payload["runs"])
    assert "| **auto** (chose" in querydoc.render_markdown(payload)


@pytest.mark.slow
def test_seeds_run_apart_merge_into_one_summary(tmp_path: Path) -> None:
    files = []
    for seed in (0, 1):
        out = tmp_path / f"seed{seed}.json"
        querydoc.main(["--quick", "--seeds", str(seed), "--variants", "nolog", "--out", str(out)])
        files.append(out)
    merged_path = tmp_path / "merged.json"
    querydoc.main(["--merge", *map(str, files), "--no-markdown", "--out", str(merged_path)])
    merged = json.loads(merged_path.read_text())
    parts = [json.loads(f.read_text()) for f in files]
    assert merged["seeds"] == [0, 1] and len(merged["runs"]) == 2
    assert merged["elapsed_minutes"] == pytest.approx(sum(p["elapsed_minutes"] for p in parts))
    auto_r10 = [p["summary"]["without query log"]["auto"]["recall@10"][0] for p in parts]
    mean, sd = merged["summary"]["without query log"]["auto"]["recall@10"]
    assert mean == pytest.approx(sum(auto_r10) / 2) and sd >= 0
    assert "--merge" in merged["command"]
    with pytest.raises(ValueError, match="more than one file"):
        querydoc.merge([files[0], files[0]], tmp_path / "twice.json", markdown=False)
