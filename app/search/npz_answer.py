"""Search answers as a NumPy ``.npz`` archive (issue 45 item 6): ``Accept: application/x-npz``.

There is no registered media type for NumPy files; ``application/x-npz`` follows the
``application/x-npy`` this service already takes for ``.npy`` bodies (an ``x-`` type, the usual
spelling for an unregistered format), rather than ``application/zip``, which would not say what
the archive holds. The archive is what ``np.savez`` writes (a zip of ``.npy`` members, stored
uncompressed) and ``np.load(file, allow_pickle=False)`` reads. For n queries and k:

- ``ids`` (n, k) ``<U{w}``, w the longest id in the answer; ``""`` where a query has fewer than k
  hits (a gallery smaller than k, an item deleted while it was searched: ids are never empty);
- ``distances``, ``scores`` (n, k) float64, NaN there: the numbers of the JSON hits, unrounded
  (the re-rank computes them in float64);
- ``labels`` (n, k) ``<U{w}``: ``""`` where a hit has none (labels are never empty either);
- ``spaces`` (n, k) ``<U{w}``: ``old`` or ``new`` where the JSON hits carry ``space`` (searches
  with a model over re-embedded items, transition searches), ``""`` elsewhere;
- ``counts`` (n,) int64: the hits of each query, the first ``counts[q]`` of row q.

Bounded memory: the queries are searched in the chunks of the NDJSON answer
(``streaming.chunks``), and each chunk's hits are written to a spool file in pieces of at most
``PIECE_BYTES`` of arrays, its strings in the chunk's own widths. The ids' width is known only
at the end, so the archive is written from the spool afterwards, member by member and piece by
piece, each piece widened to the answer's widths. The memory behind an answer is one chunk's
search (as the NDJSON answer's) and one piece of arrays; the disk behind it is the answer's
size twice while the archive is written (spool and archive), then the archive's.

Every chunk is searched and the archive written before the response starts, so every failure
is a problem with its status (a zip cut short would be no archive at all): a request's errors as
for JSON, a database lost mid-search a 503, a full disk a 507 (``OSError`` ``ENOSPC`` reaches the
app's handler). The answer has a ``Content-Length``.

The spool and the archive are anonymous temporary files in the data directory (``O_TMPFILE`` on
Linux, elsewhere unlinked at once): not the system's temp directory, which may be a RAM-backed
tmpfs, and the data directory's disk is the one whose fullness the service watches. Closing
them frees their space: the spool once the archive is written (or on any error), the archive
once it is sent, or when the client goes away (``ArchiveFile.pieces``' generator is closed) —
and a process that dies leaves nothing behind.
"""

from __future__ import annotations

import math
import tempfile
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from app.core.errors import FieldError, Problem

# Bytes of arrays one piece holds, written to the spool or copied (widened) into the archive.
PIECE_BYTES = 4 * 2**20
# Read back from the archive in pieces of this size.
READ_BYTES = 2**20

STRINGS = ("ids", "labels", "spaces")
FLOATS = ("distances", "scores")
MEMBERS = ("ids", "distances", "scores", "labels", "spaces", "counts")
# Each member's key in a JSON hit.
_KEY = {
    "ids": "id",
    "labels": "label",
    "spaces": "space",
    "distances": "distance",
    "scores": "score",
}
_FLOAT = np.dtype("<f8")
_COUNT = np.dtype("<i8")


def open_temp(directory: Path) -> IO[bytes]:
    """An anonymous temporary file in ``directory`` (its space is freed when it is closed)."""
    directory.mkdir(parents=True, exist_ok=True)
    return tempfile.TemporaryFile(dir=directory, prefix="nobackfill-npz-")


def _string_dtype(width: int) -> np.dtype:
    return np.dtype(f"<U{max(width, 1)}")


def piece_arrays(
    results: list[list[dict[str, Any]]], k: int, widths: dict[str, int]
) -> dict[str, np.ndarray]:
    """The members' rows of ``results`` (one list of hits per query), padded to ``k``."""
    out: dict[str, np.ndarray] = {}
    for name in STRINGS:
        key = _KEY[name]
        out[name] = np.array(
            [[hit.get(key) or "" for hit in hits] + [""] * (k - len(hits)) for hits in results],
            dtype=_string_dtype(widths[name]),
        ).reshape(len(results), k)
    for name in FLOATS:
        key = _KEY[name]
        out[name] = np.array(
            [[hit[key] for hit in hits] + [math.nan] * (k - len(hits)) for hits in results],
            dtype=_FLOAT,
        ).reshape(len(results), k)
    out["counts"] = np.array([len(hits) for hits in results], dtype=_COUNT)
    return out


@dataclass(frozen=True)
class _Piece:
    rows: int
    # Each member's offset in the spool and dtype (strings in their chunk's width).
    members: dict[str, tuple[int, np.dtype]]


class Spool:
    """One answer's hits in a temporary file, piece by piece, until ``archive`` writes them as
    an ``.npz`` archive."""

    def __init__(
        self, directory: Path, k: int, queries: int = 0, max_bytes: int | None = None
    ) -> None:
        self.k = k
        self.queries = queries
        self.max_bytes = max_bytes
        self.rows = 0
        self.widths = dict.fromkeys(STRINGS, 1)
        self._pieces: list[_Piece] = []
        self._file = open_temp(directory)

    def close(self) -> None:
        self._file.close()

    def add(self, results: list[list[dict[str, Any]]]) -> None:
        """One chunk's hits (one list per query, in query order), in pieces of at most
        ``PIECE_BYTES`` (at least a query each)."""
        widths = {}
        for name in STRINGS:
            key = _KEY[name]
            widths[name] = max([1, *(len(hit.get(key) or "") for hits in results for hit in hits)])
            self.widths[name] = max(self.widths[name], widths[name])
        if any(len(hits) > self.k for hits in results):
            raise ValueError(f"a query has more than k = {self.k} hits")
        check_size(self.queries, self.k, self.widths, self.max_bytes)
        per_row = self.k * (4 * sum(widths.values()) + 2 * _FLOAT.itemsize) + _COUNT.itemsize
        step = max(1, PIECE_BYTES // per_row)
        for start in range(0, len(results), step):
            arrays = piece_arrays(results[start : start + step], self.k, widths)
            members = {}
            for name in MEMBERS:
                members[name] = (self._file.tell(), arrays[name].dtype)
                self._file.write(arrays[name].tobytes())
            self._pieces.append(_Piece(len(arrays["counts"]), members))
            self.rows += len(arrays["counts"])
            del arrays

    def archive(self, directory: Path) -> ArchiveFile:
        """The ``.npz`` archive of everything added, in a temporary file of its own."""
        out = open_temp(directory)
        try:
            with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
                for name in MEMBERS:
                    with zf.open(f"{name}.npy", "w", force_zip64=True) as member:
                        self._write_member(member, name)
            size = out.tell()
            out.seek(0)
        except BaseException:
            out.close()
            raise
        return ArchiveFile(out, size)

    def _write_member(self, member: IO[bytes], name: str) -> None:
        dtype = _string_dtype(self.widths[name]) if name in STRINGS else self._fixed(name)
        cols = 1 if name == "counts" else self.k
        shape = (self.rows,) if name == "counts" else (self.rows, self.k)
        header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False}
        np.lib.format.write_array_header_1_0(member, header | {"shape": shape})
        step = max(1, PIECE_BYTES // (cols * dtype.itemsize))
        for piece in self._pieces:
            offset, stored = piece.members[name]
            for start in range(0, piece.rows, step):
                rows = min(step, piece.rows - start)
                self._file.seek(offset + start * cols * stored.itemsize)
                raw = self._file.read(rows * cols * stored.itemsize)
                member.write(np.frombuffer(raw, dtype=stored).astype(dtype).tobytes())
                del raw

    @staticmethod
    def _fixed(name: str) -> np.dtype:
        return _COUNT if name == "counts" else _FLOAT


@dataclass
class ArchiveFile:
    """A written archive: its file (at its start) and size."""

    file: IO[bytes]
    size: int

    def close(self) -> None:
        self.file.close()

    def pieces(self) -> Iterator[bytes]:
        """The archive's bytes; the file is closed when they end or the generator is closed
        (the client went away)."""
        try:
            while data := self.file.read(READ_BYTES):
                yield data
        finally:
            self.close()


def archive_bytes(queries: int, k: int, widths: dict[str, int]) -> int:
    """The arrays' bytes of an answer of ``queries`` × ``k`` with these string widths (the
    archive adds a header per member)."""
    per_hit = 4 * sum(max(widths.get(name, 1), 1) for name in STRINGS) + 2 * _FLOAT.itemsize
    return queries * (k * per_hit + _COUNT.itemsize)


def check_size(queries: int, k: int, widths: dict[str, int], max_bytes: int | None) -> None:
    """413 when the answer's projected size passes ``max_bytes`` (``MAX_NPZ_ANSWER_BYTES``):
    before any work with strings of one character (the least an answer can take), then after each
    chunk with the widths seen so far (an id is as wide as the answer's longest)."""
    if max_bytes is None:
        return
    size = archive_bytes(queries, k, widths)
    if size > max_bytes:
        raise Problem(
            413,
            "Answer too large",
            f"an .npz answer of {queries} queries × k = {k} would take at least {size} bytes, "
            f"over MAX_NPZ_ANSWER_BYTES ({max_bytes}); ask fewer queries or a smaller k per "
            "request, or the NDJSON answer (Accept: application/x-ndjson), which is not spooled",
            slug="answer-too-large",
            errors=[FieldError("k", f"queries × k × bytes per hit at most {max_bytes}")],
        )


def build(
    chunk_results: Iterable[list[list[dict[str, Any]]]],
    directory: Path,
    k: int,
    queries: int = 0,
    max_bytes: int | None = None,
) -> ArchiveFile:
    """The archive of a search answered chunk by chunk (``chunk_results`` searches each as it is
    iterated). The first chunk is searched before any file is opened (a request's own errors
    touch no disk); the spool is gone when this returns, whatever happens. ``queries`` and
    ``max_bytes``: the answer's size bound (``check_size``), checked after every chunk."""
    pending = iter(chunk_results)
    first = next(pending)
    spool = Spool(directory, k, queries, max_bytes)
    try:
        spool.add(first)
        del first
        for results in pending:
            spool.add(results)
            del results  # not held while the next chunk is searched
        return spool.archive(directory)
    finally:
        spool.close()
