"""Index files beside the database, one per gallery and version, written atomically.

The database is the truth; an index file is a cache named ``<gallery_id>.v<version>.npz`` after
the gallery's ``index_version``, which every change of the vectors bumps in its transaction.
Rewriting a whole gallery's file on every acknowledged write would make an ingest cost
O(gallery size), so with ``flush_interval_s > 0`` a change only marks the gallery dirty and a
background thread writes dirty galleries at most once per interval (and ``close`` writes the
rest). After a crash at any moment a file is either complete (temp file, fsync, rename) or absent,
and one whose version is not the committed one is stale: the startup check rebuilds it from the
stored vectors.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.core.files import write_atomically_with
from app.core.storage import StorageHealth, is_no_space
from app.vectors.faiss.index import LorentzIndex

log = logging.getLogger(__name__)

FILE_PATTERN = re.compile(r"^(?P<gallery>[A-Za-z0-9_]+)\.v(?P<version>\d+)\.npz$")


@dataclass(frozen=True)
class IndexSpec:
    """What an index of one gallery looks like, read from its database row."""

    gallery_id: str
    version: int
    dim: int
    curv: float
    kind: str
    params: dict


# (ids, points) of every stored vector of a gallery, read from the database.
PointLoader = Callable[[], tuple[np.ndarray, np.ndarray]]


class IndexStore:
    """In-memory indexes keyed by gallery, kept equal to the database's committed version."""

    def __init__(
        self,
        directory: Path,
        *,
        use_gpu: bool = False,
        engine: str = "auto",
        flush_interval_s: float = 0.0,
        health: StorageHealth | None = None,
    ) -> None:
        """``flush_interval_s`` 0 writes the file inside every change (library use, benchmarks);
        above 0 changes are written by ``flush``, which ``start``'s thread calls that often.
        ``health`` learns of a full disk (an index file that could not be written stays dirty,
        in memory, until a later flush writes it) and of its end."""
        self.directory = directory
        self.health = health
        self.use_gpu = use_gpu
        self.engine = engine
        self.flush_interval_s = flush_interval_s
        self._indexes: dict[str, tuple[int, LorentzIndex]] = {}
        self._locks: dict[str, threading.RLock] = {}
        self._guard = threading.Lock()
        # Galleries whose in-memory index is newer than their file.
        self._dirty: set[str] = set()
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None

    def lock(self, gallery_id: str) -> threading.RLock:
        """Serialises writers of one gallery inside this process."""
        with self._guard:
            return self._locks.setdefault(gallery_id, threading.RLock())

    def path(self, gallery_id: str, version: int) -> Path:
        return self.directory / f"{gallery_id}.v{version}.npz"

    def _persist(self, gallery_id: str, version: int, index: LorentzIndex) -> None:
        write_atomically_with(self.path(gallery_id, version), index.write_to)
        self._remove_files(gallery_id, keep_version=version)
        self._clean(gallery_id)
        if self.health is not None and self.health.full:
            self.health.mark_ok()

    def _persist_or_defer(self, gallery_id: str, version: int, index: LorentzIndex) -> bool:
        """``_persist``, except that a full disk leaves the gallery dirty for a later flush
        instead of failing the caller: the file is a cache of committed rows (the database and
        the in-memory index already hold the change), so the change stands and is served. False
        when deferred."""
        try:
            self._persist(gallery_id, version, index)
        except OSError as exc:
            if not is_no_space(exc):
                raise
            with self._guard:
                self._dirty.add(gallery_id)
            # Once per episode, not once per flush interval while the disk stays full.
            report = log.debug if self.health is not None and self.health.full else log.warning
            if self.health is not None:
                self.health.mark_full(f"index file of gallery {gallery_id}", exc)
            report("index file of gallery %s not written (%s); kept dirty", gallery_id, exc)
            return False
        return True

    def _clean(self, gallery_id: str) -> None:
        with self._guard:
            self._dirty.discard(gallery_id)

    def _changed(self, spec: IndexSpec, index: LorentzIndex) -> None:
        """Adopt ``index`` as the gallery's state at ``spec.version`` (caller holds the lock)."""
        self._indexes[spec.gallery_id] = (spec.version, index)
        if self.flush_interval_s > 0:
            with self._guard:
                self._dirty.add(spec.gallery_id)
        else:
            self._persist_or_defer(spec.gallery_id, spec.version, index)

    # -- background writes ----------------------------------------------------------------------
    def start(self) -> None:
        if self.flush_interval_s > 0 and self._flusher is None:
            self._stop.clear()
            self._flusher = threading.Thread(
                target=self._flush_loop, name="index-flusher", daemon=True
            )
            self._flusher.start()

    def _flush_loop(self) -> None:
        while not self._stop.wait(self.flush_interval_s):
            try:
                if self.health is not None:
                    # Also the periodic re-check of a full disk when nothing waits to be written.
                    self.health.recheck()
                self.flush()
            except Exception:
                # The files are only a cache: the next flush or the startup check retries.
                log.exception("index flush failed")

    def flush(self) -> list[str]:
        """Write every dirty gallery's file at its in-memory version; returns the galleries
        written. On a full disk the rest stay dirty for the next flush."""
        written = []
        with self._guard:
            pending = sorted(self._dirty)
        for gallery_id in pending:
            with self.lock(gallery_id):
                cached = self._indexes.get(gallery_id)
                if gallery_id not in self._dirty or cached is None:
                    self._clean(gallery_id)
                    continue
                if not self._persist_or_defer(gallery_id, cached[0], cached[1]):
                    break  # the disk is full: the next flush tries again
                written.append(gallery_id)
        return written

    def close(self) -> None:
        """Stop the background thread and write what is still dirty (a clean shutdown leaves
        every file current, so the next start loads instead of rebuilding)."""
        self._stop.set()
        if self._flusher is not None:
            self._flusher.join(timeout=60)
            self._flusher = None
        self.flush()

    def _remove_files(self, gallery_id: str, keep_version: int | None = None) -> None:
        if not self.directory.exists():
            return
        for file in self.directory.iterdir():
            match = FILE_PATTERN.match(file.name)
            if match and match["gallery"] == gallery_id and int(match["version"]) != keep_version:
                file.unlink(missing_ok=True)

    def _build(self, spec: IndexSpec, load_points: PointLoader) -> LorentzIndex:
        ids, points = load_points()
        return LorentzIndex.build(
            spec.dim,
            spec.curv,
            spec.kind,
            spec.params,
            ids,
            points,
            use_gpu=self.use_gpu,
            engine=self.engine,
        )

    def _load_file(self, spec: IndexSpec) -> LorentzIndex | None:
        path = self.path(spec.gallery_id, spec.version)
        if not path.exists():
            return None
        try:
            index = LorentzIndex.read_from(path, use_gpu=self.use_gpu, engine=self.engine)
        except Exception as exc:  # any unreadable file (torn zip, bad header, …) is rebuilt
            log.warning("index file %s unreadable (%r); rebuilding", path.name, exc)
            return None
        if index.dim != spec.dim or index.kind != spec.kind or index.params != spec.params:
            log.warning("index file %s has another shape; rebuilding", path.name)
            return None
        return index

    def current_version(self, gallery_id: str) -> int | None:
        """The version of the gallery's index in memory (None: none loaded)."""
        cached = self._indexes.get(gallery_id)
        return None if cached is None else cached[0]

    def get(self, spec: IndexSpec, load_points: PointLoader) -> LorentzIndex:
        """The index at ``spec.version`` or newer: from memory, else its file, else rebuilt and
        saved. Versions only grow, so a newer index in memory is a later view of the same
        gallery: a reader that read the gallery just before a write committed gets it (see
        ``current_version``), where rebuilding at its older version would cost a scan of the
        whole gallery and set the store back, making the writer's next patch a rebuild too."""
        cached = self._indexes.get(spec.gallery_id)
        if cached is not None and cached[0] >= spec.version:
            return cached[1]
        with self.lock(spec.gallery_id):
            # A writer of this process holds the lock from its commit to its patch: waiting for
            # it here finds its version in memory.
            cached = self._indexes.get(spec.gallery_id)
            if cached is not None and cached[0] >= spec.version:
                return cached[1]
            index = self._load_file(spec)
            if index is None:
                index = self._build(spec, load_points)
                log.info(
                    "index for gallery %s rebuilt from %d stored vectors (version %d)",
                    spec.gallery_id,
                    index.ntotal,
                    spec.version,
                )
                self._changed(spec, index)
            else:
                self._indexes[spec.gallery_id] = (spec.version, index)
            return index

    def apply(
        self,
        spec: IndexSpec,
        previous_version: int,
        load_points: PointLoader,
        *,
        upsert_ids: np.ndarray | None = None,
        upsert_points: np.ndarray | None = None,
        remove_ids: np.ndarray | None = None,
    ) -> LorentzIndex:
        """After a committed change ``previous_version`` → ``spec.version``: patch the index in
        memory when it is at ``previous_version`` (else rebuild from the database), then save
        it now or mark it for the next flush."""
        with self.lock(spec.gallery_id):
            cached = self._indexes.get(spec.gallery_id)
            if cached is not None and cached[0] == previous_version:
                index = cached[1]
                if remove_ids is not None and len(remove_ids):
                    index.remove(remove_ids)
                if upsert_ids is not None and len(upsert_ids):
                    index.upsert(upsert_ids, upsert_points)
            else:
                index = self._build(spec, load_points)
            self._changed(spec, index)
            return index

    def verify(self, spec: IndexSpec, stored_ids: np.ndarray, load_points: PointLoader) -> str:
        """Startup check: the file for the committed version must hold exactly the stored ids.
        Returns what was done (``ok``, ``rebuilt: <reason>``) and logs any repair."""
        with self.lock(spec.gallery_id):
            index = self._load_file(spec)
            reason = None
            if index is None:
                reason = "no index file for the committed version"
            elif index.ntotal != len(stored_ids) or not np.array_equal(
                np.sort(index.ids), np.sort(np.asarray(stored_ids, dtype=np.int64))
            ):
                reason = f"index holds {index.ntotal} ids, the database {len(stored_ids)}"
            if reason is not None:
                index = self._build(spec, load_points)
                # Written now, not at the next flush: a repaired file must not wait for a crash.
                # On a full disk it is served from memory and written once space is back: the
                # start must not fail (a service that cannot start serves nothing at all).
                self._persist_or_defer(spec.gallery_id, spec.version, index)
                log.warning(
                    "startup check: index for gallery %s rebuilt from %d stored vectors (%s)",
                    spec.gallery_id,
                    index.ntotal,
                    reason,
                )
            else:
                self._remove_files(spec.gallery_id, keep_version=spec.version)
            self._indexes[spec.gallery_id] = (spec.version, index)
            return "ok" if reason is None else f"rebuilt: {reason}"

    def forget(self, gallery_id: str) -> None:
        """Drop the in-memory copy (the next use reloads or rebuilds it)."""
        with self.lock(gallery_id):
            self._indexes.pop(gallery_id, None)
            self._clean(gallery_id)

    def drop(self, gallery_id: str) -> None:
        with self.lock(gallery_id):
            self._indexes.pop(gallery_id, None)
            self._clean(gallery_id)
            self._remove_files(gallery_id)

    def remove_orphans(self, known_gallery_ids: set[str]) -> list[str]:
        """Delete files of galleries the database no longer has (and stray temp files)."""
        removed = []
        if not self.directory.exists():
            return removed
        for file in self.directory.iterdir():
            match = FILE_PATTERN.match(file.name)
            stray_tmp = file.name.startswith(".") and file.name.endswith(".tmp")
            if stray_tmp or (match and match["gallery"] not in known_gallery_ids):
                file.unlink(missing_ok=True)
                removed.append(file.name)
        if removed:
            log.warning("startup check: removed %d orphan index files", len(removed))
        return removed
