"""Read-only connections to attached tables' databases, kept open between searches.

Opening a PostgreSQL connection starts a backend on the owner's server: on this project's
machine about 30 ms, against 2-3 ms for one search through an HNSW index of a million rows
(``bench.perf.pgvector_scale``), so a connection per request made every search of an attached
table cost ten times the search. ``pooled`` keeps up to ``keep`` idle connections per exact set
of connection parameters (the same database, user, password and options: never one tenant's
connection for another's parameters) and hands each to one caller at a time.

A connection goes back only after its caller finished without error; its transaction is rolled
back first, which ends every ``SET LOCAL`` and the read-only transaction (nothing was written).
One taken from the stack is checked with a round trip first (``SELECT 1``): the server may have
restarted or closed it since; a dead one is dropped and the next one (or a new connection)
used, so a server that went down answers as before (the connect fails: 503) and one that came
back is used again. Connections idle longer than ``MAX_IDLE_S`` are closed at the next use of
any of them. In a forked child (a Celery prefork worker) the parent's connections are left
alone, never closed: closing them would end the parent's sessions on the shared sockets.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg

# Seconds an idle connection is kept: long enough for a burst of searches, short enough not to
# hold a backend on the owner's server for a service that has gone quiet.
MAX_IDLE_S = 60.0

_lock = threading.Lock()
_idle: dict[tuple[tuple[str, str], ...], list[tuple[float, psycopg.Connection]]] = {}
# A forked child's inherited connections: referenced forever so that nothing finalises them.
_inherited: list[Any] = []


def _key(params: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((name, str(value)) for name, value in params.items()))


def _close(conn: psycopg.Connection) -> None:
    with contextlib.suppress(Exception):
        conn.close()


def _expired(now: float) -> list[psycopg.Connection]:
    """Remove (under the lock) and return the connections idle longer than MAX_IDLE_S."""
    old: list[psycopg.Connection] = []
    for key, stack in list(_idle.items()):
        keep = [(since, conn) for since, conn in stack if now - since <= MAX_IDLE_S]
        old.extend(conn for since, conn in stack if now - since > MAX_IDLE_S)
        if keep:
            _idle[key] = keep
        else:
            del _idle[key]
    return old


def _take(key: tuple[tuple[str, str], ...]) -> psycopg.Connection | None:
    """A live idle connection for ``key``, or None."""
    while True:
        with _lock:
            stale = _expired(time.monotonic())
            stack = _idle.get(key)
            found = stack.pop()[1] if stack else None
        for conn in stale:
            _close(conn)
        if found is None:
            return None
        try:
            found.execute("SELECT 1")
            return found
        except psycopg.Error:
            _close(found)


def _give(key: tuple[tuple[str, str], ...], conn: psycopg.Connection, keep: int) -> None:
    with _lock:
        stack = _idle.setdefault(key, [])
        if len(stack) < keep:
            stack.append((time.monotonic(), conn))
            return
    _close(conn)


@contextlib.contextmanager
def pooled(params: dict[str, Any], keep: int) -> Iterator[psycopg.Connection]:
    """A connection with ``params`` (an idle one if there is one); kept afterwards when fewer
    than ``keep`` are idle and the caller raised nothing, closed otherwise."""
    key = _key(params)
    conn = _take(key) if keep > 0 else None
    if conn is None:
        conn = psycopg.connect(**params)
    finished = False
    try:
        yield conn
        finished = True
    finally:
        if finished and keep > 0 and not conn.closed and not conn.broken:
            try:
                conn.rollback()
            except psycopg.Error:
                _close(conn)
            else:
                _give(key, conn, keep)
        else:
            _close(conn)


def close_all() -> None:
    """Close every idle connection (the process is ending)."""
    with _lock:
        stacks = list(_idle.values())
        _idle.clear()
    for stack in stacks:
        for _, conn in stack:
            _close(conn)


def _forget_inherited() -> None:
    _inherited.extend(_idle.values())
    _idle.clear()


atexit.register(close_all)
os.register_at_fork(after_in_child=_forget_inherited)
