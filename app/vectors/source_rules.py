"""What every attached vector database shares (Qdrant, Milvus, pgvector): the multi-tenant rules
on what a tenant's ``source`` may make the server open, connect to, or send, and the process's
one client per place (``Connections``); what their storages and searchers share is
``app.vectors.attached``.

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
import hashlib
import os
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Generic, TypeVar
from urllib.parse import unquote, urlsplit

from app.core.errors import Problem, invalid, unavailable

Client = TypeVar("Client")


def _without_dot_segments(path: str) -> str:
    """RFC 3986 §5.2.4 on a decoded path: ``.`` and ``..`` segments applied (never above the
    root), empty segments dropped, the trailing slash kept."""
    kept: list[str] = []
    segments = path.split("/")
    for segment in segments:
        if segment == "..":
            if kept:
                kept.pop()
        elif segment not in ("", "."):
            kept.append(segment)
    trailing = bool(kept) and segments[-1] in ("", ".", "..")
    return ("/" + "/".join(kept) + ("/" if trailing else "")) if kept else "/"


def normalized_url(url: str) -> str | None:
    """``url`` in the one spelling the service checks and connects to: an http(s) URL with its
    host in lower case, its path percent-decoded once and its dot segments applied (so
    ``http://h/qd/../mv`` is ``http://h/mv``, and so is ``http://h/qd/%2e%2e/mv``). None for
    anything no allowlist entry should vouch for: another scheme, credentials, a query or a
    fragment, a backslash, whitespace or control characters, or a path still encoded after one
    decoding (``%252e``: the next hop would decode it again)."""
    if any(c == "\\" or c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        return None
    try:
        parsed = urlsplit(url)
        port = parsed.port
    except ValueError:
        return None
    if (
        parsed.scheme.lower() not in ("http", "https")
        or not parsed.hostname
        or parsed.username is not None
        or parsed.password is not None
        or parsed.query
        or parsed.fragment
        or url.endswith(("?", "#"))
    ):
        return None
    path = unquote(parsed.path)
    if "%" in path or any(c == "\\" or c.isspace() or ord(c) < 32 for c in path):
        return None
    host = parsed.hostname.lower()
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    netloc = host if port is None else f"{host}:{port}"
    path = _without_dot_segments(path) if parsed.path else ""
    return f"{parsed.scheme.lower()}://{netloc}{path}"


def url_parts(url: str) -> tuple[str, str, int, str] | None:
    """(scheme, host, port, path) of an http(s) URL after ``normalized_url``, the port made
    explicit; None for what ``normalized_url`` refuses."""
    normal = normalized_url(url)
    if normal is None:
        return None
    parsed = urlsplit(normal)
    default = 443 if parsed.scheme == "https" else 80
    assert parsed.hostname is not None
    return parsed.scheme, parsed.hostname, parsed.port or default, parsed.path or "/"


def place_of(url: str) -> str | None:
    """The server a URL reaches, as one string (``url_parts`` joined, no trailing slash):
    two spellings of one place give the same string. None where ``url_parts`` is None."""
    parts = url_parts(url)
    if parts is None:
        return None
    scheme, host, port, path = parts
    host = f"[{host}]" if ":" in host else host
    return f"{scheme}://{host}:{port}{path.rstrip('/')}"


def owner_key(engine: str, place: str, collection: str) -> str:
    """The key of one collection on one server (``place_of``) in the owners' table: a digest,
    since the place alone may be 2 KiB long."""
    return hashlib.sha256(f"{engine}\n{place}\n{collection}".encode()).hexdigest()


def server_collection(source: dict[str, Any]) -> tuple[str, str, str] | None:
    """(engine, place, collection) of an attached source on a server; None for an embedded
    store (a folder or file of its tenant's own) or a URL ``place_of`` refuses. A pgvector
    table's place is its database (``dsn_place``), its collection the table."""
    engine = source.get("engine")
    if engine == "pgvector":
        dsn = source.get("dsn")
        found = dsn_place(dsn) if isinstance(dsn, str) else None
        return None if found is None else (engine, found, str(source.get("table")))
    url = source.get("url") if engine == "qdrant" else source.get("uri")
    if engine not in ("qdrant", "milvus") or not isinstance(url, str):
        return None
    place = place_of(url)
    return None if place is None else (engine, place, str(source.get("collection")))


# The libpq parameters a tenant's DSN may carry: where (host, port, database), who, and TLS
# mode. Every other one is refused: ``passfile``, ``sslkey``, ``sslrootcert`` and ``service``
# make the server read files of its disk, ``hostaddr`` connects elsewhere than ``host`` says,
# ``options`` sets server settings, and ``password`` belongs in a server variable.
DSN_KEYS = frozenset({"host", "port", "dbname", "user", "sslmode"})
PG_PORT = 5432


def dsn_parts(dsn: str) -> dict[str, str] | None:
    """A PostgreSQL DSN (a ``postgresql://`` URI or ``key=value`` pairs) as libpq reads it, with
    ``port`` made explicit; None for one the service does not connect to: unparsable, a key
    outside ``DSN_KEYS``, several hosts, no host (libpq's default socket) or no database."""
    from psycopg import conninfo

    try:
        parts = conninfo.conninfo_to_dict(dsn)
    except Exception:  # psycopg.ProgrammingError: not a DSN
        return None
    parts = {key: str(value) for key, value in parts.items() if value is not None}
    host, port, dbname = parts.get("host", ""), parts.get("port", str(PG_PORT)), parts.get("dbname")
    if (
        set(parts) - DSN_KEYS
        or not host
        or "," in host
        or not port.isdigit()
        or not dbname
        or any(c.isspace() or ord(c) < 32 for value in parts.values() for c in value)
    ):
        return None
    parts["host"] = host if host.startswith("/") else host.lower()
    parts["port"] = str(int(port))
    return parts


def dsn_place(dsn: str) -> str | None:
    """The database a DSN reaches, as one string (host or socket folder, port, database): two
    spellings of one database give the same string. None where ``dsn_parts`` is None."""
    parts = dsn_parts(dsn)
    if parts is None:
        return None
    host = parts["host"]
    if host.startswith("/"):
        host = _without_dot_segments(host).rstrip("/") or "/"
    return f"postgresql://{host}:{parts['port']}/{parts['dbname']}"


def dsn_allowed(entries: list[str], dsn: str) -> bool:
    """Whether ``dsn`` names the database of an entry: the same host (or socket folder), port
    and database (``dsn_place``); user and TLS mode may differ."""
    place = dsn_place(dsn)
    return place is not None and any(dsn_place(entry) == place for entry in entries)


def url_allowed(entries: list[str], url: str) -> bool:
    """Whether ``url`` falls under an entry: the same scheme, host and port (compared parsed, so
    ``http://db:6333.evil`` is not under ``http://db:6333``), and a path starting with the
    entry's, both normalised first (``normalized_url``: ``/qd/../mv`` is not under ``/qd``)."""
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


# A tenant name that can stand as its own folder under an attach root: lower case (two names
# that differ in case must not share a folder on a case-insensitive disk), no dot first, and
# never the shape of a tenant id (``ten_…``), the folder of every other tenant.
_FOLDER_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_TENANT_ID = re.compile(r"ten_[0-9a-f]{1,60}")


def tenant_folder(tenant_id: str, tenant_name: str) -> str:
    """The folder, under each attach root, that holds a tenant's embedded stores (Qdrant
    local-mode folders, milvus-lite files): its name where that is a plain folder name
    (``local`` for ``make serve``'s tenant), else its id. Two tenants never share one: names are
    unique, and no name folder has an id's shape."""
    if _FOLDER_NAME.fullmatch(tenant_name) and not tenant_name.startswith("ten_"):
        return tenant_name
    return tenant_id


def tenant_root(root: Path, folder: str | None) -> Path | None:
    """The tenant's own folder under ``root`` (``tenant_folder``); None for a source recorded
    without one (attached before tenants had folders: it may name another tenant's store)."""
    if folder is None or not (_FOLDER_NAME.fullmatch(folder) or _TENANT_ID.fullmatch(folder)):
        return None
    resolved = under_root(root, folder)
    return None if resolved is None or resolved == root else resolved


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
