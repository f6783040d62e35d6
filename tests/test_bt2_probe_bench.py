"""bench.quality.bt2_probe: both arms through auto on the same splits, paired differences, and
the BENCHMARKS section written from the committed results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.common.report import BENCHMARKS
from bench.common.stats import t_interval
from bench.common.wordnet import REPO_ROOT
from bench.quality import bt2_probe


@pytest.fixture(scope="module")
def quick_result(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("bt2") / "bt2.json"
    bt2_probe.main(["--quick", "--seeds", "2", "--out", str(out)])
    return json.loads(out.read_text())


def test_quick_run_measures_both_arms_on_each_split(quick_result: dict) -> None:
    runs = quick_result["runs"]
    assert [r["seed"] for r in runs] == [0, 1]
    for run in runs:
        for arm in bt2_probe.ARMS:
            served = run["arms"][arm]
            assert served["chosen"] in (arm, "procrustes")
            # 3 + 2 trials, every one of the bt2 arm with its extra dimensions.
            assert len(served["tried"]) == 5
            if arm == "class-map-bt2":
                assert {t["extra_dims"] for t in served["tried"]} == {128}
            else:
                assert all("extra_dims" not in t for t in served["tried"])
        for part in bt2_probe.PARTS:
            rows = run[part]
            assert {"stay", *bt2_probe.ARMS} <= set(rows)
            for arm in bt2_probe.ARMS:
                assert 0.0 <= rows[arm]["class"]["cmc1"] <= 1.0
                assert rows[arm]["p_com"]["cmc1"] is not None


def test_the_difference_row_pairs_each_seed(quick_result: dict) -> None:
    runs = quick_result["runs"]
    a = [r["evaluation"]["class-map"]["class"]["cmc1"] for r in runs]
    b = [r["evaluation"]["class-map-bt2"]["class"]["cmc1"] for r in runs]
    mean, low, high = t_interval([y - x for x, y in zip(a, b, strict=True)])
    text = bt2_probe.summary_markdown(quick_result)
    first_diff_row = next(line for line in text.splitlines() if line.startswith("| bt2 − "))
    assert first_diff_row.split(" | ")[1] == f"{mean:+.3f} [{low:+.3f}, {high:+.3f}]"
    # A development probe never scores the held-back items (issue 42 item 3).
    assert all("held_back" not in r for r in runs)
    assert "Held-back items" not in text and "Evaluation part" in text


def test_benchmarks_section_is_the_committed_results() -> None:
    result = json.loads(Path(REPO_ROOT / "bench/results/bt2_probe.json").read_text())
    assert not result["quick"] and len(result["runs"]) >= 3
    section = BENCHMARKS.read_text().split(f"<!-- {bt2_probe.SECTION}:start -->")[1]
    section = section.split(f"<!-- {bt2_probe.SECTION}:end -->")[0]
    assert bt2_probe.summary_markdown(result).strip() in section
