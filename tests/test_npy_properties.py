"""Property tests of the upload loaders (``app.core.arrays``, ``app.core.uploads.parse_json``) on
generated input: any ``.npy`` header (valid, invalid, zero-size, object and huge dtypes, any
shape, either order, truncated or padded data) and JSON of any nesting either loads or raises
the service's own 4xx ``Problem`` naming the field, never another exception, and costs memory
bounded by the bytes given, not by what a header claims."""

from __future__ import annotations

import io
import json
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from app.core.arrays import load_npy, load_npy_strings
from app.core.errors import Problem
from app.core.limits import ArrayLimits
from app.core.uploads import parse_json

FIELD = "part"
LIMITS = ArrayLimits(max_rows=1000, max_dim=64)
# Every generated upload is at most a few kB and may claim up to 10³⁰ rows; a loader that
# trusted a header would allocate (or iterate) far beyond this.
MAX_PEAK_BYTES = 4 * 1024 * 1024
EXAMPLES = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

# Drawn group first, then a member: each kind of descriptor is as likely as any other.
DESCRS: dict[str, list[Any]] = {
    "accepted": ["<f2", "<f4", ">f4", "<f8", ">f8", "|S1", "|S7", "<U1", ">U3", "<U16"],
    "refused": [
        "<i4", "<i8", "|u1", "|b1", "<c8", "<M8[s]", "<m8[ns]", "|V4",
        [("a", "<f4"), ("b", "<i4")], ("<f4", (3,)), ("<U2", (2,)),
    ],
    "zero-size": ["|S0", "<U0", "|V0", [("a", "<f4", (0,))]],
    "object": ["|O", [("a", "|O")], ("|O", (2,))],
    "big itemsize": [
        "|S1000000", "<U100000000", "|V2147483647", ("<f8", (10**6,)), ("<f4", (2**40,)),
    ],
    "not a descriptor": ["x", "f99", "<U-1", "", 5, None, (), [], {"a": 1}, "<f4" * 1000],
}  # fmt: skip
descrs = st.sampled_from(sorted(DESCRS)).flatmap(lambda group: st.sampled_from(DESCRS[group]))
dims = st.one_of(
    st.integers(0, 6),
    st.integers(-3, -1),
    st.sampled_from([1000, 1001, 65, 2**31, 2**63, 10**30, 30_000_000]),
)
shapes = st.one_of(
    st.tuples(dims),
    st.tuples(dims, dims),
    st.just(()),
    st.lists(dims, min_size=3, max_size=4).map(tuple),
    st.sampled_from([[3], "(3,)", (1.5,), None]),  # not a tuple of ints
)


def header_bytes(header: dict[str, Any], version: tuple[int, int]) -> bytes:
    """A ``.npy`` preamble written by hand (numpy's writer refuses the invalid values)."""
    text = repr(header)
    prefix = b"\x93NUMPY" + bytes(version)
    length_size = 2 if version == (1, 0) else 4
    pad = -(len(prefix) + length_size + len(text) + 1) % 64
    encoded = (text + " " * pad + "\n").encode("latin1", "replace")
    return prefix + len(encoded).to_bytes(length_size, "little") + encoded


@st.composite
def npy_uploads(draw: st.DrawFn) -> bytes:
    header = {
        "descr": draw(descrs),
        "fortran_order": draw(st.sampled_from([False, True, False, "yes", 0])),
        "shape": draw(shapes),
    }
    if draw(st.integers(0, 9)) == 0:
        header.pop(draw(st.sampled_from(sorted(header))))  # a key missing
    version = draw(st.sampled_from([(1, 0), (2, 0), (1, 0), (3, 0), (9, 9)]))
    preamble = header_bytes(header, version)
    # The data: what the header promises when that is small, else a few bytes; then cut short,
    # padded, or left as is.
    try:
        promised = int(np.prod(header["shape"])) * np.dtype(header["descr"]).itemsize
    except Exception:
        promised = 16
    body = bytes(min(max(promised, 0), 4096))
    match draw(st.sampled_from(["exact", "exact", "short", "long", "random"])):
        case "short":
            body = body[: draw(st.integers(0, max(len(body) - 1, 0)))]
        case "long":
            body += draw(st.binary(min_size=1, max_size=32))
        case "random":
            body = draw(st.binary(max_size=256))
    if draw(st.integers(0, 9)) == 0:  # the preamble itself cut short
        return preamble[: draw(st.integers(0, len(preamble)))]
    return preamble + body


@pytest.fixture
def traced() -> Iterator[Callable[[Callable[[], Any]], tuple[Any, int]]]:
    """Runs a call under tracemalloc: (its result or the exception it raised, peak bytes)."""
    tracemalloc.start()

    def run(call: Callable[[], Any]) -> tuple[Any, int]:
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        try:
            outcome: Any = call()
        except Exception as exc:
            outcome = exc
        _, peak = tracemalloc.get_traced_memory()
        return outcome, peak - base

    yield run
    tracemalloc.stop()


def assert_client_error(outcome: Any, field: str = FIELD) -> None:
    if isinstance(outcome, Exception):
        assert isinstance(outcome, Problem), repr(outcome)
        assert 400 <= outcome.status < 500
        body = outcome.body()
        assert body["type"].startswith("urn:nobackfill:problem:") and body["detail"]
        assert field in [e.field for e in outcome.errors]


def claiming(descr: Any, shape: Any, payload: bytes = b"") -> bytes:
    header = {"descr": descr, "fortran_order": False, "shape": shape}
    return header_bytes(header, (1, 0)) + payload


# The probe's cases (issue 24) and their neighbours, always run whatever hypothesis draws.
KNOWN = [
    claiming("|S0", (30_000_000,)),
    claiming("<U0", (30_000_000,)),
    claiming("<U1000000", (30_000_000,), b"abcd" * 8),
    claiming("|S1", (1001,), b"a" * 1001),
    claiming("<f4", (30_000_000, 0)),
    claiming("<f4", (0, 10**12)),
    claiming("<f4", (), b"\0" * 4),
    claiming("<f4", (2, 2, 2), b"\0" * 32),
    claiming("<f4", (-1, -1), b"\0" * 4),
    claiming("<U1", (2,), (0x110000).to_bytes(4, "little") * 2),
]


def with_known(test: Callable[..., None]) -> Callable[..., None]:
    for data in KNOWN:
        test = example(data=data)(test)
    return test


@EXAMPLES
@with_known
@given(data=npy_uploads())
def test_any_npy_header_loads_as_rows_or_is_a_client_error(traced, data: bytes) -> None:
    outcome, peak = traced(lambda: load_npy(data, FIELD, LIMITS))
    assert_client_error(outcome)
    if not isinstance(outcome, Exception):
        assert isinstance(outcome, np.ndarray) and outcome.ndim == 2
        assert outcome.dtype.name in ("float16", "float32", "float64")
        assert outcome.shape[0] <= LIMITS.max_rows and outcome.shape[1] <= LIMITS.max_dim
    assert peak < MAX_PEAK_BYTES, f"{peak} bytes traced for a {len(data)}-byte upload"


@EXAMPLES
@with_known
@given(data=npy_uploads())
def test_any_npy_header_loads_as_strings_or_is_a_client_error(traced, data: bytes) -> None:
    outcome, peak = traced(lambda: load_npy_strings(data, FIELD, LIMITS))
    assert_client_error(outcome)
    if not isinstance(outcome, Exception):
        assert isinstance(outcome, list) and len(outcome) <= LIMITS.max_rows
        assert all(isinstance(s, str) for s in outcome)
    assert peak < MAX_PEAK_BYTES, f"{peak} bytes traced for a {len(data)}-byte upload"


def npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


@EXAMPLES
@given(
    array=hnp.arrays(
        dtype=st.sampled_from([np.float16, np.float32, np.float64, np.dtype(">f4")]),
        shape=hnp.array_shapes(min_dims=2, max_dims=2, min_side=0, max_side=8),
    ),
    fortran=st.booleans(),
)
def test_valid_float_rows_round_trip(array: np.ndarray, fortran: bool) -> None:
    array = np.asfortranarray(array) if fortran else array
    loaded = load_npy(npy(array), FIELD, LIMITS)
    assert loaded.shape == array.shape and loaded.dtype == array.dtype
    np.testing.assert_array_equal(loaded, array)


@EXAMPLES
@given(
    strings=st.lists(st.text(max_size=12).map(lambda s: s.rstrip("\x00")), max_size=20),
    as_bytes=st.booleans(),
)
def test_valid_strings_round_trip(strings: list[str], as_bytes: bool) -> None:
    # numpy pads fixed-width strings with NULs and strips trailing ones: those are not data.
    if as_bytes:
        encoded = [s.encode("utf-8") for s in strings]
        array = np.array(encoded, dtype=f"S{max([len(e) for e in encoded] + [1])}")
    else:
        array = np.array(strings, dtype=f"U{max([len(s) for s in strings] + [1])}")
    assert load_npy_strings(npy(array), FIELD, LIMITS) == strings


nested_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=20,
)


@EXAMPLES
@given(
    depth=st.one_of(st.integers(0, 300), st.sampled_from([10_000, 100_000])),
    opener=st.sampled_from(["[", '{"a":', '[{"b":']),
    tail=st.sampled_from(["", "1", "x", "]", ",", " "]),
)
def test_json_parts_of_any_depth_parse_or_are_a_client_error(
    depth: int, opener: str, tail: str
) -> None:
    closer = {"[": "]", '{"a":': "}", '[{"b":': "}]"}[opener]
    text = opener * depth + tail + closer * depth
    try:
        parse_json(text.encode(), FIELD)
    except Problem as exc:
        assert_client_error(exc)


@EXAMPLES
@given(value=nested_json)
def test_json_parts_parse_like_the_value_they_encode(value: Any) -> None:
    text = json.dumps(value)
    parsed = parse_json(text.encode(), FIELD)
    assert json.dumps(parsed) == text
