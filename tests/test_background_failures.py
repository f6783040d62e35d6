"""Background loops (the job sweep, job slots, the returned tally's writer) meet a database
outage as one rate-limited warning, and any other failure with its traceback: during the soak's
wedged database each failed round wrote a full traceback (a log flood that hid real errors)."""

from __future__ import annotations

import logging

import pytest
from sqlalchemy.exc import OperationalError

from app.core import errors
from app.core.errors import log_background_failure
from app.migration.returned import ReturnedTally


def _outage() -> OperationalError:
    return OperationalError("SELECT 1", {}, Exception("could not connect to server: refused"))


@pytest.fixture(autouse=True)
def fresh_outage_log(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(errors, "_outage_state", {"last": 0.0, "suppressed": 0})


def test_an_outage_is_one_warning_without_traceback(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("app.upgrades.runner")
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            log_background_failure(logger, "job sweep failed", _outage())
    lines = [r for r in caplog.records if "job sweep failed" in r.getMessage()]
    assert len(lines) == 1  # the other two rounds within the interval are counted, not logged
    assert lines[0].levelno == logging.WARNING and lines[0].exc_info is None
    assert "database unavailable" in lines[0].getMessage()


def test_any_other_failure_keeps_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("app.upgrades.runner")
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            log_background_failure(logger, "job sweep failed", ValueError("a bug"))
    lines = [r for r in caplog.records if r.name == "app.upgrades.runner"]
    assert len(lines) == 2 and all(r.levelno == logging.ERROR for r in lines)
    assert all(r.exc_info is not None and r.exc_info[0] is ValueError for r in lines)


def test_the_tally_writer_logs_an_outage_as_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    tally = ReturnedTally(enabled=True, flush_s=1.0)

    def unavailable() -> None:
        raise _outage()

    monkeypatch.setattr(tally, "flush", unavailable)
    with caplog.at_level(logging.WARNING):
        tally.stop()  # the final flush meets the outage
    lines = [r for r in caplog.records if "final returned tally flush failed" in r.getMessage()]
    assert len(lines) == 1 and lines[0].exc_info is None
