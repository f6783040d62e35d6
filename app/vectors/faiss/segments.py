"""Vectors in append-only segment files, the database holding each gallery's manifest.

Layout: ``<data_dir>/vectors/<gallery_id>/<seq>.seg``, each a run of checksummed batches
(``segment_format``). The gallery row's ``vector_manifest`` names the segments and, for each, the
committed byte length and record count, the next internal id and a version bumped by every
change.

Why an acknowledged write survives a crash and an unacknowledged one never shows:

1. A write appends its batch at the committed end of the last segment (first cutting off any
   tail a rolled-back or killed write left there), ``fsync``s the file (and the directory when
   the file is new), and only then stages the grown manifest in the caller's transaction, with the
   gallery row locked. The caller acknowledges after the commit, so every acknowledged batch is on
   disk and covered by a committed manifest.
2. Readers only ever read up to the committed lengths of the manifest they were given, so bytes
   beyond it (a write in flight, or one killed before its commit) are invisible. At startup
   ``recover`` truncates every segment to its committed length and deletes files the manifest
   does not name (an uncommitted new segment, or the old segments a committed compaction
   replaced).
3. Every batch carries a CRC32: damage inside the committed part (a disk that lied about fsync,
   an edited file) is reported as ``SegmentCorrupted``, never read as data.

In memory each gallery has its id maps (item id ↔ internal id, label, metadata, where its vector
lies), caught up from the files whenever a caller's manifest is newer, so another process's
writes (the Celery worker shares the data dir) are seen too. Compaction: when dead records (the
old versions of replaced items, deleted items, delete records) outnumber the live ones, a write
rewrites the live items into a new segment and its manifest names only that segment.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from sqlalchemy import JSON, String, column, select, table
from sqlalchemy.orm import Session

from app.vectors.engine import SCAN_BATCH, Stored, StoredGallery, Upserted
from app.vectors.faiss.segment_format import (
    DELETE,
    HEADER_SIZE,
    UPSERT,
    Batch,
    SegmentCorrupted,
    SegmentMissing,
    decode,
    encode_delete,
    encode_upsert,
    vector_offset,
)

log = logging.getLogger(__name__)

SEGMENT_FILE = re.compile(r"^(\d{8})\.seg$")
# A new segment is started once the last one reaches this size.
SEGMENT_MAX_BYTES = 256 * 2**20
# Compaction runs when dead records exceed both this and the live count.
COMPACT_MIN_DEAD = 10_000

# The one column of the galleries table this storage reads on its own connection: named here,
# not imported, so storage does not depend on the galleries package (its row is the caller's).
_GALLERIES = table("galleries", column("id", String), column("vector_manifest", JSON))

# item id, label, metadata, segment name, file offset of the vector
Entry = tuple[str, str | None, dict[str, Any] | None, str, int]
T = TypeVar("T")


def empty_manifest() -> dict[str, Any]:
    return {"version": 0, "next_id": 1, "segments": []}


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class GalleryState:
    """A gallery's id maps as of manifest ``version`` (``applied``: committed bytes read per
    segment)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.reset()

    def reset(self) -> None:
        self.version = -1
        self.applied: list[tuple[str, int]] = []
        self.by_item: dict[str, int] = {}
        self.entries: dict[int, Entry] = {}
        self.records = 0
        # The batch this process appended last and has not applied yet: (segment, start, end,
        # its header bytes, the batch decoded). Once a committed manifest covers exactly that
        # range and the file holds that header (checksum included), it is applied from here
        # instead of being read back and parsed again.
        self.pending: tuple[str, int, int, bytes, Batch] | None = None

    def apply(self, batch: Batch, segment: str) -> None:
        self.records += len(batch.ids)
        if batch.op == DELETE:
            for vector_id in batch.ids.tolist():
                entry = self.entries.pop(vector_id, None)
                if entry is not None:
                    self.by_item.pop(entry[0], None)
            return
        row_bytes = 4 * batch.dim
        for n, (vector_id, item_id, label, meta) in enumerate(
            zip(batch.ids.tolist(), batch.item_ids, batch.labels, batch.metadata, strict=True)
        ):
            self.entries[vector_id] = (
                item_id,
                label,
                meta,
                segment,
                batch.vector_offset + n * row_bytes,
            )
            self.by_item[item_id] = vector_id


class SegmentVectorStorage:
    name = "segments"

    def __init__(self, root: Path) -> None:
        self.root = root
        self._states: dict[str, GalleryState] = {}
        self._guard = threading.Lock()

    # -- files --------------------------------------------------------------------------------
    def directory(self, gallery_id: str) -> Path:
        return self.root / gallery_id

    def _read(self, gallery_id: str, segment: str, start: int, end: int) -> bytes:
        path = self.directory(gallery_id) / segment
        try:
            with open(path, "rb") as fh:
                fh.seek(start)
                data = fh.read(end - start)
        except FileNotFoundError as exc:
            raise SegmentMissing(f"{path}: missing, the manifest commits {end} bytes") from exc
        if len(data) != end - start:
            raise SegmentCorrupted(f"{path}: shorter than the {end} bytes the manifest commits")
        return data

    def _write_at(self, gallery_id: str, segment: str, offset: int, data: bytes) -> None:
        """Write ``data`` at ``offset`` (the committed end), cutting off what lies beyond, and
        make it durable: file fsync, and directory fsync when the file or directory is new."""
        directory = self.directory(gallery_id)
        if not directory.exists():
            directory.mkdir(parents=True, exist_ok=True)
            _fsync_dir(directory.parent)
        path = directory / segment
        created = not path.exists()
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size < offset:
                raise SegmentCorrupted(f"{path}: {size} bytes, the manifest commits {offset}")
            os.ftruncate(fd, offset)
            end = offset
            view = memoryview(data)
            try:
                while view:
                    written = os.pwrite(fd, view, end)
                    end += written
                    view = view[written:]
                os.fsync(fd)
            except OSError:
                # A full disk (ENOSPC, EDQUOT, EFBIG) or an I/O error: give back what this write
                # took, so the file is again exactly its committed bytes (a new one is removed).
                # Shrinking needs no space; should it fail all the same, the write's own error is
                # the one raised (the bytes past the committed end are never read, and the next
                # write or the startup recovery cuts them).
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, offset)
                    if created:
                        path.unlink(missing_ok=True)
                raise
        finally:
            os.close(fd)
        if created:
            _fsync_dir(directory)

    def _sweep(self, gallery_id: str, manifest: dict[str, Any]) -> list[str]:
        """Delete files the committed manifest does not name (caller holds the row lock)."""
        directory = self.directory(gallery_id)
        if not directory.exists():
            return []
        named = {s["name"] for s in manifest["segments"]}
        removed = [f.name for f in directory.iterdir() if f.name not in named]
        for name in removed:
            (directory / name).unlink(missing_ok=True)
        return removed

    # -- in-memory state ------------------------------------------------------------------------
    def _state(self, gallery_id: str) -> GalleryState:
        with self._guard:
            return self._states.setdefault(gallery_id, GalleryState())

    def _caught_up(
        self, gallery: StoredGallery, manifest: dict[str, Any] | None = None
    ) -> GalleryState:
        """The gallery's state, brought up to the caller's manifest (``manifest``, else the
        gallery row's) when that one is newer (a caller holding an older manifest gets the newer
        committed state)."""
        manifest = manifest or gallery.vector_manifest or empty_manifest()
        state = self._state(gallery.id)
        with state.lock:
            if state.version >= manifest["version"]:
                return state
            segments = [(s["name"], int(s["bytes"])) for s in manifest["segments"]]
            prefix = len(state.applied) <= len(segments) and all(
                name == s_name and done <= size
                for (name, done), (s_name, size) in zip(state.applied, segments, strict=False)
            )
            if not prefix:
                state.reset()
            for n, (segment, size) in enumerate(segments):
                done = state.applied[n][1] if n < len(state.applied) else 0
                if done < size and not self._apply_pending(gallery.id, state, segment, done, size):
                    data = self._read(gallery.id, segment, done, size)
                    where = f"gallery {gallery.id} segment {segment}"
                    try:
                        for batch, _ in decode(data, done, where):
                            state.apply(batch, segment)
                    except SegmentCorrupted:
                        state.reset()
                        raise
                if n < len(state.applied):
                    state.applied[n] = (segment, size)
                else:
                    state.applied.append((segment, size))
            state.version = manifest["version"]
            return state

    def _apply_pending(
        self, gallery_id: str, state: GalleryState, segment: str, start: int, end: int
    ) -> bool:
        pending, state.pending = state.pending, None
        if pending is None or pending[:3] != (segment, start, end):
            return False
        header = self._read(gallery_id, segment, start, start + len(pending[3]))
        if header != pending[3]:
            return False
        state.apply(pending[4], segment)
        return True

    def _vectors(
        self, gallery: StoredGallery, state: GalleryState, ids: Sequence[int]
    ) -> np.ndarray:
        """Rows of ``ids`` (which must exist), read through a map of each segment's committed
        part: vectors are 8-byte aligned, so a strided float32 view picks whole rows."""
        dim = gallery.dim
        out = np.empty((len(ids), dim), dtype=np.float32)
        if not len(ids):
            return out
        committed = dict(state.applied)
        by_segment: dict[str, list[int]] = {}
        for row, vector_id in enumerate(ids):
            by_segment.setdefault(state.entries[vector_id][3], []).append(row)
        for segment, rows in by_segment.items():
            size = committed[segment]
            path = self.directory(gallery.id) / segment
            try:
                floats = np.memmap(path, dtype="<f4", mode="r", shape=(size // 4,))
            except FileNotFoundError as exc:
                raise SegmentMissing(f"{path}: missing, the manifest commits {size} bytes") from exc
            windows = np.lib.stride_tricks.as_strided(
                floats, shape=(size // 4 - dim + 1, dim), strides=(4, 4), writeable=False
            )
            starts = np.fromiter((state.entries[ids[r]][4] // 4 for r in rows), dtype=np.int64)
            out[rows] = windows[starts]
            del windows, floats
        return out

    # -- the interface ---------------------------------------------------------------------------
    def _reading(
        self, session: Session, gallery: StoredGallery, read: Callable[[GalleryState], T]
    ) -> T:
        """``read`` (called with the state's lock held) on the state caught up to the caller's
        manifest. Another process's compaction, followed by a write that deleted the replaced
        segments, leaves a manifest loaded before it naming files that are gone: the committed
        manifest is then read afresh from the database and the read retried on it. A file the
        newest manifest names, missing, is damage and raised."""
        manifest = gallery.vector_manifest or empty_manifest()
        seen = int(manifest["version"])
        while True:
            try:
                state = self._caught_up(gallery, manifest)
                with state.lock:
                    seen = max(seen, state.version)
                    return read(state)
            except SegmentMissing:
                newer = self._committed_manifest(session, gallery.id)
                if newer is None or int(newer["version"]) <= seen:
                    raise
                log.info(
                    "gallery %s: manifest %d was superseded (compacted elsewhere); reading %d",
                    gallery.id,
                    seen,
                    newer["version"],
                )
                manifest, seen = newer, int(newer["version"])

    @staticmethod
    def _committed_manifest(session: Session, gallery_id: str) -> dict[str, Any] | None:
        """The gallery's manifest as committed now, read on a connection of its own (the
        caller's transaction may hold an older snapshot)."""
        with session.get_bind().engine.connect() as conn:
            return conn.execute(
                select(_GALLERIES.c.vector_manifest).where(_GALLERIES.c.id == gallery_id)
            ).scalar_one_or_none()

    def lookup(
        self, session: Session, gallery: StoredGallery, item_ids: Sequence[str]
    ) -> dict[str, tuple[int, str | None]]:
        def read(state: GalleryState) -> dict[str, tuple[int, str | None]]:
            # map() and a comprehension over locals, not a loop of attribute lookups: an access
            # upload looks up tens of thousands of ids per request.
            entries = state.entries
            return {
                item_id: (vector_id, entries[vector_id][1])
                for item_id, vector_id in zip(
                    item_ids, map(state.by_item.get, item_ids), strict=True
                )
                if vector_id is not None
            }

        return self._reading(session, gallery, read)

    def fetch(self, session: Session, gallery: StoredGallery, item_ids: Sequence[str]) -> Stored:
        def read(state: GalleryState) -> Stored:
            present = [i for i in item_ids if i in state.by_item]
            return self._stored(gallery, state, [state.by_item[i] for i in present])

        return self._reading(session, gallery, read)

    def _stored(self, gallery: StoredGallery, state: GalleryState, ids: list[int]) -> Stored:
        entries = [state.entries[i] for i in ids]
        return Stored(
            item_ids=[e[0] for e in entries],
            ids=np.array(ids, dtype=np.int64),
            vectors=self._vectors(gallery, state, ids),
            labels=[e[1] for e in entries],
            metadata=[e[2] for e in entries],
        )

    def names(
        self, session: Session, gallery: StoredGallery, ids: Sequence[int]
    ) -> dict[int, tuple[str, str | None]]:
        def read(state: GalleryState) -> dict[int, tuple[str, str | None]]:
            found = {}
            for vector_id in ids:
                entry = state.entries.get(int(vector_id))
                if entry is not None:
                    found[int(vector_id)] = (entry[0], entry[1])
            return found

        return self._reading(session, gallery, read)

    def scan(
        self, session: Session, gallery: StoredGallery, batch: int = SCAN_BATCH
    ) -> Iterator[Stored]:
        def read(state: GalleryState) -> list[Stored]:
            ids = sorted(state.entries)
            return [
                self._stored(gallery, state, ids[s : s + batch]) for s in range(0, len(ids), batch)
            ]

        yield from self._reading(session, gallery, read)

    def all_ids(self, session: Session, gallery: StoredGallery) -> np.ndarray:
        return self._reading(
            session, gallery, lambda state: np.array(sorted(state.entries), dtype=np.int64)
        )

    def count(self, session: Session, gallery: StoredGallery) -> int:
        return self._reading(session, gallery, lambda state: len(state.entries))

    def upsert(
        self,
        session: Session,
        gallery: StoredGallery,
        item_ids: Sequence[str],
        vectors: np.ndarray,
        labels: Sequence[str | None],
        metadata: Sequence[dict[str, Any] | None],
    ) -> Upserted:
        state = self._writable(gallery)
        with state.lock:
            manifest = gallery.vector_manifest or empty_manifest()
            next_id = int(manifest["next_id"])
            ids = np.empty(len(item_ids), dtype=np.int64)
            replaced: list[int] = []
            for n, item_id in enumerate(item_ids):
                vector_id = state.by_item.get(item_id)
                if vector_id is None:
                    vector_id, next_id = next_id, next_id + 1
                else:
                    replaced.append(vector_id)
                ids[n] = vector_id
            data = encode_upsert(ids, item_ids, labels, metadata, vectors)
            inserted = len(item_ids) - len(replaced)
            live = len(state.entries) + inserted
            decoded = Batch(UPSERT, ids, list(item_ids), list(labels), list(metadata), 0, 0)
            self._commit_batch(
                gallery,
                state,
                manifest,
                data,
                len(item_ids),
                live,
                set(replaced),
                append=True,
                decoded=replace(
                    decoded, vector_offset=vector_offset(data, vectors.shape), dim=vectors.shape[1]
                ),
            )
            gallery.vector_manifest = {**gallery.vector_manifest, "next_id": next_id}
            return Upserted(ids=ids, replaced=np.array(replaced, dtype=np.int64), inserted=inserted)

    def delete(
        self, session: Session, gallery: StoredGallery, item_ids: Sequence[str]
    ) -> np.ndarray:
        state = self._writable(gallery)
        with state.lock:
            ids = sorted({state.by_item[i] for i in item_ids if i in state.by_item})
            removed = np.array(ids, dtype=np.int64)
            if not ids:
                return removed
            manifest = gallery.vector_manifest or empty_manifest()
            live = len(state.entries) - len(ids)
            self._commit_batch(
                gallery,
                state,
                manifest,
                encode_delete(removed),
                len(ids),
                live,
                set(ids),
                append=False,
                decoded=Batch(DELETE, removed, [], [], [], 0, 0),
            )
            return removed

    def _writable(self, gallery: StoredGallery) -> GalleryState:
        """Caught up to the locked row's manifest, which must not be behind what is in memory
        (appending at a stale end would overwrite committed batches)."""
        manifest = gallery.vector_manifest or empty_manifest()
        state = self._caught_up(gallery)
        if state.version != manifest["version"]:
            raise RuntimeError(
                f"gallery {gallery.id}: manifest version {manifest['version']} is behind the "
                f"stored {state.version}; writers must lock and re-read the gallery row"
            )
        with state.lock:
            self._sweep(gallery.id, manifest)
        return state

    def _commit_batch(
        self,
        gallery: StoredGallery,
        state: GalleryState,
        manifest: dict[str, Any],
        data: bytes,
        records: int,
        live_after: int,
        superseded: set[int],
        *,
        append: bool,
        decoded: Batch,
    ) -> None:
        """Make ``data`` durable and stage the manifest that commits it. When dead records pile
        up, the live items (less ``superseded``) are rewritten into a new segment instead,
        followed by ``data`` when ``append`` (an upsert; a delete's batch has nothing to keep)."""
        segments = [dict(s) for s in manifest["segments"]]
        dead_after = state.records + records - live_after
        seq = 1 + max((int(s["name"][:8]) for s in segments), default=0)
        if dead_after > COMPACT_MIN_DEAD and dead_after > live_after:
            name = f"{seq:08d}.seg"
            keep = sorted(set(state.entries) - superseded)
            blob = bytearray()
            for start in range(0, len(keep), SCAN_BATCH):
                part = self._stored(gallery, state, keep[start : start + SCAN_BATCH])
                blob += encode_upsert(
                    part.ids, part.item_ids, part.labels, part.metadata, part.vectors
                )
            if append:
                blob += data
            self._write_at(gallery.id, name, 0, bytes(blob))
            segments = [{"name": name, "bytes": len(blob), "records": live_after}] if blob else []
            log.info(
                "gallery %s compacted: %d live items rewritten into %s, %d dead records dropped",
                gallery.id,
                live_after,
                name,
                dead_after,
            )
        else:
            if not segments or segments[-1]["bytes"] + len(data) > SEGMENT_MAX_BYTES:
                segments.append({"name": f"{seq:08d}.seg", "bytes": 0, "records": 0})
            last = segments[-1]
            start = int(last["bytes"])
            self._write_at(gallery.id, last["name"], start, data)
            state.pending = (
                last["name"],
                start,
                start + len(data),
                data[:HEADER_SIZE],
                replace(decoded, vector_offset=start + decoded.vector_offset),
            )
            last["bytes"] = int(last["bytes"]) + len(data)
            last["records"] = int(last["records"]) + records
        gallery.vector_manifest = {
            **manifest,
            "version": int(manifest["version"]) + 1,
            "segments": segments,
        }

    # -- lifecycle -------------------------------------------------------------------------------
    def drop(self, gallery_id: str) -> None:
        with self._guard:
            self._states.pop(gallery_id, None)
        shutil.rmtree(self.directory(gallery_id), ignore_errors=True)

    def recover(self, galleries: Sequence[StoredGallery]) -> dict[str, str]:
        """Startup: cut every segment back to its committed length, delete files and directories
        no committed manifest names, and forget the in-memory maps (the next use re-reads and
        checks every batch). Returns what was repaired, per gallery."""
        repaired: dict[str, str] = {}
        known = {g.id for g in galleries}
        if self.root.exists():
            for directory in self.root.iterdir():
                if directory.name not in known:
                    shutil.rmtree(directory, ignore_errors=True)
                    repaired[directory.name] = "orphan directory removed"
        for gallery in galleries:
            with self._guard:
                self._states.pop(gallery.id, None)
            manifest = gallery.vector_manifest or empty_manifest()
            notes = [f"removed {name}" for name in self._sweep(gallery.id, manifest)]
            for segment in manifest["segments"]:
                path = self.directory(gallery.id) / segment["name"]
                size = path.stat().st_size if path.exists() else -1
                if size > segment["bytes"]:
                    with open(path, "rb+") as fh:
                        fh.truncate(segment["bytes"])
                        os.fsync(fh.fileno())
                    notes.append(f"cut {size - segment['bytes']} uncommitted bytes off {path.name}")
            if notes:
                repaired[gallery.id] = "; ".join(notes)
                log.warning(
                    "vector storage recovery, gallery %s: %s", gallery.id, repaired[gallery.id]
                )
        return repaired


_storages: dict[Path, SegmentVectorStorage] = {}
_storages_guard = threading.Lock()


def segment_storage(root: Path) -> SegmentVectorStorage:
    """One storage (and one set of in-memory maps) per directory in this process."""
    root = root.resolve()
    with _storages_guard:
        return _storages.setdefault(root, SegmentVectorStorage(root))
