"""A full disk: recognising it, and what the service knows about its data directory's space.

``ENOSPC`` (no space left), ``EDQUOT`` (a quota reached) and ``EFBIG`` (a file-size limit, as
``RLIMIT_FSIZE`` sets) all mean the same to a client: nothing was stored, and retrying is useless
until an operator makes room. Every write path stages its files before the database commits
(segments, temp files renamed into place), so such an error leaves the committed state as it
was: the request answers ``507 Insufficient Storage`` (``errors.py``), and the index files, a
cache of the database, are written again once space is back.

``StorageHealth`` is the state ``/readyz`` reports: marked full by any of those errors (a write's,
the index flusher's, the startup check's), and cleared when a probe write in the data directory
succeeds again (``recheck``: at most every ``recheck_s``, from ``/readyz`` and the index
flusher) or when an index file is written. ``recheck`` also notices a disk that filled before
any write failed (less than a probe's worth free).
"""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
# PostgreSQL's class 53 "insufficient resources": disk_full (its data directory is full).
PG_DISK_FULL = "53100"
# A probe of this size must fit for the data directory to count as writable again.
PROBE_BYTES = 64 * 1024


def is_no_space(exc: BaseException | None) -> bool:
    """``exc`` (or an error it wraps: SQLAlchemy's ``orig``, a cause or context) says the disk,
    a quota or a file-size limit is full."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in NO_SPACE_ERRNOS:
            return True
        if isinstance(exc, sqlite3.Error) and getattr(exc, "sqlite_errorcode", None) == 13:
            return True  # SQLITE_FULL: "database or disk is full"
        if getattr(exc, "sqlstate", None) == PG_DISK_FULL:
            return True
        text = str(exc).lower()
        if "database or disk is full" in text or "no space left on device" in text:
            return True
        orig = getattr(exc, "orig", None)
        exc = orig if isinstance(orig, BaseException) else (exc.__cause__ or exc.__context__)
    return False


@dataclass(frozen=True)
class StorageState:
    full: bool
    detail: str
    since: float | None


class StorageHealth:
    """Whether the data directory took the last write, shared by the requests and the threads
    of one API process."""

    def __init__(self, directory: Path, recheck_s: float = 10.0) -> None:
        self.directory = directory
        self.recheck_s = recheck_s
        self._lock = threading.Lock()
        self._full_since: float | None = None
        self._detail = ""
        self._last_probe = float("-inf")

    def mark_full(self, where: str, exc: BaseException) -> None:
        """Record a full disk; the first failure is what /readyz reports until it clears."""
        with self._lock:
            first = self._full_since is None
            if first:
                self._full_since = time.time()
                self._detail = f"{where}: {type(exc).__name__}: {exc}"
        if first:
            log.error("storage full (%s); writes answer 507 until space is freed", self._detail)

    def mark_ok(self) -> None:
        with self._lock:
            was_full = self._full_since is not None
            self._full_since, self._detail = None, ""
        if was_full:
            log.warning("storage writable again; writes resume")

    @property
    def full(self) -> bool:
        return self._full_since is not None

    def state(self) -> StorageState:
        with self._lock:
            return StorageState(self._full_since is not None, self._detail, self._full_since)

    def recheck(self, force: bool = False) -> StorageState:
        """At most every ``recheck_s`` (unless ``force``): while marked full, a probe write that
        fits clears the state; otherwise a data directory with less than a probe's worth of
        space free (``statvfs``, no write) is probed, and marked full if the probe fails."""
        now = time.monotonic()
        if not force and now - self._last_probe < self.recheck_s:
            return self.state()
        self._last_probe = now
        if self._full_since is None and available_bytes(self.directory) >= PROBE_BYTES:
            return self.state()
        try:
            probe(self.directory)
        except OSError as exc:
            if not is_no_space(exc):
                raise
            self.mark_full("probe write in the data directory", exc)
        else:
            self.mark_ok()
        return self.state()


def available_bytes(directory: Path) -> int:
    """Bytes an unprivileged writer may still use on ``directory``'s file system."""
    try:
        stats = os.statvfs(directory)
    except OSError:
        return 0
    return stats.f_bavail * stats.f_frsize


def probe(directory: Path, size: int = PROBE_BYTES) -> None:
    """Write ``size`` bytes to a hidden file in ``directory``, fsync, and remove it: raises the
    ``OSError`` of a full disk (space is reserved by the write itself, not by a sparse seek)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f".space-probe-{os.getpid()}-{threading.get_ident()}"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(bytes(size))
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
    finally:
        path.unlink(missing_ok=True)
