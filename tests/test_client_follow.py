"""``--wait`` / ``migrate`` follow a job: with stderr not a terminal (a log, CI, ``2>file``) they
print a progress line whenever the progress changes — a rich bar there printed nothing until the
end (issue 44 item 4: "--wait prints nothing when stdout is not a terminal")."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

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


@pytest.mark.parametrize("final", ["succeeded", "failed"])
def test_progress_lines_when_stderr_is_not_a_terminal(
    final: str, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(commands, "PROGRESS_LINE_S", 0.0)
    states = [
        job("queued"),
        job("running", phase="training", candidate="affine", epoch=1, epochs=3),
        job("running", phase="training", candidate="affine", epoch=1, epochs=3),  # unchanged
        job("running", phase="training", candidate="affine", epoch=2, epochs=3),
        job(final),
    ]
    args = argparse.Namespace(poll=0.0, timeout=None, json=False)
    code = commands.follow(FakeClient(states), args, "upg_x")
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("upgrade upg_x: ")]
    assert lines == [
        "upgrade upg_x: queued",
        "upgrade upg_x: running, training, affine, epoch 1/3",
        "upgrade upg_x: running, training, affine, epoch 2/3",
        f"upgrade upg_x: {final}",
    ]
    assert code == (0 if final == "succeeded" else commands.EXIT_FAILED)


def test_lines_are_throttled(capsys: pytest.CaptureFixture, monkeypatch) -> None:
    monkeypatch.setattr(commands, "PROGRESS_LINE_S", 3600.0)
    states = [job("running", epoch=e, epochs=9) for e in range(1, 9)] + [job("succeeded")]
    args = argparse.Namespace(poll=0.0, timeout=None, json=False)
    assert commands.follow(FakeClient(states), args, "upg_x") == 0
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("upgrade upg_x: ")]
    assert lines == ["upgrade upg_x: running, epoch 1/9"]  # the first, then an hour's silence
