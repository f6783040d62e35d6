"""Tests never need the full WordNet-noun data: the lookup points nowhere during the suite, the
loaders refuse it clearly, and the benchmarks' --quick modes fall back to the mini fixture."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import bench.data.reference_figures
from bench.common.wordnet import (
    FIXTURE_DATA_DIR,
    OLD_MODEL,
    default_data_dir,
    has_data,
    load_wordnet,
    quick_data_dir,
)
from bench.quality.continual_stream import CLASSES_PER_TASK, CLASSIFICATION_TASKS, stream_classes
from tests.conftest import NO_DATA_DIR


def test_the_suite_points_the_data_lookup_at_an_empty_folder() -> None:
    assert default_data_dir() == Path(NO_DATA_DIR)
    assert not any(Path(NO_DATA_DIR).iterdir())
    with pytest.raises(FileNotFoundError, match="NOBACKFILL_WORDNET_DIR"):
        load_wordnet()


def test_a_quick_run_falls_back_to_the_mini_fixture_and_says_so(monkeypatch, capsys) -> None:
    monkeypatch.setenv("NOBACKFILL_WORDNET_DIR", NO_DATA_DIR)
    assert quick_data_dir("bench.example") == FIXTURE_DATA_DIR
    assert "bench.example --quick" in capsys.readouterr().err
    # The fallback becomes the process's default, so every loader of the run reads it.
    assert os.environ["NOBACKFILL_WORDNET_DIR"] == str(FIXTURE_DATA_DIR)
    assert default_data_dir() == FIXTURE_DATA_DIR


def test_a_quick_run_keeps_real_data_where_there_is_some(monkeypatch, tmp_path: Path) -> None:
    (tmp_path / "meta.jsonl.gz").write_bytes(b"")
    monkeypatch.setenv("NOBACKFILL_WORDNET_DIR", str(tmp_path))
    assert quick_data_dir("bench.example") == tmp_path


def test_the_mini_fixture_holds_the_continual_stream() -> None:
    assert has_data(FIXTURE_DATA_DIR)
    data = load_wordnet(FIXTURE_DATA_DIR, models=(OLD_MODEL,))
    ancestors = load_wordnet(FIXTURE_DATA_DIR, models=(OLD_MODEL,), prefix="ancestors.")
    tasks = stream_classes(data.meta)
    assert [len(t) for t in tasks] == [CLASSES_PER_TASK] * CLASSIFICATION_TASKS
    # Every dealt class has a name row, in the main rows or the ancestor rows.
    named = {m["synset_id"] for m in data.meta} | {m["synset_id"] for m in ancestors.meta}
    assert {c for t in tasks for c in t} <= named
    gloss = data.get("gloss", OLD_MODEL)
    # Real sentence-encoder rows: unit norm up to float16 rounding.
    assert np.allclose(np.linalg.norm(gloss, axis=1), 1.0, atol=1e-2)


def test_the_reference_check_fails_on_a_figure_that_differs(monkeypatch, capsys) -> None:
    checks = {"x": lambda _dir: [("agrees", 0.5, 0.5, 1e-3), ("differs", 0.5, 0.6, 1e-3)]}
    monkeypatch.setattr(bench.data.reference_figures, "CHECKS", checks)
    assert bench.data.reference_figures.main([]) == 1
    out = capsys.readouterr().out
    assert "ok   x: agrees" in out and "FAIL x: differs" in out
