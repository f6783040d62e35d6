"""Galleries stored in Milvus: one collection per gallery, searched by exact Lorentz distance.

One ``MilvusClient`` per engine; the URI decides where the data lives: a file path (``….db``) is
an embedded milvus-lite store (tests, laptops), ``http(s)://host:port`` a Milvus server or cluster
(with a token). Each gallery's collection holds, per item: ``item_id`` (VARCHAR primary key),
``row_id`` (the internal int64 id), ``label``, ``metadata`` (JSON), ``vector`` (the stored vector
exactly as given: the Euclidean vector of an external gallery, the space components of a
model-bound one) and ``search``, the row its layout indexes (``app.vectors.milvus.layouts``: COSINE
over the space components when every point lies at one radius, an L2 HNSW over Poincaré-ball
coordinates otherwise (with each row's float64 gap δ = 1 − c‖p‖² in ``gap``; collections made
before that layout index tangent vectors log₀(x)), an exact FLAT scan over the lifted vectors
when exactness is asked for). A cosine-lifted gallery (``GalleryLayout.lift_scale``) has no ``search`` row: its stored
vector points the same way as its point, so the COSINE index is built on ``vector`` itself. A
search fetches candidates with their indexed rows and orders them by the float64 Lorentz
distance, so the engine's float32 scores never decide the final order.

Durability — Milvus's own guarantees, no SQL-side record of each write. An acknowledged insert,
upsert or delete is already in Milvus's write-ahead log: a Milvus server acknowledges after the
write reached its log (message queue or Woodpecker), and milvus-lite appends it to its WAL file and
flushes it to the operating system before it answers (so it survives ``kill -9`` of the process;
an OS crash or power loss can lose writes since its last fsync, which milvus-lite does on segment
flush — the price of not fsyncing per request). ``flush`` (sealing segments) is therefore not
called per write: it would cost a segment seal per request and buy nothing for durability. An
SQL-side record (a journal of item ids per write, replayed after a crash) would duplicate that log
and still not make a write to two stores atomic; the database keeps only gallery metadata.
Collections are created with consistency level ``Strong``: a read after an acknowledged write sees
it (read-your-writes across processes, not only in this client's session).

Older servers (issue 46: Milvus 2.3.5, the ``milvus`` package's standalone, which ``make
milvus-server`` and the tests' real server run). A collection's format (``CollectionFormat``) is
read back from its own schema whenever the collection is opened, never assumed from the server's
version: a collection keeps the format it was made with after its server is upgraded. Two
differences from milvus-lite and current servers, each tested on 2.3.5:

- No nullable fields (Milvus documents them from 2.5). A 2.3 server creates ``label`` and
  ``metadata`` without the flag, without an error, then refuses every row with a null in them
  ("varchar field 'label' is illegal … got nil": the first unlabelled upload answered 500).
  Nothing to ask the version for: the collection's schema says it (``nulls``). In a collection
  without them an absent label is stored as ``""`` (``NO_LABEL``; the service accepts only
  non-empty labels, and the engine refuses ``""`` there rather than read it back as absent) and
  absent metadata as the JSON value ``null`` (a JSON field holds any JSON value, and reads back
  as None, as a null does).
- One vector field per collection (before Milvus 2.4: "multiple vector fields is not
  supported"). Asked of the server's version (``server_version``) before a collection with a
  ``search`` row is created; there the stored vector is kept in a FLOAT array field instead
  (float32 like a vector field, read back exactly; at most ``MAX_ARRAY`` values), never searched,
  so nothing is lost but its unused FLAT index.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pymilvus import DataType, MilvusClient
from pymilvus.exceptions import MilvusException

from app.vectors.milvus import search as milvus_search
from app.vectors.milvus.layouts import (
    GalleryLayout,
    at_one_radius,
    boundary_gap,
    gallery_search_vectors,
)
from app.vectors.milvus.search import SearchHits

# Rows per insert request (pymilvus sends one gRPC message per request; Milvus limits its size).
WRITE_BATCH = 2048
# Ids per query/delete request (filter expressions grow with the list). As many as a write
# batch: on a server every query waits for the Strong consistency guarantee (a time tick, 200 ms
# by default), so an upsert's lookup is one query per write batch, not two (issue 46's ingest).
ID_BATCH = WRITE_BATCH
# How often ``seal`` asks whether the index build has finished.
SEAL_POLL_S = 0.2
# Drops tried before a milvus-lite file race is reported (``drop_collection``).
DROP_ATTEMPTS = 3
MAX_ITEM_ID = 256
MAX_LABEL = 65535
PROPERTY = "nobackfill.gallery"
# The next internal id to hand out (ids are reserved here before rows carry them).
NEXT_ROW_ID = "nobackfill.next_row_id"
FIELDS = ("item_id", "row_id", "label", "metadata", "vector")
# An absent label, in a collection whose label field takes no null (see the module docstring).
NO_LABEL = ""
# Absent metadata there: JSON text, which pymilvus sends as it is (``null``, not a missing value).
NO_METADATA = "null"
# The first Milvus server version holding several vector fields in one collection.
MULTI_VECTOR_SINCE = (2, 4)
# The most elements of a Milvus array field (its ``max_capacity`` limit).
MAX_ARRAY = 4096
SERVER_VERSION = re.compile(r"^v?(\d+)\.(\d+)\.")


@dataclass
class StoredRows:
    """Rows read back, in the order asked for (ids not stored are left out)."""

    item_ids: list[str]
    row_ids: np.ndarray  # n int64, the items' internal ids
    vectors: np.ndarray  # n × dim float32, as stored
    labels: list[str | None]
    metadata: list[dict[str, Any] | None]


def seal_collection(
    client: MilvusClient, collection: str, field_name: str, timeout_s: float = 3600.0
) -> None:
    """Seal the rows written so far into segments and wait until the index of ``field_name``
    covers them all (after a bulk load: until then Milvus scans unsealed rows exactly, which is
    correct but slower). Not needed for durability (see the module docstring)."""
    client.flush(collection)
    deadline = time.monotonic() + timeout_s
    while True:
        info = client.describe_index(collection, field_name)
        pending = info.get("pending_index_rows", 0)
        if pending == 0 and info.get("indexed_rows", 0) >= info.get("total_rows", 0):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"index of {collection} not built after {timeout_s} s: {info}")
        time.sleep(SEAL_POLL_S)


def drop_collection(client: MilvusClient, name: str, attempts: int = DROP_ATTEMPTS) -> None:
    """Drop a collection, again when milvus-lite loses a file under its own delete.

    milvus-lite 3.2 deletes the collection's directory while its background index work may still
    remove files there; the delete then fails on a file already gone ("No such file or
    directory", seen dropping a 1M-row collection right after its index was built), with the
    collection closed and partly deleted. A second drop deletes the rest. Other errors, and
    the same one ``attempts`` times over, are raised."""
    for attempt in range(1, attempts + 1):
        try:
            client.drop_collection(name)
            return
        except MilvusException as error:
            if attempt == attempts or "No such file or directory" not in str(error):
                raise


@dataclass(frozen=True)
class CollectionFormat:
    """How a gallery's collection holds its rows, as its schema says (see the module docstring):
    ``nulls``, whether its label and metadata fields take nulls; ``vector_array``, whether the
    stored vector is a FLOAT array field rather than a vector field."""

    nulls: bool = True
    vector_array: bool = False

    @classmethod
    def of(cls, described: dict[str, Any]) -> CollectionFormat:
        fields = {f["name"]: f for f in described["fields"]}
        return cls(
            nulls=all(bool(fields[name].get("nullable")) for name in ("label", "metadata")),
            vector_array=fields["vector"]["type"] == DataType.ARRAY,
        )


def server_version(client: MilvusClient) -> tuple[int, int] | None:
    """(major, minor) of a Milvus server's version (``v2.3.5-lite`` → (2, 3)); None for
    milvus-lite (``milvus_lite-3.2.2``, whose features follow pymilvus's) and for versions
    spelt otherwise, taken as current."""
    found = SERVER_VERSION.match(str(client.get_server_version()))
    return None if found is None else (int(found[1]), int(found[2]))


def is_remote(uri: str) -> bool:
    return uri.startswith(("http://", "https://", "tcp://", "grpc://"))


def connect(uri: str, token: str = "") -> MilvusClient:
    """A client for a server URI or a milvus-lite file (its folder is created if missing)."""
    if not is_remote(uri):
        if not uri.endswith(".db"):
            raise ValueError("an embedded milvus-lite store is a path ending in .db")
        Path(uri).parent.mkdir(parents=True, exist_ok=True)
    return MilvusClient(uri=uri, token=token)


def id_literal(item_id: str) -> str:
    """A string literal of Milvus's filter language (backslash and quote escaped)."""
    return '"' + item_id.replace("\\", "\\\\").replace('"', '\\"') + '"'


def ids_filter(item_ids: Sequence[str]) -> str:
    """``item_id in [...]`` with every id escaped (pymilvus's ``get(ids=…)`` and
    ``delete(ids=…)`` quote ids without escaping, which breaks on a backslash or a quote)."""
    return f"item_id in [{', '.join(id_literal(i) for i in item_ids)}]"


def _check_ids(item_ids: Sequence[str]) -> list[str]:
    ids = [str(i) for i in item_ids]
    for item in ids:
        if not 0 < len(item) <= MAX_ITEM_ID:
            raise ValueError(f"item ids must have 1 to {MAX_ITEM_ID} characters")
    if len(set(ids)) != len(ids):
        raise ValueError("item ids must be unique within one write")
    return ids


class MilvusEngine:
    """Gallery collections on one Milvus deployment (a milvus-lite file or a server)."""

    def __init__(
        self,
        uri: str,
        token: str = "",
        *,
        overfetch: int | None = None,
        ef_factor: int | None = None,
    ) -> None:
        """``overfetch`` (k′) and ``ef_factor`` override every layout's defaults when given."""
        if overfetch is not None and overfetch < 1:
            raise ValueError("overfetch must be ≥ 1")
        if ef_factor is not None and ef_factor < 1:
            raise ValueError("ef_factor must be ≥ 1")
        self.uri = uri
        self.overfetch = overfetch
        self.ef_factor = ef_factor
        self.client = connect(uri, token)
        self._layouts: dict[str, GalleryLayout] = {}
        self._formats: dict[str, CollectionFormat] = {}
        self._multi_vector: bool | None = None

    def close(self) -> None:
        self.client.close()

    def multi_vector(self) -> bool:
        """Whether the server holds several vector fields in one collection (asked once)."""
        if self._multi_vector is None:
            version = server_version(self.client)
            self._multi_vector = version is None or version >= MULTI_VECTOR_SINCE
        return self._multi_vector

    # -- collections ----------------------------------------------------------------------------
    def create_gallery(self, layout: GalleryLayout) -> MilvusGallery:
        """Create (or adopt an identical existing) collection, indexed and loaded."""
        if self.client.has_collection(layout.collection):
            existing = self.open_gallery(layout.collection)
            if existing.layout != layout:
                raise ValueError(f"collection {layout.collection} exists with another layout")
            return existing
        schema = self.client.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("item_id", DataType.VARCHAR, is_primary=True, max_length=MAX_ITEM_ID)
        schema.add_field("row_id", DataType.INT64)
        schema.add_field("label", DataType.VARCHAR, max_length=MAX_LABEL, nullable=True)
        schema.add_field("metadata", DataType.JSON, nullable=True)
        index = self.client.prepare_index_params()
        if layout.search_field == "search" and not self.multi_vector():
            # One vector field per collection on this server: the stored vector, never searched,
            # goes into a float32 array (see the module docstring).
            if layout.dim > MAX_ARRAY:
                raise ValueError(
                    f"this Milvus server holds one vector field per collection; the stored "
                    f"vector then takes an array field of at most {MAX_ARRAY} values, not "
                    f"{layout.dim} (Milvus 2.4 and later have no such limit)"
                )
            schema.add_field(
                "vector", DataType.ARRAY, element_type=DataType.FLOAT, max_capacity=layout.dim
            )
        else:
            schema.add_field("vector", DataType.FLOAT_VECTOR, dim=layout.dim)
            if layout.search_field == "search":
                # Milvus loads only collections whose every vector field is indexed; this stored
                # vector is never searched, so it gets the index without a build (FLAT).
                index.add_index("vector", index_type="FLAT", metric_type="L2")
        if layout.search_field == "search":
            schema.add_field("search", DataType.FLOAT_VECTOR, dim=layout.search_width)
        if layout.gap_field is not None:
            schema.add_field(layout.gap_field, DataType.FLOAT)
        params = (
            {"M": layout.hnsw["m"], "efConstruction": layout.hnsw["ef_construction"]}
            if layout.index_type == "HNSW"
            else {}
        )
        index.add_index(
            layout.search_field,
            index_type=layout.index_type,
            metric_type=layout.metric,
            params=params,
        )
        self.client.create_collection(
            layout.collection,
            schema=schema,
            consistency_level="Strong",
            properties={PROPERTY: layout.to_json(), NEXT_ROW_ID: "0"},
        )
        # Indexes of an empty collection have nothing to build: sync=False skips pymilvus's
        # wait, which polls every 0.5 s per index (measured: 1.0 of a new gallery's 1.05 s).
        # Rows written later are indexed as Milvus seals them (``seal`` waits for that).
        self.client.create_index(layout.collection, index, sync=False)
        self.client.load_collection(layout.collection)
        # Read back: what the server made of ``nullable`` (a 2.3 server drops it silently).
        form = CollectionFormat.of(self.client.describe_collection(layout.collection))
        self._layouts[layout.collection] = layout
        self._formats[layout.collection] = form
        return MilvusGallery(self, layout, form)

    def open_gallery(self, collection: str) -> MilvusGallery:
        """The gallery of an existing collection (loaded if a restart released it)."""
        layout = self._layouts.get(collection)
        if layout is None:
            described = self.client.describe_collection(collection)
            text = (described.get("properties") or {}).get(PROPERTY)
            if text is None:
                raise ValueError(f"collection {collection} is not a nobackfill gallery")
            layout = GalleryLayout.from_json(text)
            self._ensure_loaded(collection)
            self._layouts[collection] = layout
            self._formats[collection] = CollectionFormat.of(described)
        return MilvusGallery(self, layout, self._formats[collection])

    def _ensure_loaded(self, collection: str) -> None:
        state = str(self.client.get_load_state(collection).get("state"))
        if not state.endswith("Loaded"):
            self.client.load_collection(collection)

    def has_gallery(self, collection: str) -> bool:
        return bool(self.client.has_collection(collection))

    def drop_gallery(self, collection: str) -> bool:
        """Drop the collection; False if it did not exist."""
        self._layouts.pop(collection, None)
        self._formats.pop(collection, None)
        if not self.client.has_collection(collection):
            return False
        drop_collection(self.client, collection)
        return True


class MilvusGallery:
    """Reads and writes of one gallery's collection (cheap to create; holds no rows)."""

    def __init__(
        self, engine: MilvusEngine, layout: GalleryLayout, form: CollectionFormat | None = None
    ) -> None:
        self.engine = engine
        self.layout = layout
        self.client = engine.client
        self.name = layout.collection
        self.form = form or CollectionFormat()

    def _stored_label(self, label: str | None) -> str | None:
        if self.form.nulls:
            return label
        if label == NO_LABEL:
            # It would read back as absent: refused rather than changed.
            raise ValueError(
                f"collection {self.name} stores an absent label as an empty one (its server "
                "has no nullable fields): a label must not be empty"
            )
        return NO_LABEL if label is None else label

    def _label(self, stored: str | None) -> str | None:
        return None if not self.form.nulls and stored == NO_LABEL else stored

    def _stored_metadata(self, value: dict[str, Any] | None) -> dict[str, Any] | str | None:
        return NO_METADATA if value is None and not self.form.nulls else value

    # -- writes ---------------------------------------------------------------------------------
    def upsert(
        self,
        item_ids: Sequence[str],
        vectors: np.ndarray,
        points: np.ndarray | None,
        labels: Sequence[str | None] | None = None,
        metadata: Sequence[dict[str, Any] | None] | None = None,
        known: dict[str, tuple[int, str | None]] | None = None,
    ) -> np.ndarray:
        """Insert or replace items: an existing item id gets the new vector, label and metadata
        and keeps its internal id; a new one gets the next free id. ``known``: the caller's
        ``lookup`` of these ids, made under the same writer lock (each lookup is a consistent
        read on a server, so it is not repeated); looked up here when None.

        ``vectors`` (n × dim) are stored as given; ``points`` (n × point_dim) are their space
        components, from which the search rows are computed (None under a ``lift_scale``
        layout, which computes them from the vectors). Returns the internal ids (int64)
        in the order given. Writers of one gallery must be serialised by the caller (the
        service holds the gallery row's lock): the id reservation reads, then writes, a
        collection property."""
        ids = _check_ids(item_ids)
        n = len(ids)
        vectors = np.ascontiguousarray(vectors, dtype=np.float32).reshape(n, self.layout.dim)
        lifted = self.layout.lift_scale is not None
        if points is None:
            if not lifted:
                raise ValueError("points are required unless the layout has a lift_scale")
            points = np.zeros((n, 0))
        points = np.asarray(points).reshape(n, -1)
        if not lifted and points.shape[1] != self.layout.point_dim:
            raise ValueError(f"points must have {self.layout.point_dim} components")
        labels = list(labels) if labels is not None else [None] * n
        metadata = list(metadata) if metadata is not None else [None] * n
        if len(labels) != n or len(metadata) != n:
            raise ValueError("labels and metadata must have one entry per item")
        if not (np.isfinite(vectors).all() and np.isfinite(points).all()):
            raise ValueError("vectors must be finite")
        stored_labels = [self._stored_label(label) for label in labels]
        stored_metadata = [self._stored_metadata(value) for value in metadata]
        one_radius = lifted or at_one_radius(points, self.layout.curv)
        if self.layout.layout == "cosine" and not one_radius:
            # The cosine ranking equals the Lorentz ranking only at one radius.
            raise ValueError("a cosine-layout gallery takes points at one radius only")
        search = (
            None if lifted else gallery_search_vectors(self.layout.layout, points, self.layout.curv)
        )
        gap_field = self.layout.gap_field
        gaps = None if gap_field is None else boundary_gap(points, self.layout.curv)
        known = self.lookup(ids) if known is None else known
        fresh = iter(self._reserve(n - len(known)))
        row_ids = np.array([known[i][0] if i in known else next(fresh) for i in ids], np.int64)
        for start in range(0, n, WRITE_BATCH):
            stop = min(n, start + WRITE_BATCH)
            rows = [
                {
                    "item_id": ids[i],
                    "row_id": int(row_ids[i]),
                    "label": stored_labels[i],
                    "metadata": stored_metadata[i],
                    # An array field takes a list (a vector field takes the array as it is).
                    "vector": vectors[i].tolist() if self.form.vector_array else vectors[i],
                }
                for i in range(start, stop)
            ]
            if search is not None:
                for i, row in enumerate(rows, start):
                    row["search"] = search[i]
            if gaps is not None:
                for i, row in enumerate(rows, start):
                    row[gap_field] = float(gaps[i])
            self.client.upsert(self.name, rows)
        return row_ids

    def _reserve(self, n: int) -> range:
        """``n`` internal ids never handed out before in this collection."""
        if n == 0:
            return range(0)
        described = self.client.describe_collection(self.name)
        first = int((described.get("properties") or {}).get(NEXT_ROW_ID, 0))
        self.client.alter_collection_properties(self.name, {NEXT_ROW_ID: str(first + n)})
        return range(first, first + n)

    def delete(self, item_ids: Sequence[str]) -> int:
        """Delete the items stored; returns how many of them existed."""
        present = sorted(self.existing_ids(item_ids))
        for start in range(0, len(present), ID_BATCH):
            self.client.delete(self.name, filter=ids_filter(present[start : start + ID_BATCH]))
        return len(present)

    def seal(self, timeout_s: float = 3600.0) -> None:
        """Seal the rows written so far and wait until the search index covers them all."""
        seal_collection(self.client, self.name, self.layout.search_field, timeout_s)

    # -- reads ----------------------------------------------------------------------------------
    def count(self) -> int:
        rows = self.client.query(self.name, filter="", output_fields=["count(*)"])
        return int(rows[0]["count(*)"])

    def existing_ids(self, item_ids: Sequence[str]) -> set[str]:
        return set(self.lookup(item_ids))

    def lookup(self, item_ids: Sequence[str]) -> dict[str, tuple[int, str | None]]:
        """item id → (internal id, label) of the items stored."""
        ids = list(dict.fromkeys(str(i) for i in item_ids))
        found: dict[str, tuple[int, str | None]] = {}
        for start in range(0, len(ids), ID_BATCH):
            rows = self.client.query(
                self.name,
                filter=ids_filter(ids[start : start + ID_BATCH]),
                output_fields=["item_id", "row_id", "label"],
            )
            found.update(
                (r["item_id"], (int(r["row_id"]), self._label(r.get("label")))) for r in rows
            )
        return found

    def names(self, row_ids: Sequence[int] | np.ndarray) -> dict[int, tuple[str, str | None]]:
        """internal id → (item id, label) of the ids stored."""
        wanted = sorted({int(i) for i in row_ids})
        found: dict[int, tuple[str, str | None]] = {}
        for start in range(0, len(wanted), ID_BATCH):
            part = wanted[start : start + ID_BATCH]
            rows = self.client.query(
                self.name,
                filter=f"row_id in [{', '.join(map(str, part))}]",
                output_fields=["item_id", "row_id", "label"],
            )
            found.update(
                (int(r["row_id"]), (r["item_id"], self._label(r.get("label")))) for r in rows
            )
        return found

    def fetch(self, item_ids: Sequence[str]) -> StoredRows:
        """Stored vectors, labels and metadata of the items, in the order asked for."""
        ids = list(dict.fromkeys(str(i) for i in item_ids))
        by_id: dict[str, dict[str, Any]] = {}
        for start in range(0, len(ids), ID_BATCH):
            rows = self.client.query(
                self.name,
                filter=ids_filter(ids[start : start + ID_BATCH]),
                output_fields=list(FIELDS),
            )
            by_id.update((row["item_id"], row) for row in rows)
        return self._stored_rows([by_id[i] for i in ids if i in by_id])

    def _stored_rows(self, rows: list[dict[str, Any]]) -> StoredRows:
        vectors = np.array([row["vector"] for row in rows], dtype=np.float32)
        return StoredRows(
            item_ids=[row["item_id"] for row in rows],
            row_ids=np.array([row["row_id"] for row in rows], dtype=np.int64),
            vectors=vectors.reshape(len(rows), self.layout.dim),
            labels=[self._label(row.get("label")) for row in rows],
            metadata=[row.get("metadata") for row in rows],
        )

    def all_row_ids(self) -> np.ndarray:
        """Every stored internal id, ascending (int64; 8 bytes per item)."""
        rows = self.client.query(self.name, filter="row_id >= 0", output_fields=["row_id"])
        return np.sort(np.array([row["row_id"] for row in rows], dtype=np.int64))

    def scan(self, batch_size: int = 4096) -> Iterator[StoredRows]:
        """Every stored row, in batches in ascending internal id.

        The ids are listed once and the rows fetched by id range: milvus-lite's ``query``
        returns rows in no particular order, so a cursor on the primary key (what pymilvus's
        iterator does) could skip rows there; the iterator also does not escape quotes in ids."""
        if batch_size < 1:
            raise ValueError("batch_size must be ≥ 1")
        for rows in self.row_batches(batch_size, list(FIELDS)):
            yield self._stored_rows(rows)

    def row_batches(self, batch_size: int, fields: list[str]) -> Iterator[list[dict[str, Any]]]:
        """The rows' ``fields`` in batches of ascending internal id (see ``scan``)."""
        row_ids = self.all_row_ids()
        for start in range(0, len(row_ids), batch_size):
            part = row_ids[start : start + batch_size]
            page = self.client.query(
                self.name,
                filter=f"row_id >= {int(part[0])} and row_id <= {int(part[-1])}",
                output_fields=fields,
            )
            # Each row read before sorting: pymilvus fills some of a query row's fields (vectors and
            # JSON among them) on first access, from the row's position, so rows moved by an
            # in-place sort got other rows' vectors and metadata. A Milvus 2.3 server answers in
            # primary-key order, where that happened; milvus-lite answers in row order, which hid it.
            rows = sorted((row for row in page), key=lambda row: row["row_id"])
            if rows:
                yield rows

    # -- search ---------------------------------------------------------------------------------
    def search(
        self,
        queries: np.ndarray,
        k: int,
        *,
        overfetch: int | None = None,
        ef_factor: int | None = None,
    ) -> SearchHits:
        """The k nearest items per query, nearest first, by exact float64 Lorentz distance
        among the engine's candidates (``app.vectors.milvus.search.search``)."""
        return milvus_search.search(self, queries, k, overfetch=overfetch, ef_factor=ef_factor)
