"""Validation of bulk arrays from JSON or ``.npy`` uploads: every failure names the field."""

from __future__ import annotations

import io
import math
import unicodedata
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.lib import format as npy_format

from app.core.errors import FieldError, Problem, invalid, invalid_fields

FLOAT_DTYPES = ("float16", "float32", "float64")
# A .npy header is tiny; anything but the header and the data is a malformed upload.
NPY_MAGIC = b"\x93NUMPY"


def _npy_header(stream: io.BytesIO, field: str) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) from a ``.npy`` header, refusing what must never reach ``np.load``."""
    try:
        version = npy_format.read_magic(stream)
        if version == (1, 0):
            shape, _, dtype = npy_format.read_array_header_1_0(stream)
        elif version == (2, 0):
            shape, _, dtype = npy_format.read_array_header_2_0(stream)
        else:
            raise invalid(field, f".npy format version {version} is not accepted (1.0 or 2.0)")
    except (ValueError, EOFError, OSError) as exc:
        raise invalid(field, f"malformed .npy header: {exc}") from exc
    if dtype.hasobject:
        raise invalid(field, "object arrays are not accepted (pickle is never loaded)")
    return shape, dtype


def load_npy(data: bytes, field: str) -> np.ndarray:
    """Parse one ``.npy`` upload without ever unpickling (object arrays are refused).

    The header is checked against the bytes that follow it before anything is loaded: numpy
    allocates the whole array the header promises first, so a 100-byte upload claiming
    10¹² rows would otherwise raise ``MemoryError`` (or reserve gigabytes) instead of a 422.
    """
    if not data.startswith(NPY_MAGIC):
        raise invalid(field, "not a .npy file (bad magic bytes)")
    stream = io.BytesIO(data)
    shape, dtype = _npy_header(stream, field)
    promised = math.prod(shape) * dtype.itemsize
    held = len(data) - stream.tell()
    if promised != held:
        raise invalid(
            field,
            f"malformed .npy: its header promises shape {list(shape)} of {dtype} "
            f"({promised} bytes) but {held} bytes follow it",
        )
    try:
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise invalid(field, f"malformed .npy: {exc}") from exc
    if not isinstance(array, np.ndarray):
        raise invalid(field, "expected one array, not an archive")
    return array


def npy_strings(array: np.ndarray, field: str) -> list[str]:
    """A 1-D unicode (or UTF-8 bytes) ``.npy`` array as a list of str."""
    if array.ndim != 1:
        raise invalid(field, f"expected a 1-D array of strings, got shape {list(array.shape)}")
    if array.dtype.kind == "U":
        return [str(x) for x in array.tolist()]
    if array.dtype.kind == "S":
        try:
            return [bytes(x).decode("utf-8") for x in array.tolist()]
        except UnicodeDecodeError as exc:
            raise invalid(field, "byte strings must be UTF-8") from exc
    raise invalid(field, f"expected a string array, got dtype {array.dtype}")


def as_matrix(
    rows: Sequence[Sequence[float]] | np.ndarray,
    field: str,
    *,
    dim: int | None,
    max_dim: int,
) -> np.ndarray:
    """Rows → float32 N×D, refusing ragged rows, wrong dims, non-float dtypes and NaN/Inf.

    Values are checked after the cast to float32, so a finite float64 that overflows float32 is
    refused too (it would be stored as Inf).
    """
    if isinstance(rows, np.ndarray):
        if rows.dtype.name not in FLOAT_DTYPES:
            raise invalid(field, f"expected float16/32/64 values, got dtype {rows.dtype}")
        if rows.ndim != 2:
            raise invalid(field, f"expected a 2-D array, got shape {list(rows.shape)}")
        matrix = rows
    else:
        lengths = [len(r) for r in rows]
        expected = dim if dim is not None else (lengths[0] if lengths else 0)
        bad = [i for i, n in enumerate(lengths) if n != expected]
        if bad:
            which = "the gallery's dimension" if dim is not None else f"{field}[0]'s length"
            errors = [
                FieldError(
                    f"{field}[{i}]", f"expected {expected} values ({which}), got {lengths[i]}"
                )
                for i in bad[:20]
            ]
            raise invalid_fields(errors)
        with np.errstate(over="ignore"):
            matrix = np.asarray(rows, dtype=np.float64).reshape(len(rows), expected)
    if matrix.shape[0] == 0:
        raise invalid(field, "must not be empty")
    if matrix.shape[1] == 0:
        raise invalid(field, "rows must not be empty")
    if matrix.shape[1] > max_dim:
        raise invalid(field, f"dimension {matrix.shape[1]} exceeds the limit of {max_dim}")
    if dim is not None and matrix.shape[1] != dim:
        raise invalid(field, f"expected dimension {dim}, got {matrix.shape[1]}")
    with np.errstate(over="ignore", invalid="ignore"):
        matrix = matrix.astype(np.float32)
    finite = np.isfinite(matrix)
    if not finite.all():
        bad_rows, bad_cols = np.nonzero(~finite)
        errors = [
            FieldError(f"{field}[{r}][{c}]", "not a finite float32 (NaN, Inf or out of range)")
            for r, c in zip(bad_rows[:20].tolist(), bad_cols[:20].tolist(), strict=True)
        ]
        raise invalid_fields(errors)
    return np.ascontiguousarray(matrix)


def _bad_id_reason(item_id: str, max_length: int) -> str | None:
    if not item_id:
        return "must not be empty"
    if len(item_id) > max_length:
        return f"longer than {max_length} characters"
    if any(unicodedata.category(ch) in ("Cc", "Cs") for ch in item_id):
        return "control characters and lone surrogates are not allowed"
    return None


def check_ids(ids: Sequence[Any], field: str, *, max_length: int) -> list[str]:
    """Non-empty, bounded, printable, unique strings (any script: ids are opaque)."""
    errors: list[FieldError] = []
    first_seen: dict[str, int] = {}
    for i, item_id in enumerate(ids):
        if not isinstance(item_id, str):
            errors.append(FieldError(f"{field}[{i}]", "must be a string"))
            continue
        reason = _bad_id_reason(item_id, max_length)
        if reason:
            errors.append(FieldError(f"{field}[{i}]", reason))
        elif item_id in first_seen:
            errors.append(
                FieldError(f"{field}[{i}]", f"duplicate of {field}[{first_seen[item_id]}]")
            )
        else:
            first_seen[item_id] = i
        if len(errors) >= 20:
            break
    if errors:
        raise invalid_fields(errors)
    if not ids:
        raise invalid(field, "must not be empty")
    return list(ids)


def check_count(n: int, field: str, expected: int, expected_field: str = "ids") -> None:
    if n != expected:
        raise invalid(field, f"has {n} rows but {expected_field} has {expected}")


def check_batch_size(n: int, field: str, limit: int) -> None:
    if n > limit:
        raise Problem(
            413,
            "Too many items",
            f"{field}: {n} items exceed the limit of {limit} per request; split the upload",
            slug="too-many-items",
            errors=[FieldError(field, f"at most {limit} items per request")],
        )


def check_labels(labels: Sequence[Any] | None, n: int, field: str = "labels") -> list[str] | None:
    if labels is None:
        return None
    check_count(len(labels), field, n)
    errors = []
    for i, label in enumerate(labels):
        if not isinstance(label, str) or not label or len(label) > 256:
            errors.append(FieldError(f"{field}[{i}]", "must be a non-empty string (≤ 256 chars)"))
        elif any(unicodedata.category(ch) in ("Cc", "Cs") for ch in label):
            errors.append(FieldError(f"{field}[{i}]", "control characters are not allowed"))
        if len(errors) >= 20:
            break
    if errors:
        raise invalid_fields(errors)
    return list(labels)
