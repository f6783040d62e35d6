"""``bench.perf.training --default-upgrade`` (``bench.perf.default_upgrade``): how it judges the
ETA, splits the wall time, builds the issue's data and renders its section."""

from __future__ import annotations

import numpy as np
import pytest

from bench.perf import default_upgrade


def test_the_eta_is_judged_against_the_time_actually_left() -> None:
    # A 100 s run; ETAs reported at 10, 30, 50 and 97 s.
    events = [
        {"t": 10.0, "eta_s": 10.0},  # before 20 %: not judged
        {"t": 30.0, "eta_s": 84.0},  # 70 s left: +20 %
        {"t": 50.0, "eta_s": 35.0},  # 50 s left: −30 %
        {"t": 97.0, "eta_s": 30.0},  # past 95 %: not judged
        {"t": 60.0, "eta_s": None},
    ]
    out = default_upgrade.eta_errors(events, 100.0)
    assert out["events_judged"] == 2
    assert out["max_abs_error"] == pytest.approx(0.3)
    assert out["worst"]["t"] == 50.0 and out["worst"]["left_s"] == pytest.approx(50.0)
    # The finish the ETA implied: 30 + 84 = 114 s (+14 %), 50 + 35 = 85 s (−15 %).
    assert out["max_abs_finish_error"] == pytest.approx(0.15)
    assert len(out["trace"]) == 4


def test_phases_split_the_wall_time_by_the_events() -> None:
    events = [
        {"t": 2.0, "phase": "training", "evaluated_s": 0.0},
        {"t": 5.0, "phase": "evaluating", "evaluated_s": 0.0},
        {"t": 9.0, "phase": "evaluating", "evaluated_s": 1.5},
    ]
    # 1.5 s of evaluations ended, then the last one from 9 s to the end (12 s).
    assert default_upgrade.phases(events, 12.0) == {"training": 7.5, "evaluating": 4.5}
    events[-1]["phase"] = "training"
    assert default_upgrade.phases(events, 12.0) == {"training": 10.5, "evaluating": 1.5}


def test_the_scenario_pairs_sixty_percent_and_keeps_the_rest_as_distractors() -> None:
    rng = np.random.default_rng(0)
    arrays = {
        "doc_old": rng.normal(size=(50, 4)).astype(np.float32),
        "doc_new": rng.normal(size=(50, 6)).astype(np.float32),
    }
    data, order = default_upgrade.scenario(arrays, seed=0)
    assert len(data) == 30 and data.n_distractors == 20 and data.queries is None
    assert sorted(order.tolist()) == list(range(50))
    np.testing.assert_array_equal(data.old_vectors, arrays["doc_old"][order[:30]])
    np.testing.assert_array_equal(data.distractors, arrays["doc_old"][order[30:]])


def test_the_section_renders_from_a_result() -> None:
    figures = {"recall@1": 0.5, "recall@10": 0.75}
    result = {
        "command": "python -m bench.perf.training --default-upgrade",
        "machine": {
            "cpu": "cpu",
            "cores": 2,
            "gpu": None,
            "python": "3.11",
            "torch": "2",
            "torch_threads": 2,
            "faiss": "1",
            "faiss_threads": 2,
            "numpy": "2",
            "date": "today",
        },
        "load_start": [1.0, 1.0, 1.0],
        "load_end": [2.0, 2.0, 2.0],
        "run": {
            "seed": 0,
            "halving": True,
            "items": 24000,
            "paired": 14400,
            "seconds": 240.0,
            "cpu_seconds": 400.0,
            "phases": {"training": 200.0, "evaluating": 40.0},
            "eta": default_upgrade.eta_errors([{"t": 100.0, "eta_s": 150.0}], 240.0),
            "epochs_trained": 200,
            "chosen": "instance-map",
            "recommendation": "measure",
            "held_out": {"stay": figures, "instance-map": figures, "reindex": figures},
            "held_out_items": 2880,
            "user_queries": 9600,
            "user_search": {"stay": figures, "bridge": figures, "reindex": figures},
            "candidates": {
                "procrustes": {
                    "chosen_settings": {},
                    "validation_r1": 0.97,
                    "trials": 1,
                    "epochs_trained": 0,
                }
            },
        },
    }
    text = default_upgrade.render_markdown(result)
    assert "| wall time | 240 s (4.0 min) |" in text
    assert "(at 42%: ETA 150 s, 140 s actually left)" in text
    assert "| bridge (`instance-map`) | 0.500 | 0.750 | 0.500 | 0.750 |" in text
