"""bench.perf.engines: one engine alone (``--engines``), as a 1M-row run needs on 24 GB."""

import json
from pathlib import Path

import pytest

from bench.perf import engines


def test_one_engine_alone_writes_its_figures_only(tmp_path: Path) -> None:
    out = tmp_path / "new-folder" / "faiss.json"
    argv = ["--quick", "--engines", "faiss", "--radii", "1", "--out", str(out)]
    result = engines.main(argv)
    assert "faiss" in result and "milvus" not in result
    written = json.loads(out.read_text())
    assert written["faiss"]["recall_at_10"] == {"cosine_r1": 1.0, "spread_r1": 1.0}
    assert written["command"].endswith("--engines faiss --radii 1 --out " + str(out))


def test_unknown_engines_are_refused() -> None:
    with pytest.raises(SystemExit):
        engines.main(["--quick", "--engines", "faiss,elastic"])
