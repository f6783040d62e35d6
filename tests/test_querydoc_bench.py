"""bench.querydoc --quick: the lemma → gloss scenario end to end on the committed fixture."""

import json
from pathlib import Path

import pytest

from bench import querydoc


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
