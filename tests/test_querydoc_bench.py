"""bench.quality.querydoc --quick: the lemma → gloss scenario end to end on the committed fixture."""

import json
from pathlib import Path

import pytest

from bench.quality import querydoc

# The targets, restated here so that the lines are checked against the figures.
R10_NO_LOG, ARR_R10_LOG, INSTANCE_SHARE = 0.46, 0.87, 0.95


def expected_targets(summary: dict) -> list[tuple[list[str], float, float]]:
    """Per target line, in order: (figures the line must show, measured value, threshold)."""
    out = []
    for variant in querydoc.VARIANTS:
        if variant in summary:
            a, p = summary[variant]["auto"], summary[variant]["procrustes"]
            share = a["own_r1"][0] / p["own_r1"][0]
            out.append(([f"{a['own_r1'][0]:.3f}", f"{share:.2f}"], share, INSTANCE_SHARE))
    if (no_log := summary.get(querydoc.VARIANTS[0])) is not None:
        a, p = no_log["auto"], no_log["procrustes"]
        out.append(([f"{a['recall@10'][0]:.3f}"], a["recall@10"][0], R10_NO_LOG))
        shown = [f"{a['recall@1'][0]:.3f}", f"{p['recall@1'][0]:.3f}"]
        out.append((shown, a["recall@1"][0], p["recall@1"][0]))
    if (log := summary.get(querydoc.VARIANTS[1])) is not None:
        out.append(([f"{log['auto']['arr@10'][0]:.3f}"], log["auto"]["arr@10"][0], ARR_R10_LOG))
    return out


def check_target_lines(lines: list[str], summary: dict) -> None:
    """Each line shows its figures and states the verdict they give: "met" at or above the
    threshold, else "missed by" the gap to it."""
    expected = expected_targets(summary)
    assert len(lines) == len(expected), lines
    for line, (shown, value, threshold) in zip(lines, expected, strict=True):
        verdict = "met" if value >= threshold else f"missed by {threshold - value:.3f}"
        assert line.endswith(f" — {verdict}"), (line, verdict)
        assert all(figure in line for figure in shown), (line, shown)


def _table(own_r1: float, r1: float, r10: float, arr10: float) -> dict:
    figures = {"own_r1": own_r1, "recall@1": r1, "recall@10": r10, "arr@10": arr10}
    return {k: [v, 0.0] for k, v in figures.items()}


def _summary(auto_no_log: tuple, auto_log: tuple) -> dict:
    procrustes = _table(1.0, 0.25, 0.45, 0.80)
    return {
        querydoc.VARIANTS[0]: {"auto": _table(*auto_no_log), "procrustes": procrustes},
        querydoc.VARIANTS[1]: {"auto": _table(*auto_log), "procrustes": procrustes},
    }


def test_targets_state_met_or_the_margin_they_are_missed_by() -> None:
    assert (querydoc.TARGET_R10_NO_LOG, querydoc.TARGET_ARR_R10_LOG) == (R10_NO_LOG, ARR_R10_LOG)
    assert querydoc.TARGET_INSTANCE_SHARE == INSTANCE_SHARE
    # Below every target: own-item share 0.90, R@10 0.40, R@1 below procrustes's, ARR 0.80.
    low = _summary((0.90, 0.20, 0.40, 0.0), (0.91, 0.0, 0.0, 0.80))
    lines = querydoc.targets(low)
    assert [line.rsplit(" — ", 1)[1] for line in lines] == [
        "missed by 0.050",
        "missed by 0.040",
        "missed by 0.060",
        "missed by 0.050",
        "missed by 0.070",
    ]
    check_target_lines(lines, low)
    # Above every target.
    high = _summary((0.97, 0.30, 0.50, 0.0), (0.96, 0.0, 0.0, 0.90))
    lines = querydoc.targets(high)
    assert all(line.endswith(" — met") for line in lines)
    check_target_lines(lines, high)
    # Only one variant measured: its lines alone.
    one = {querydoc.VARIANTS[1]: high[querydoc.VARIANTS[1]]}
    assert len(querydoc.targets(one)) == 2
    check_target_lines(querydoc.targets(one), one)


def test_the_target_check_fails_on_a_wrong_line() -> None:
    low = _summary((0.90, 0.20, 0.40, 0.0), (0.91, 0.0, 0.0, 0.80))
    lines = querydoc.targets(low)
    # A miss reported as met, a wrong margin, lines read from other figures, a line missing.
    for wrong in (
        [lines[0].replace("missed by 0.050", "met"), *lines[1:]],
        [lines[0], lines[1].replace("0.040", "0.400"), *lines[2:]],
        querydoc.targets(_summary((0.97, 0.30, 0.50, 0.0), (0.96, 0.0, 0.0, 0.90))),
        lines[:-1],
    ):
        with pytest.raises(AssertionError):
            check_target_lines(wrong, low)
    # A summary whose figures the lines do not show.
    shifted = _summary((0.90, 0.20, 0.41, 0.0), (0.91, 0.0, 0.0, 0.80))
    with pytest.raises(AssertionError):
        check_target_lines(lines, shifted)


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
    lines = querydoc.targets(payload["summary"])
    assert len(lines) == 5
    check_target_lines(lines, payload["summary"])
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
