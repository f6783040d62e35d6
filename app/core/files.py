"""Crash-safe files: written whole or not at all, checksummed where the database records them."""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def write_atomically(path: Path, data: bytes) -> None:
    """Temp file in the same folder, fsync, rename over ``path``, fsync the folder: after a crash
    ``path`` holds either the old content or the new, never a torn write."""
    write_atomically_with(path, lambda fh: fh.write(data))


def write_atomically_with(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """``write_atomically`` for content streamed by ``write(fh)`` into the temp file (a large
    index never needs a second copy in memory)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class ChecksumMismatch(Exception):
    """A stored file no longer matches the checksum its database row recorded."""


def read_verified(path: Path, expected_sha256: str) -> bytes:
    data = path.read_bytes()
    if sha256_hex(data) != expected_sha256:
        raise ChecksumMismatch(f"{path.name}: checksum mismatch")
    return data
