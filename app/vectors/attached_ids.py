"""Internal ids of an attached collection's points, and back (Qdrant points; Milvus rows too,
whose primary keys ``app.vectors.milvus.attached`` maps through the same functions and table).

Item ids are the point ids as strings: ``"42"`` or a UUID's canonical form (Milvus: the INT64 key
in decimal, or the VARCHAR key itself, which is always hashed). Internal ids must be
stable int64s (FAISS ids, what re-embedded features and access counts point at):

* an integer point id in [0, 2⁶²) is its own internal id (no table, no lookup);
* any other point id (a UUID, or an integer from 2⁶² up to 2⁶⁴ − 1) gets a hash of its string in
  [2⁶², 2⁶³): stable without coordination, so a point added after attach has its id too, and
  disjoint from the plain ids. The reverse (internal id → point id) needs the table
  ``attached_point_ids``, filled on attach with ids only; points read since (a scan, a search)
  are also remembered by this process, so a point added after attach is named in the answers
  that found it. Two points hashing alike are refused on attach (odds ~n²/2⁶³).
"""

from __future__ import annotations

import hashlib
import re
import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.core.errors import invalid
from app.vectors.tables import AttachedPointId

PLAIN_LIMIT = 2**62
UINT64_LIMIT = 2**64
INT64 = re.compile(r"^-?(0|[1-9][0-9]*)$")
INT64_LIMIT = 2**63
IN_CHUNK = 500
# Mapped ids this process has read from collections, for answers naming points added after
# attach; bounded (the table holds every id known at attach).
SEEN_LIMIT = 200_000
PointId = int | str

_seen: OrderedDict[tuple[str, int], str] = OrderedDict()
_seen_guard = threading.Lock()


def item_id(point: PointId) -> str:
    return str(point)


def point_of(item: str) -> PointId | None:
    """The point id an item id names, None when it names none (not canonical)."""
    if item.isdigit() and item.isascii():
        value = int(item)
        return value if str(value) == item and value < UINT64_LIMIT else None
    try:
        parsed = uuid.UUID(item)
    except ValueError:
        return None
    return item if str(parsed) == item else None


def key_of(item: str, string_ids: bool) -> int | str | None:
    """The key of a row with integer or string keys (a Milvus primary key, a pgvector id
    column) an item id names, None when it names none (an integer key is written in canonical
    decimal, within int64)."""
    if string_ids:
        return item
    if not (item.isascii() and INT64.match(item)):
        return None
    value = int(item)
    return value if -INT64_LIMIT <= value < INT64_LIMIT else None


def hashed(item: str) -> int:
    digest = hashlib.blake2b(item.encode(), digest_size=8).digest()
    return PLAIN_LIMIT + int.from_bytes(digest, "big") % PLAIN_LIMIT


def internal_of(point: PointId) -> int:
    # Negative integers (a Milvus INT64 key) are hashed: −1 pads the service's id arrays.
    if isinstance(point, int) and 0 <= point < PLAIN_LIMIT:
        return point
    return hashed(item_id(point))


def remember(gallery_id: str, points: Iterable[PointId]) -> None:
    """Points just read from the collection: their mapped ids can be named by this process."""
    with _seen_guard:
        for point in points:
            internal = internal_of(point)
            if internal >= PLAIN_LIMIT:
                _seen[(gallery_id, internal)] = item_id(point)
                _seen.move_to_end((gallery_id, internal))
        while len(_seen) > SEEN_LIMIT:
            _seen.popitem(last=False)


def record(session: Session, gallery_id: str, points: Sequence[PointId]) -> None:
    """On attach: store the mapped ids of ``points`` (staged in the caller's transaction);
    422 when two of them hash alike."""
    rows: dict[int, str] = {}
    for point in points:
        internal = internal_of(point)
        if internal < PLAIN_LIMIT:
            continue
        if internal in rows:
            raise invalid(
                "source.collection",
                f"points {rows[internal]!r} and {item_id(point)!r} map to one internal id; "
                "this collection cannot be attached",
            )
        rows[internal] = item_id(point)
    session.add_all(
        AttachedPointId(gallery_id=gallery_id, vector_id=v, point_id=p) for v, p in rows.items()
    )


def names(session: Session, gallery_id: str, ids: Sequence[int]) -> dict[int, str]:
    """Internal id → item id, for the ids whose point is known (every plain id is)."""
    out = {int(i): str(int(i)) for i in ids if 0 <= int(i) < PLAIN_LIMIT}
    mapped = sorted({int(i) for i in ids if int(i) >= PLAIN_LIMIT})
    for start in range(0, len(mapped), IN_CHUNK):
        rows = session.execute(
            select(AttachedPointId.vector_id, AttachedPointId.point_id).where(
                AttachedPointId.gallery_id == gallery_id,
                AttachedPointId.vector_id.in_(mapped[start : start + IN_CHUNK]),
            )
        )
        out.update({int(v): p for v, p in rows})
    with _seen_guard:
        for internal in mapped:
            if internal not in out and (gallery_id, internal) in _seen:
                out[internal] = _seen[(gallery_id, internal)]
    return out
