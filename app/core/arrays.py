"""Validation of bulk arrays from JSON or ``.npy`` uploads: every failure names the field."""

from __future__ import annotations

import io
import math
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.lib import format as npy_format

from app.core.errors import FieldError, Problem, invalid, invalid_fields
from app.core.limits import ArrayLimits

FLOAT_DTYPES = ("float16", "float32", "float64")
# A .npy header is tiny; anything but the header and the data is a malformed upload.
NPY_MAGIC = b"\x93NUMPY"
# The largest code point there is: a '<U' array holding a larger one cannot become a str
# (numpy raises SystemError from tolist()).
MAX_CODE_POINT = 0x10FFFF


@dataclass(frozen=True)
class NpyHeader:
    """What a ``.npy`` header claims, read without touching the data that follows it."""

    shape: tuple[int, ...]
    dtype: np.dtype
    data_offset: int

    @property
    def nbytes(self) -> int:
        # Python ints: a claim of 10¹⁰⁰ rows is a big number, not an overflow.
        return math.prod(self.shape) * self.dtype.itemsize


def _npy_header(data: bytes, field: str) -> NpyHeader:
    """The header of a ``.npy`` upload, refusing what must never reach ``np.load``."""
    if not data.startswith(NPY_MAGIC):
        raise invalid(field, "not a .npy file (bad magic bytes)")
    stream = io.BytesIO(data)
    try:
        version = npy_format.read_magic(stream)
        if version == (1, 0):
            shape, _, dtype = npy_format.read_array_header_1_0(stream)
        elif version == (2, 0):
            shape, _, dtype = npy_format.read_array_header_2_0(stream)
        else:
            raise invalid(field, f".npy format version {version} is not accepted (1.0 or 2.0)")
    except Problem:
        raise
    except Exception as exc:
        # The header is a Python literal evaluated by numpy (ast.literal_eval, then a dtype
        # built from its descr): a hostile one raises ValueError, TypeError, OverflowError,
        # RecursionError or others depending on where it breaks; each one is a malformed header.
        raise invalid(field, f"malformed .npy header: {exc}") from exc
    if dtype.hasobject:
        raise invalid(field, "object arrays are not accepted (pickle is never loaded)")
    if any(n < 0 for n in shape):
        raise invalid(field, f"malformed .npy header: negative dimension in shape {list(shape)}")
    return NpyHeader(tuple(int(n) for n in shape), dtype, stream.tell())


def _check_claim(data: bytes, header: NpyHeader, field: str, limits: ArrayLimits) -> None:
    """The bytes promised against the bytes that follow, then the rows against the limit: all
    from the header, so a 100-byte upload claiming 10¹² rows (numpy would allocate them before
    reading a byte) is a 422, and 3·10⁷ honest rows a 413 before a list of 3·10⁷ objects exists.

    No separate byte limit: the body limit (``BodyLimitMiddleware``) bounds what follows, and
    with an item size of at least one byte (zero-size types are refused before this) the
    promise must equal it, so what numpy then allocates is at most the body's size."""
    held = len(data) - header.data_offset
    if header.nbytes != held:
        raise invalid(
            field,
            f"malformed .npy: its header promises shape {list(header.shape)} of "
            f"{header.dtype} ({header.nbytes} bytes) but {held} bytes follow it",
        )
    # A shape with a zero in it promises no bytes whatever its rows claim: (3·10⁷, 0) passes
    # the check above, not this one.
    check_batch_size(header.shape[0], field, limits.max_rows)


def _load_checked(data: bytes, field: str) -> np.ndarray:
    """``np.load`` of an upload whose header was checked (its allocation is what follows it)."""
    try:
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise invalid(field, f"malformed .npy: {exc}") from exc
    if not isinstance(array, np.ndarray):
        raise invalid(field, "expected one array, not an archive")
    return array


def load_npy(data: bytes, field: str, limits: ArrayLimits) -> np.ndarray:
    """One ``.npy`` upload of float rows (N×D), never unpickled (object arrays are refused).

    Everything is decided from the header before anything is allocated: the dtype (float16,
    32 or 64), the rank (a 0-d or 3-d array is a 422 here, not a ``len()`` of an unsized
    object later), the dimension against its limit, the bytes promised against the bytes that
    follow, and the rows against their limit.
    """
    header = _npy_header(data, field)
    if header.dtype.name not in FLOAT_DTYPES:
        raise invalid(field, f"expected float16/32/64 values, got dtype {header.dtype}")
    if len(header.shape) != 2:
        raise invalid(field, f"expected a 2-D array, got shape {list(header.shape)}")
    if header.shape[1] > limits.max_dim:
        raise invalid(field, f"dimension {header.shape[1]} exceeds the limit of {limits.max_dim}")
    _check_claim(data, header, field, limits)
    return _load_checked(data, field)


def load_npy_strings(data: bytes, field: str, limits: ArrayLimits) -> list[str]:
    """One ``.npy`` upload of strings (1-D unicode, or UTF-8 bytes) as a list of str.

    The rows are limited from the header, before the list (one Python object per row) exists.
    Zero-size string types ('|S0', '<U0') are refused: they promise no bytes, so any number of
    rows would pass the size check for free.
    """
    header = _npy_header(data, field)
    kind = header.dtype.kind
    if kind not in ("U", "S"):
        raise invalid(field, f"expected a string array, got dtype {header.dtype}")
    if header.dtype.itemsize == 0:
        raise invalid(field, f"zero-size strings ({header.dtype.str}) are not accepted")
    if len(header.shape) != 1:
        raise invalid(field, f"expected a 1-D array of strings, got shape {list(header.shape)}")
    _check_claim(data, header, field, limits)
    array = _load_checked(data, field)
    if kind == "U":
        codes = array.view(np.dtype(np.uint32).newbyteorder(header.dtype.byteorder))
        if codes.size and int(codes.max()) > MAX_CODE_POINT:
            raise invalid(field, "not valid unicode (a code point beyond U+10FFFF)")
        # tolist() of a unicode array is already a list of str (a copy per item would double
        # the cost of a 100k-id upload's parse).
        return array.tolist()
    try:
        return [bytes(x).decode("utf-8") for x in array.tolist()]
    except UnicodeDecodeError as exc:
        raise invalid(field, "byte strings must be UTF-8") from exc


def load_npy_ints(data: bytes, field: str, limits: ArrayLimits) -> np.ndarray:
    """One ``.npy`` upload of non-negative integers (1-D, any integer dtype) as int64, never
    unpickled. Checked from the header first (dtype, rank, bytes promised, rows), like
    ``load_npy``; floats are refused rather than rounded (a 2.5 count is a client bug, and NaN
    has no integer), and values that are negative or beyond int64 are named by position."""
    header = _npy_header(data, field)
    if header.dtype.kind not in ("i", "u"):
        raise invalid(field, f"expected integer values, got dtype {header.dtype}")
    if len(header.shape) != 1:
        raise invalid(field, f"expected a 1-D array, got shape {list(header.shape)}")
    _check_claim(data, header, field, limits)
    array = _load_checked(data, field)
    if array.dtype.kind == "u":
        bad = np.flatnonzero(array > np.iinfo(np.int64).max)
        message = "exceeds the largest count (2⁶³ − 1)"
    else:
        bad = np.flatnonzero(array < 0)
        message = "must not be negative"
    if len(bad):
        raise invalid_fields([FieldError(f"{field}[{i}]", message) for i in bad[:20].tolist()])
    return array.astype(np.int64, copy=False)


# Cc (U+0000–U+001F, U+007F–U+009F) and Cs (surrogates): what ``_bad_id_reason`` refuses by
# category, as one character class, so a batch of ids is checked by one regex scan in C.
_BAD_ID_CHARS = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def check_id_values(ids: Sequence[Any], field: str, *, max_length: int) -> list[str]:
    """``check_ids`` without the uniqueness rule (a repeated id is allowed: the caller decides
    what it means), fast for large batches: a per-id loop in Python cost more than the SQL write
    of an access-count upload, so the common case (every id fine) is checked by C-level scans
    and only a failing batch is walked to name the bad ids."""
    if not ids:
        raise invalid(field, "must not be empty")
    if set(map(type, ids)) == {str}:
        lengths = list(map(len, ids))
        if (
            min(lengths) > 0
            and max(lengths) <= max_length
            and _BAD_ID_CHARS.search("".join(ids)) is None
        ):
            return list(ids)
    errors: list[FieldError] = []
    for i, item_id in enumerate(ids):
        if not isinstance(item_id, str):
            errors.append(FieldError(f"{field}[{i}]", "must be a string"))
        elif (reason := _bad_id_reason(item_id, max_length)) is not None:
            errors.append(FieldError(f"{field}[{i}]", reason))
        if len(errors) >= 20:
            break
    if not errors:  # str subclasses, which the fast path's exact type test passes by
        return [str(i) for i in ids]
    raise invalid_fields(errors)


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
