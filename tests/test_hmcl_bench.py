"""The continual benchmark's bookkeeping: continual figures, its BENCHMARKS.md section, and one
small end-to-end pass over real fixture rows."""

from __future__ import annotations

import numpy as np
import pytest

from bench.continual import (
    Task,
    continual_figures,
    render_markdown,
    run_method,
    summarise,
)

MINILM = "all-MiniLM-L6-v2"


def test_continual_figures_on_a_known_matrix() -> None:
    # rows: after task t; columns: task i (upper triangle never read)
    matrix = np.array([[0.5, np.nan, np.nan], [0.4, 0.6, np.nan], [0.3, 0.5, 0.7]])
    figures = continual_figures(matrix)
    assert figures["final"] == pytest.approx(0.5)
    assert figures["bwt"] == pytest.approx(((0.3 - 0.5) + (0.5 - 0.6)) / 2)
    assert figures["overall"] == pytest.approx((0.5 + 0.5 + 0.5) / 3)


def _fixture_tasks(wordnet_small: dict) -> list[Task]:
    lexnames = sorted(set(wordnet_small["lexname"]))
    label_index = {c: i for i, c in enumerate(wordnet_small["classes"])}
    tasks = []
    for half in (lexnames[: len(lexnames) // 2], lexnames[len(lexnames) // 2 :]):
        rows = np.array([i for i, lex in enumerate(wordnet_small["lexname"]) if lex in half])
        train, test = rows[::2], rows[1::2]
        classes = sorted({label_index[lab] for lab in wordnet_small["label"][test]})
        local = {c: k for k, c in enumerate(classes)}
        tasks.append(
            Task(
                name="+".join(half),
                train={m: wordnet_small[f"{m}.{MINILM}"][train] for m in ("lemma", "gloss")},
                test={m: wordnet_small[f"{m}.{MINILM}"][test] for m in ("lemma", "gloss")},
                test_labels=np.array(
                    [local[label_index[lab]] for lab in wordnet_small["label"][test]]
                ),
                class_names=wordnet_small[f"class_lemma.{MINILM}"][classes],
            )
        )
    return tasks


def test_one_small_stream_produces_every_figure(wordnet_small: dict) -> None:
    tasks = _fixture_tasks(wordnet_small)
    params = {"epochs": 3, "min_steps": 0, "dim": 64}
    runs = {
        m: [run_method(m, tasks, params, seed=s) for s in (0, 1)] for m in ("hmcl-ca", "finetune")
    }
    ca = runs["hmcl-ca"][0]
    assert set(ca["drift"]) == {"radial", "angular", "cross_modal", "paired_distance"}
    assert 0.0 < ca["recall_at_5"]["final"] <= 1.0
    # Version at task 1's end is the one both rotations are measured from: all four variants
    # are fractions of the same task-end recall.
    assert all(v > 0.5 for v in ca["no_backfill_fraction"].values())
    summary = summarise(runs)
    assert summary["hmcl-ca"]["recall_at_5.final"]["sd"] >= 0.0
    timing = {
        "rows": 1,
        "repeats": 1,
        **{
            m: {
                "step_ms_median": 1.0,
                "correction_ms_median": 0.0,
                "ratio_median": 1.0,
                "ratio_iqr": [1.0, 1.0],
            }
            for m in runs
        },
    }
    result = {
        "command": "test",
        "date": "today",
        "seconds": 0.0,
        "torch": "x",
        "threads": 1,
        "config": {"methods": list(runs), "seeds": [0, 1], "epochs": 3},
        "tasks": [{"name": t.name, "train": 1, "test": 1, "classes": 1} for t in tasks],
        "summary": summary,
        "timing": timing,
        "params": {"lr": 5e-4},
    }
    markdown = render_markdown(result)
    assert "| hmcl-ca |" in markdown and "| finetune |" in markdown
