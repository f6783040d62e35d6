"""Search answers as arrays: one row per query, ``k`` columns, padded where a gallery holds
fewer than ``k`` items."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class SearchResults:
    """``ids`` (str, "" where padded), ``distances`` (float64, NaN where padded: the exact
    Lorentz distance), ``scores`` (float64 or None: what the server reports beside the distance,
    e.g. cosine similarity on cosine galleries), ``labels`` (str or None, "" where absent) and
    ``rows``, the server's own answer."""

    ids: np.ndarray
    distances: np.ndarray
    scores: np.ndarray | None
    labels: np.ndarray
    rows: list[list[dict[str, Any]]]
    # A two-stage search's report per batch sent (depth, embedded, degraded…).
    reranks: list[dict[str, Any]] = field(default_factory=list)
    # What the server warned of (a bridge its upgrade did not recommend…), once each.
    warnings: list[str] = field(default_factory=list)

    @classmethod
    def from_rows(cls, rows: list[list[dict[str, Any]]], k: int) -> SearchResults:
        width = max([k, *(len(r) for r in rows)]) if rows else k
        ids = np.full((len(rows), width), "", dtype=object)
        labels = np.full((len(rows), width), "", dtype=object)
        distances = np.full((len(rows), width), np.nan)
        has_scores = any("score" in hit for row in rows for hit in row)
        scores = np.full((len(rows), width), np.nan) if has_scores else None
        for i, row in enumerate(rows):
            for j, hit in enumerate(row):
                ids[i, j] = hit["id"]
                distances[i, j] = hit["distance"]
                labels[i, j] = hit.get("label") or ""
                if scores is not None and hit.get("score") is not None:
                    scores[i, j] = hit["score"]
        return cls(ids.astype(str), distances, scores, labels.astype(str), rows)

    def __len__(self) -> int:
        return len(self.rows)

    def to_dict(self) -> dict[str, Any]:
        return {"results": self.rows}
