"""``--wait`` on a terminal: one bar for the whole job (issue 44 item 4: the bar followed one
trial's epochs and jumped back, ``epoch 13/15`` → ``epoch 4/15``), the candidate beside it."""

from __future__ import annotations

import argparse
import io
from typing import Any

import pytest
from rich.console import Console
from rich.progress import Progress

from app.client import commands


class FakeClient:
    def __init__(self, states: list[dict[str, Any]]) -> None:
        self.states = states

    def wait_upgrade(self, upgrade_id, *, poll_s, timeout_s, on_progress) -> dict[str, Any]:
        for job in self.states:
            on_progress(job)
        return self.states[-1]


def job(status: str, **progress: Any) -> dict[str, Any]:
    return {"id": "upg_x", "method": "auto", "status": status, "progress": progress}


def _follow(states: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """Follow ``states`` on a (fake) terminal; every (completed, total, info) the bar showed."""
    shown: list[tuple] = []
    real_update = Progress.update

    def update(self: Progress, task_id: Any, **kwargs: Any) -> None:
        real_update(self, task_id, **kwargs)
        task = self._tasks[task_id]
        shown.append((task.completed, task.total, task.fields.get("info")))

    monkeypatch.setattr(Progress, "update", update)
    console = Console(file=io.StringIO(), force_terminal=True, width=160)
    monkeypatch.setattr(commands, "stderr_console", lambda: console)
    args = argparse.Namespace(poll=0.0, timeout=None, json=False)
    assert commands.follow(FakeClient(states), args, "upg_x") == 0
    return shown


def test_the_bar_follows_the_whole_job_not_one_trial(monkeypatch: pytest.MonkeyPatch) -> None:
    training = {"phase": "training", "candidate": "hbct", "epochs": 15, "trials": 5}
    states = [
        job("queued"),
        job("running", **training, trial=1, stage="screening", epoch=13, job_fraction=0.30),
        # The next trial starts at epoch 4 of its own count; the job is further on.
        job("running", **training, trial=2, stage="screening", epoch=4, job_fraction=0.35),
        job("running", **training, trial=2, stage="final", epoch=15, job_fraction=0.9),
        job("succeeded", epoch=15, epochs=15, job_fraction=1.0),
    ]
    shown = _follow(states, monkeypatch)
    shares = [c / t for c, t, _ in shown if t]
    assert shares == sorted(shares)  # never back
    assert shares[-1] == pytest.approx(1.0)
    infos = [info for _, _, info in shown if info and "hbct" in info]
    assert any("trial 2/5 (screening)" in i and "35% of the job" in i for i in infos)


def test_a_job_without_a_share_keeps_the_epoch_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    states = [job("running", epoch=2, epochs=4), job("succeeded")]
    shown = _follow(states, monkeypatch)
    assert (2, 4) in [(c, t) for c, t, _ in shown]


def test_progress_text_names_the_trial_and_the_share() -> None:
    text = commands.progress_text(
        {
            "phase": "training",
            "candidate": "affine",
            "trial": 3,
            "trials": 5,
            "stage": "final",
            "epoch": 2,
            "epochs": 15,
            "job_fraction": 0.424,
            "eta_s": 61.0,
        }
    )
    assert text == ("training, affine, trial 3/5 (final), epoch 2/15, 42% of the job, ETA 61 s")
