"""What every attached vector database shares (Qdrant, Milvus): the multi-tenant rules on what a
tenant's ``source`` may make the server open, connect to, or send, and the process's one client
per place (``Connections``) and what their searchers share (``AttachedSearcher``).

A tenant names the place; the server goes there with its own network position and its own
environment. So a URL must fall under an entry the operator allowed (``url_allowed``), a file
must lie under a root folder the operator chose (``under_root``), and a credential is read from a
server environment variable only when its name carries the operator's prefix (``env_secret``):
otherwise a tenant could reach internal hosts, read arbitrary files, or have the server send any
of its secrets (the database URL…) to a URL of the tenant's choosing.

Embedded stores (a Qdrant local-mode folder, a milvus-lite file) lock their files to one client
and are not safe for concurrent calls: the process keeps one client per place and serialises
calls to a local one.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar
from urllib.parse import urlsplit

from app.core.errors import Problem, invalid, unavailable

Client = TypeVar("Client")


class CountsPoints(Protocol):
    def points(self, gallery: Any) -> int: ...


Storage = TypeVar("Storage", bound=CountsPoints)


def url_parts(url: str) -> tuple[str, str, int | None, str] | None:
    """(scheme, host, port, path) of an http(s) URL, the port made explicit; None for others
    (or a URL with credentials in it, which no entry should vouch for)."""
    try:
        parsed = urlsplit(url)
        port = parsed.port
    except ValueError:
        return None
    if parsed.scheme not in ("http", "https") or not parsed.hostname or parsed.username:
        return None
    default = 443 if parsed.scheme == "https" else 80
    return parsed.scheme, parsed.hostname.lower(), port or default, parsed.path or "/"


def url_allowed(entries: list[str], url: str) -> bool:
    """Whether ``url`` falls under an entry: the same scheme, host and port (compared parsed, so
    ``http://db:6333.evil`` is not under ``http://db:6333``), and a path starting with the
    entry's."""
    given = url_parts(url)
    for entry in entries:
        allowed = url_parts(entry)
        if given is None or allowed is None or given[:3] != allowed[:3]:
            continue
        prefix = allowed[3] if allowed[3].endswith("/") else allowed[3] + "/"
        if given[3] == allowed[3] or (given[3] + "/").startswith(prefix):
            return True
    return False


def under_root(root: Path, path: str) -> Path | None:
    """``path`` (relative: taken from ``root``) resolved, symlinks included; None when it lies
    outside ``root``."""
    try:
        resolved = (root / path).resolve()
    except (ValueError, OSError):  # a NUL byte, a name too long: no path of the disk
        return None
    return resolved if resolved == root or root in resolved.parents else None


def env_secret(prefix: str, name: str | None, field: str) -> str | None:
    """The value of the server environment variable ``name`` (None: no secret); 422 on
    ``field`` unless the name carries ``prefix`` and the variable is set."""
    if name is None:
        return None
    if not name.startswith(prefix):
        raise invalid(field, f"must be {prefix} or start with it")
    value = os.environ.get(name)
    if not value:
        raise invalid(field, f"the server has no environment variable {name}")
    return value


class Connection(Generic[Client]):
    """One client and the lock its calls take (a local, embedded store's: not thread-safe)."""

    def __init__(self, client: Client, local: bool) -> None:
        self.client = client
        self.local = local
        self._lock: contextlib.AbstractContextManager[Any] = (
            threading.Lock() if local else contextlib.nullcontext()
        )

    @contextlib.contextmanager
    def use(self) -> Iterator[Client]:
        with self._lock:
            yield self.client


class Connections(Generic[Client]):
    """The process's clients of one engine, one per place (``key``), opened on first use."""

    def __init__(self) -> None:
        self._open: dict[tuple[str, ...], Connection[Client]] = {}
        self._guard = threading.Lock()

    def get(
        self, key: tuple[str, ...], opener: Callable[[], Connection[Client]]
    ) -> Connection[Client]:
        with self._guard:
            if key not in self._open:
                self._open[key] = opener()
            return self._open[key]

    def close(self, closer: Callable[[Client], None]) -> None:
        """Close every client (an embedded store's lock goes with it)."""
        with self._guard:
            opened = list(self._open.values())
            self._open.clear()
        for conn in opened:
            with conn.use() as client:
                closer(client)


@contextlib.contextmanager
def unreachable_is_503(
    is_unreachable: Callable[[BaseException], bool], detail: str, retry_after_s: int
) -> Iterator[None]:
    """While the service uses an attached collection: a transport failure (``is_unreachable``)
    answers 503 with ``detail`` and Retry-After; any other error passes through."""
    try:
        yield
    except Problem:
        raise
    except Exception as exc:
        if not is_unreachable(exc):
            raise
        raise unavailable(detail, retry_after_s) from exc


class AttachedSearcher(Generic[Storage]):
    """An attached collection behind the index calls the search services make (``ntotal`` here,
    ``search_with_points`` in each engine's subclass); built per request, it holds no rows."""

    def __init__(self, storage: Storage, gallery: Any) -> None:
        self.dim = gallery.dim
        self._storage = storage
        self._gallery = gallery

    @property
    def ntotal(self) -> int:
        return self._storage.points(self._gallery)
