"""Startup migrations that cannot get their locks (issue 45 item 7): on PostgreSQL a migration
waiting behind another session's lock gives up after ``MIGRATION_LOCK_TIMEOUT_MS`` (or
``MIGRATION_STATEMENT_TIMEOUT_MS``), the start fails saying why — the API's lifespan and
``nobackfill migrate`` alike — and nothing was changed: once the lock is gone the same migration
runs. Each test runs the migrations in a thread it waits for a bounded time, so a migration that
hangs fails the test instead of holding it."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, inspect

from app.core.db import MigrationTimeout, migrate
from app.core.settings import Settings, get_settings
from app.main import create_app
from tests.service.conftest import TEST_KEY

# 0011 adds a column to `models` (ALTER TABLE: an ACCESS EXCLUSIVE lock) and writes
# alembic_version: either held by another session blocks it.
BEFORE, TARGET = "0010", "0011"


@contextmanager
def lock_held(url: str, table: str, mode: str) -> Iterator[None]:
    """Another session holding ``mode`` on ``table`` inside an open transaction."""
    dsn = url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(dsn) as holder:
        holder.execute(f'LOCK TABLE "{table}" IN {mode} MODE')
        try:
            yield
        finally:
            holder.rollback()


def bounded(call: Callable[[], Any], limit_s: float = 30.0) -> tuple[BaseException | None, float]:
    """Run ``call`` in a thread; its exception (None on success) and how long it took. A call
    still running after ``limit_s`` fails the test: a migration that hangs."""
    outcome: dict[str, BaseException | None] = {"error": None}

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # the test inspects it
            outcome["error"] = exc

    tic = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit_s)
    assert not thread.is_alive(), f"the migration still waits after {limit_s} s"
    return outcome["error"], time.monotonic() - tic


def settings_for(tmp_path: Path, url: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "data_dir": tmp_path / "data",
        "database_url": url,
        "job_runner": "inline",
        "bootstrap_key": TEST_KEY,
        "local_key": False,
        "log_level": "warning",
        **overrides,
    }
    return Settings(_env_file=None, **values)


def has_column(url: str, table: str, column: str) -> bool:
    engine = create_engine(url)
    try:
        return column in {c["name"] for c in inspect(engine).get_columns(table)}
    finally:
        engine.dispose()


@pytest.fixture
def behind_one_migration(fresh_postgres: str, tmp_path: Path) -> str:
    migrate(fresh_postgres, BEFORE, settings=settings_for(tmp_path, fresh_postgres))
    return fresh_postgres


@pytest.mark.parametrize(
    ("table", "mode"),
    [("alembic_version", "ACCESS EXCLUSIVE"), ("models", "ACCESS SHARE")],
    ids=["version-table-exclusive", "altered-table-read"],
)
@pytest.mark.parametrize(
    ("limits", "named"),
    [
        ({"migration_lock_timeout_ms": 1000}, "lock_timeout"),
        (
            {"migration_lock_timeout_ms": 0, "migration_statement_timeout_ms": 1000},
            "statement_timeout",
        ),
    ],
    ids=["lock-timeout", "statement-timeout"],
)
def test_a_migration_behind_a_held_lock_gives_up_and_changes_nothing(
    behind_one_migration: str,
    tmp_path: Path,
    table: str,
    mode: str,
    limits: dict[str, int],
    named: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = behind_one_migration
    settings = settings_for(tmp_path, url, **limits)
    with caplog.at_level(logging.ERROR), lock_held(url, table, mode):
        error, elapsed = bounded(lambda: migrate(url, TARGET, settings=settings))
    assert isinstance(error, MigrationTimeout), repr(error)
    assert elapsed < 6, elapsed
    text = str(error)
    assert named in text and "nothing was changed" in text
    assert "NOBACKFILL_MIGRATION_" in text
    assert any(named in record.getMessage() for record in caplog.records)
    # Rolled back whole: the column is not there, and the lock gone, the migration runs.
    assert not has_column(url, "models", "embedder_id")
    error, _ = bounded(lambda: migrate(url, TARGET, settings=settings))
    assert error is None, repr(error)
    assert has_column(url, "models", "embedder_id")


def test_the_api_start_fails_saying_why_instead_of_hanging(
    behind_one_migration: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = behind_one_migration
    app = create_app(settings_for(tmp_path, url, migration_lock_timeout_ms=1000))
    with caplog.at_level(logging.ERROR), lock_held(url, "models", "ACCESS SHARE"):
        error, elapsed = bounded(lambda: TestClient(app).__enter__())
    assert isinstance(error, MigrationTimeout), repr(error)
    assert elapsed < 6, elapsed
    assert any("lock_timeout" in record.getMessage() for record in caplog.records)


def test_nobackfill_migrate_exits_1_saying_why(
    behind_one_migration: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from app.cli import main

    monkeypatch.setenv("NOBACKFILL_DATABASE_URL", behind_one_migration)
    monkeypatch.setenv("NOBACKFILL_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("NOBACKFILL_MIGRATION_LOCK_TIMEOUT_MS", "1000")
    get_settings.cache_clear()
    codes: list[int] = []
    try:
        with lock_held(behind_one_migration, "models", "ACCESS SHARE"):
            error, elapsed = bounded(lambda: codes.append(main(["migrate"])))
    finally:
        get_settings.cache_clear()
    assert error is None, repr(error)
    assert codes == [1]
    assert elapsed < 6, elapsed
    assert "lock_timeout" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["-1", "soon"])
@pytest.mark.parametrize("name", ["MIGRATION_LOCK_TIMEOUT_MS", "MIGRATION_STATEMENT_TIMEOUT_MS"])
def test_migration_timeouts_from_the_environment_are_validated(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(f"NOBACKFILL_{name}", value)
    with pytest.raises(ValueError, match=name.lower()):
        Settings(_env_file=None)
