"""bench.quality.querydoc --quick: the lemma → gloss scenario end to end on the committed fixture."""

import json
from pathlib import Path

import pytest

from bench.quality import querydoc


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
    assert len(lines) == 5 and all(line.endswith("met") or "missed by 0." in line for line in lines)
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
