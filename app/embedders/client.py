"""Calling an embedder: one HTTP request per batch of texts, every answer checked before it is
used (issue 43, items 1 and 7). Pure of the database: an ``EmbedderSpec`` in, vectors out.

What a call can get back is a vector per text, each of the registered dimension and finite, in
the order sent (``index``) — or an ``EmbedderFailed`` saying what went wrong: unreachable,
timed out, an HTTP error, a malformed answer, a wrong count, a wrong dimension, NaN or ∞. The
caller degrades on it (a search answers single-stage, nothing half-embedded is stored)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import httpx
import numpy as np


class EmbedderFailed(Exception):
    """The embedder gave no usable answer; ``reason`` is a short slug, the message says more."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class EmbedderSpec:
    id: str
    url: str
    model: str
    dimension: int
    api_key_env: str | None
    query_prefix: str
    document_prefix: str
    max_batch: int


def _api_key(spec: EmbedderSpec) -> str | None:
    return os.environ.get(spec.api_key_env) if spec.api_key_env else None


def _parse(answer: object, count: int, dimension: int) -> np.ndarray:
    """``count`` × ``dimension`` float32 vectors of an answer, in ``index`` order. The items'
    shape is checked one item at a time (count, list, index, length); the values as one array
    built by numpy from the parsed lists (no Python loop over the floats): only numbers (a
    string or null makes numpy build another kind of array) and only values finite in float32
    pass."""
    if not isinstance(answer, dict) or not isinstance(answer.get("data"), list):
        raise EmbedderFailed("malformed", "the answer has no `data` list")
    data = answer["data"]
    if len(data) != count:
        raise EmbedderFailed("wrong-count", f"{len(data)} embeddings for {count} texts")
    order = np.empty(count, dtype=np.int64)
    seen = np.zeros(count, dtype=bool)
    vectors = []
    for position, item in enumerate(data):
        if not isinstance(item, dict) or not isinstance(item.get("embedding"), list):
            raise EmbedderFailed("malformed", f"data[{position}] has no `embedding` list")
        index = item.get("index", position)
        bad = isinstance(index, bool) or not isinstance(index, int)
        if bad or not 0 <= index < count or seen[index]:
            raise EmbedderFailed("malformed", f"data[{position}] has a bad `index`")
        seen[index] = True
        order[position] = index
        vector = item["embedding"]
        if len(vector) != dimension:
            raise EmbedderFailed(
                "wrong-dimension", f"an embedding of length {len(vector)}, expected {dimension}"
            )
        vectors.append(vector)
    if count == 0:
        return np.empty((0, dimension), dtype=np.float32)
    try:
        values = np.array(vectors)
    except (ValueError, TypeError, OverflowError) as exc:
        raise EmbedderFailed("not-finite", "an embedding holds a non-number") from exc
    # Numbers only (bool, int, float: JSON numbers); a string, null or nested list gives
    # another kind of array (or another shape).
    if values.dtype.kind not in "biuf" or values.shape != (count, dimension):
        raise EmbedderFailed("not-finite", "an embedding holds NaN, ∞ or a non-number")
    with np.errstate(over="ignore", invalid="ignore"):
        rows = values.astype(np.float32)
    if not np.isfinite(rows).all():
        raise EmbedderFailed("not-finite", "an embedding holds NaN, ∞ or a non-number")
    out = np.empty((count, dimension), dtype=np.float32)
    out[order] = rows
    return out


def embed_texts(
    spec: EmbedderSpec,
    texts: Sequence[str],
    kind: str,
    timeout_s: float,
    client: httpx.Client | None = None,
) -> np.ndarray:
    """len(texts) × dimension vectors of ``texts`` (``kind`` "query" or "document": the prefix
    put before each), in calls of at most ``max_batch`` texts; raises ``EmbedderFailed``."""
    prefix = spec.query_prefix if kind == "query" else spec.document_prefix
    headers = {"Content-Type": "application/json"}
    key = _api_key(spec)
    if key:
        headers["Authorization"] = f"Bearer {key}"
    parts = []
    own = client is None
    http = client or httpx.Client(timeout=timeout_s, follow_redirects=False)
    try:
        for start in range(0, len(texts), spec.max_batch):
            batch = [prefix + t for t in texts[start : start + spec.max_batch]]
            try:
                response = http.post(
                    spec.url,
                    json={"model": spec.model, "input": batch},
                    headers=headers,
                    timeout=timeout_s,
                )
            except httpx.TimeoutException as exc:
                raise EmbedderFailed("timeout", f"no answer within {timeout_s:g} s") from exc
            except httpx.HTTPError as exc:
                raise EmbedderFailed("unreachable", f"{type(exc).__name__}") from exc
            if response.status_code != 200:
                raise EmbedderFailed("http-error", f"it answered HTTP {response.status_code}")
            try:
                answer = response.json()
            except ValueError as exc:
                raise EmbedderFailed("malformed", "the answer is not JSON") from exc
            parts.append(_parse(answer, len(batch), spec.dimension))
    finally:
        if own:
            http.close()
    if not parts:
        return np.empty((0, spec.dimension), dtype=np.float32)
    return np.concatenate(parts)
