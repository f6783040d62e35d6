"""Batched uploads: the rows checked before anything is sent, cut into batches the server's limits
admit, and a checkpoint of acknowledged rows so that a rerun resumes where an interruption left.

Batches are upserts by id and are sent in row order, so the acknowledged rows are always a prefix:
the checkpoint is one number, keyed by a hash of the target and of every part's content."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

FLOAT_KINDS = ("float16", "float32", "float64")
# Multipart framing and .npy headers per part; a batch's budget keeps this much aside.
PART_OVERHEAD_BYTES = 512
CHECKPOINT_VERSION = 1


class InputError(ValueError):
    """Data refused before anything was sent (wrong dtype, shape, NaN, duplicate ids)."""


def string_array(values: Sequence[str] | np.ndarray, name: str) -> np.ndarray:
    """A 1-D array of str (unicode or UTF-8 bytes), as the server reads ids and labels."""
    array = np.asarray(values)
    if array.dtype.kind not in "US":
        raise InputError(f"{name}: expected strings, got dtype {array.dtype}")
    if array.ndim != 1:
        raise InputError(f"{name}: expected a 1-D array of strings, got shape {list(array.shape)}")
    if array.size == 0:
        raise InputError(f"{name}: is empty")
    return array


def float_matrix(values: Sequence[Sequence[float]] | np.ndarray, name: str) -> np.ndarray:
    """A finite N×D float16/32/64 array; Python lists become float32."""
    array = values if isinstance(values, np.ndarray) else np.asarray(values, dtype=np.float32)
    if array.dtype.name not in FLOAT_KINDS:
        raise InputError(f"{name}: expected float16/32/64, got dtype {array.dtype}")
    if array.ndim != 2:
        raise InputError(
            f"{name}: expected a 2-D array (rows × dim), got shape {list(array.shape)}"
        )
    if array.shape[0] == 0 or array.shape[1] == 0:
        raise InputError(f"{name}: is empty (shape {list(array.shape)})")
    # Chunked: a memory-mapped file of several GB is not copied whole.
    for start in range(0, array.shape[0], 65_536):
        block = np.asarray(array[start : start + 65_536])
        if not np.isfinite(block).all():
            row = start + int(np.argwhere(~np.isfinite(block))[0][0])
            raise InputError(f"{name}: row {row} holds NaN or Inf")
    return array


def check_rows(n: int, name: str, array: np.ndarray | Sequence[Any]) -> None:
    if len(array) != n:
        raise InputError(f"{name}: {len(array)} rows, but there are {n} ids")


def check_unique(ids: np.ndarray, name: str = "ids") -> None:
    values, counts = np.unique(ids, return_counts=True)
    if (counts > 1).any():
        repeated = values[counts > 1][:5].tolist()
        raise InputError(f"{name}: {int((counts > 1).sum())} ids repeat, e.g. {repeated}")


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
    return buffer.getvalue()


@dataclass
class RowParts:
    """One upload's row-aligned parts: arrays go as ``.npy`` files, lists as JSON text."""

    arrays: dict[str, np.ndarray]
    lists: dict[str, list[Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        lengths = {len(v) for v in self.arrays.values()} | {len(v) for v in self.lists.values()}
        if len(lengths) != 1:
            raise InputError(f"parts have different row counts: {sorted(lengths)}")

    def __len__(self) -> int:
        return len(next(iter(self.arrays.values())))

    def row_bytes(self) -> int:
        """Bytes one row adds to a request (the longest row for JSON lists)."""
        size = sum(
            a.dtype.itemsize * int(np.prod(a.shape[1:], dtype=np.int64))
            for a in self.arrays.values()
        )
        for values in self.lists.values():
            size += max(len(json.dumps(v)) + 2 for v in values)
        return max(1, size)

    def fixed_bytes(self) -> int:
        return PART_OVERHEAD_BYTES * (len(self.arrays) + len(self.lists))

    def multipart(self, start: int, stop: int) -> tuple[dict[str, Any], dict[str, str]]:
        """(files, data) for httpx: rows ``start:stop`` of every part."""
        files = {
            name: (f"{name}.npy", npy_bytes(array[start:stop]), "application/octet-stream")
            for name, array in self.arrays.items()
        }
        data = {name: json.dumps(values[start:stop]) for name, values in self.lists.items()}
        return files, data

    def fingerprint(self, target: str) -> str:
        """SHA-256 of the target and of every part (name, dtype, shape, bytes)."""
        digest = hashlib.sha256(target.encode() + b"\n")
        for name in sorted(self.arrays):
            array = self.arrays[name]
            digest.update(f"{name} {array.dtype.str} {list(array.shape)}\n".encode())
            for start in range(0, len(array), 65_536):
                digest.update(np.ascontiguousarray(array[start : start + 65_536]).tobytes())
        for name in sorted(self.lists):
            digest.update(f"{name} json\n".encode() + json.dumps(self.lists[name]).encode())
        return digest.hexdigest()


@dataclass
class BatchLimits:
    """Rows and bytes per request. The server's limits are not published, so the defaults stay
    under its default ones (10,000 rows, 64 MiB) and a 413 naming a lower limit lowers them."""

    rows: int = 10_000
    bytes: int = 32 * 1024 * 1024

    def rows_for(self, parts: RowParts, batch_size: int | None = None) -> int:
        by_bytes = (self.bytes - parts.fixed_bytes()) // parts.row_bytes()
        rows = min(self.rows, by_bytes, batch_size or self.rows)
        if rows < 1:
            raise InputError(
                f"one row takes {parts.row_bytes()} bytes, more than a request may carry "
                f"({self.bytes} bytes)"
            )
        return rows

    def lower_from(self, detail: str, rows_sent: int, parts: RowParts) -> bool:
        """Lower the limits from a 413's detail (``limit of N per request`` or ``limit of N
        bytes``); without a number, halve the batch. False when nothing smaller is possible."""
        if match := re.search(r"limit of (\d+) per request", detail):
            new_rows = min(int(match.group(1)), rows_sent - 1)
            if new_rows < 1:
                return False
            self.rows = new_rows
            return True
        if match := re.search(r"limit of (\d+) bytes", detail):
            # Headroom for the multipart framing the row estimate leaves out.
            self.bytes = min(self.bytes, int(int(match.group(1)) * 0.9))
            if self.rows_for(parts) < rows_sent:
                return True
        if rows_sent <= 1:
            return False
        self.rows = rows_sent // 2
        return True


def default_checkpoint_dir() -> Path:
    if configured := os.environ.get("NOBACKFILL_CHECKPOINT_DIR"):
        return Path(configured)
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "nobackfill" / "uploads"


@dataclass
class Checkpoint:
    """Rows of one upload the server acknowledged, in ``<dir>/<fingerprint>.json``; removed once
    the upload completes."""

    path: Path
    target: str
    rows_total: int
    rows_done: int = 0

    @classmethod
    def open(cls, directory: Path, fingerprint: str, target: str, rows_total: int) -> Checkpoint:
        path = Path(directory) / f"{fingerprint}.json"
        checkpoint = cls(path, target, rows_total)
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError):
            return checkpoint
        if (
            isinstance(saved, dict)
            and saved.get("version") == CHECKPOINT_VERSION
            and saved.get("target") == target
            and saved.get("rows_total") == rows_total
            and isinstance(saved.get("rows_done"), int)
            and 0 <= saved["rows_done"] <= rows_total
        ):
            checkpoint.rows_done = saved["rows_done"]
        return checkpoint

    def advance(self, rows_done: int) -> None:
        """Record acknowledged rows: written to a temporary file and renamed over the old one, so
        a crash leaves the previous record or the new one."""
        self.rows_done = rows_done
        self.path.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "version": CHECKPOINT_VERSION,
            "target": self.target,
            "rows_total": self.rows_total,
            "rows_done": rows_done,
        }
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as handle:
                json.dump(record, handle)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def finish(self) -> None:
        self.path.unlink(missing_ok=True)
