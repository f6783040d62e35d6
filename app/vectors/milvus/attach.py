"""An existing Milvus collection attached read-only: vectors by id and searches, nothing written.

A team's gallery already lives in Milvus under its own schema. Attaching names the collection, its
id field, its vector field and its metric; training pairs read the old vectors by id, and a search
maps the query into the collection's space first (a trained model's transform) and asks Milvus.
The reader exposes no write and never changes the collection's state: it neither creates indexes
nor loads a released collection (loading claims the owner's memory), it refuses instead.

An attached gallery (``app.vectors.milvus.source`` checks the place, ``app.vectors.milvus.attached``
serves it as a gallery's storage) reads through this class: checked once on attach, then built
per request from what was checked (``known``), with every read at Strong consistency so that the
owner's writes are seen.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from pymilvus import DataType, MilvusClient

from app.vectors.milvus.engine import connect, id_literal
from app.vectors.milvus.search import MAX_TOPK

METRICS = ("L2", "IP", "COSINE")
ID_TYPES = (DataType.INT64, DataType.VARCHAR)
# Ids per query request (the filter expression grows with the list).
ID_BATCH = 1024
# Reads see every write acknowledged before them (the owner's deletes included), whatever
# consistency level the owner created the collection with.
STRONG = "Strong"
QueryTransform = Callable[[np.ndarray], np.ndarray]


class AttachError(ValueError):
    """The collection cannot be attached as described (missing field, wrong type or metric);
    ``field`` names the part of the description at fault (a request's ``source.<field>``)."""

    def __init__(self, message: str, field: str = "collection") -> None:
        super().__init__(message)
        self.field = field


class AttachedCollection:
    """Read-only access to one collection of a Milvus deployment."""

    def __init__(
        self,
        uri: str,
        collection: str,
        id_field: str,
        vector_field: str,
        metric: str,
        *,
        token: str = "",
        client: MilvusClient | None = None,
    ) -> None:
        if metric not in METRICS:
            raise AttachError(f"metric must be one of {METRICS}", "metric")
        self._client = client if client is not None else connect(uri, token)
        if not self._client.has_collection(collection):
            raise AttachError(f"collection {collection!r} does not exist")
        self.collection = collection
        self.id_field = id_field
        self.vector_field = vector_field
        self.metric = metric
        description = self._client.describe_collection(collection)
        self.properties = dict(description.get("properties") or {})
        fields = {f["name"]: f for f in description["fields"]}
        if id_field not in fields or fields[id_field]["type"] not in ID_TYPES:
            raise AttachError(
                f"id field {id_field!r}: an INT64 or VARCHAR field of the collection", "id_field"
            )
        if not fields[id_field].get("is_primary"):
            # Ids must name one row each: only the primary key does.
            raise AttachError(f"id field {id_field!r}: the collection's primary key", "id_field")
        vector = fields.get(vector_field)
        if vector is None or vector["type"] != DataType.FLOAT_VECTOR:
            raise AttachError(
                f"vector field {vector_field!r}: a FLOAT_VECTOR field", "vector_field"
            )
        self.dim = int(vector["params"]["dim"])
        self._string_ids = fields[id_field]["type"] == DataType.VARCHAR
        indexed = self._index_metric()
        if indexed is not None and indexed != metric:
            raise AttachError(f"the vector field is indexed for {indexed}, not {metric}", "metric")
        state = str(self._client.get_load_state(collection).get("state"))
        if not state.endswith("Loaded"):
            raise AttachError(f"collection {collection!r} is not loaded; its owner must load it")

    @classmethod
    def known(
        cls,
        client: MilvusClient,
        collection: str,
        id_field: str,
        vector_field: str,
        dim: int,
        string_ids: bool,
        metric: str = "COSINE",
    ) -> AttachedCollection:
        """A reader of a collection checked before (an attached gallery's): no request to build
        it, so a gallery's every read costs only its own requests."""
        reader = cls.__new__(cls)
        reader._client = client
        reader.collection, reader.id_field, reader.vector_field = collection, id_field, vector_field
        reader.metric, reader.dim, reader._string_ids = metric, dim, string_ids
        reader.properties = {}
        return reader

    @property
    def string_ids(self) -> bool:
        """Whether the primary key is VARCHAR (else INT64)."""
        return self._string_ids

    def _index_metric(self) -> str | None:
        for name in self._client.list_indexes(self.collection, field_name=self.vector_field):
            info = self._client.describe_index(self.collection, name)
            if info.get("field_name", self.vector_field) == self.vector_field:
                return str(info.get("metric_type")) or None
        return None

    def _literal(self, item_id: Any) -> str:
        return id_literal(str(item_id)) if self._string_ids else str(int(item_id))

    def ids_filter(self, item_ids: Sequence[Any], negate: bool = False) -> str:
        """``<id field> [not] in [...]``, each id a literal of the field's type."""
        listed = ", ".join(self._literal(i) for i in item_ids)
        return f"{self.id_field} {'not in' if negate else 'in'} [{listed}]"

    def count(self) -> int:
        rows = self._client.query(
            self.collection, filter="", output_fields=["count(*)"], consistency_level=STRONG
        )
        return int(rows[0]["count(*)"])

    def existing(self, item_ids: Sequence[Any]) -> set[Any]:
        """The ids among ``item_ids`` that name a row now."""
        wanted = list(dict.fromkeys(item_ids))
        found: set[Any] = set()
        for start in range(0, len(wanted), ID_BATCH):
            rows = self._client.query(
                self.collection,
                filter=self.ids_filter(wanted[start : start + ID_BATCH]),
                output_fields=[self.id_field],
                consistency_level=STRONG,
            )
            found.update(row[self.id_field] for row in rows)
        return found

    def iterate(self, batch: int, vectors: bool, only: str = "") -> Iterator[list[dict[str, Any]]]:
        """Every row (its id, and its vector when asked), or those matching the filter
        expression ``only``, in pages of at most ``batch``."""
        fields = [self.id_field, self.vector_field] if vectors else [self.id_field]
        pages = self._client.query_iterator(
            self.collection,
            batch_size=batch,
            filter=only,
            output_fields=fields,
            consistency_level=STRONG,
        )
        try:
            while rows := pages.next():
                yield rows
        finally:
            pages.close()

    def search_rows(
        self, vectors: np.ndarray, k: int, expr: str = ""
    ) -> list[list[tuple[Any, np.ndarray]]]:
        """Per row of ``vectors`` the k best (id, stored vector), best first by the collection's
        metric, among the rows ``expr`` keeps (empty: all)."""
        results = self._client.search(
            self.collection,
            data=np.asarray(vectors, dtype=np.float32).reshape(-1, self.dim),
            limit=k,
            anns_field=self.vector_field,
            search_params={"metric_type": self.metric},
            output_fields=[self.id_field, self.vector_field],
            filter=expr,
            consistency_level=STRONG,
        )
        return [
            [
                (
                    hit["entity"].get(self.id_field, hit.get("id")),
                    np.asarray(hit["entity"][self.vector_field], dtype=np.float32),
                )
                for hit in hits
            ]
            for hits in results
        ]

    def fetch_vectors(self, item_ids: Sequence[Any]) -> tuple[list[Any], np.ndarray]:
        """(ids found, in the order asked for; their vectors n × dim float32)."""
        wanted = list(dict.fromkeys(item_ids))
        found: dict[Any, list[float]] = {}
        for start in range(0, len(wanted), ID_BATCH):
            part = wanted[start : start + ID_BATCH]
            expr = self.ids_filter(part)
            rows = self._client.query(
                self.collection,
                filter=expr,
                output_fields=[self.id_field, self.vector_field],
                consistency_level=STRONG,
            )
            found.update((row[self.id_field], row[self.vector_field]) for row in rows)
        key = str if self._string_ids else int
        ids = [key(i) for i in wanted if key(i) in found]
        vectors = np.array([found[i] for i in ids], dtype=np.float32).reshape(len(ids), self.dim)
        return ids, vectors

    def search(
        self, queries: np.ndarray, k: int, transform: QueryTransform | None = None
    ) -> tuple[list[list[Any]], np.ndarray]:
        """Per query the k best ids and Milvus's scores (nq × k, NaN padded; similarities for IP
        and COSINE, larger first, distances for L2), after mapping the queries into the
        collection's space with ``transform``."""
        if k < 1:
            raise ValueError("k must be ≥ 1")
        if k > MAX_TOPK:
            # A server would refuse it (milvus-lite has no cap): refused alike everywhere.
            raise ValueError(f"k must be ≤ {MAX_TOPK}, a Milvus server's top-k cap")
        vectors = np.asarray(transform(queries) if transform else queries, dtype=np.float32)
        vectors = vectors.reshape(-1, self.dim)
        results = self._client.search(
            self.collection,
            data=vectors,
            limit=k,
            anns_field=self.vector_field,
            search_params={"metric_type": self.metric},
            output_fields=[self.id_field],
            # As every read here (``STRONG``): a server searches at the collection's own level
            # otherwise (Bounded by default), which may miss the owner's latest writes.
            consistency_level=STRONG,
        )
        ids: list[list[Any]] = []
        scores = np.full((len(vectors), k), np.nan)
        for q, hits in enumerate(results):
            ids.append([hit["entity"].get(self.id_field, hit.get("id")) for hit in hits])
            scores[q, : len(hits)] = [hit["distance"] for hit in hits]
        return ids, scores

    def describe(self) -> dict[str, Any]:
        """What was attached (for a gallery's metadata row)."""
        return {
            "collection": self.collection,
            "id_field": self.id_field,
            "vector_field": self.vector_field,
            "metric": self.metric,
            "dim": self.dim,
        }
