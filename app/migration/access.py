"""Access counts: how often users opened or clicked each item of a gallery, as the team's own logs
say (``POST /v1/galleries/{id}/access``). The backfill plan weighs an item's expected gain by
this traffic (``app.ml.backfill.traffic``): the items users actually choose are the ones whose
re-embedding pays (issue 25: re-embedding the 10 % most clicked reached 0.99 × a reindex on
future searches, a random 10 % 0.93 ×).

An upload adds to what the gallery holds, all or nothing: every id must be an item of the
gallery (checked through the gallery's own storage, so FAISS and Milvus galleries alike), every
count a non-negative integer; a repeated id in one upload is summed (a raw click log of one row
per click can be sent as it is). The increment happens in SQL (``count = count + excluded``), in
one statement per upload, so concurrent uploads never lose an increment; the commit is the
acknowledgement.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
from sqlalchemy import func, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.core.arrays import check_batch_size, check_count, check_id_values
from app.core.errors import FieldError, Problem, invalid, invalid_fields, not_found
from app.core.idempotency import IdempotencyRequest, StoredResponse, find_replay, remember
from app.core.settings import Settings
from app.galleries.models import AccessCount, Gallery
from app.galleries.service import _lock_gallery
from app.vectors.storage import storage_for

INT64_MAX = 2**63 - 1
# Characters no stored item id holds (``check_id_values``), refused in a page token.
_BAD_TOKEN_TEXT = re.compile("[\\x00-\\x1f\\x7f-\\x9f\\ud800-\\udfff]")
# Unknown ids named one by one in a refusal (the detail says how many there are in all).
NAMED_UNKNOWN = 20

# The increment, saturating at the largest int64 instead of overflowing (SQLite would turn an
# overflowing sum into a float, PostgreSQL would fail the statement).
_ADD = (
    f"count = CASE WHEN gallery_access.count > {INT64_MAX} - excluded.count THEN {INT64_MAX} "
    "ELSE gallery_access.count + excluded.count END, vector_id = excluded.vector_id"
)
# Between ids sent to PostgreSQL as one text: a control character, which no id holds.
ID_SEPARATOR = "\x1f"
# PostgreSQL: one statement for the whole upload, the rows as three arrays, each sent as one
# delimited text and split by the server (psycopg's array dumper quotes each element in Python:
# 35 ms for 24k rows, more than everything else of the request but the upsert).
_UPSERT_PG = text(
    "INSERT INTO gallery_access (gallery_id, item_id, vector_id, count) "
    "SELECT :gallery_id, t.item_id, t.vector_id, t.count FROM unnest("
    "string_to_array(CAST(:item_ids AS text), CAST(:separator AS text)), "
    "CAST(string_to_array(CAST(:vector_ids AS text), ',') AS bigint[]), "
    "CAST(string_to_array(CAST(:counts AS text), ',') AS bigint[])"
    ") AS t(item_id, vector_id, count) "
    f"ON CONFLICT (gallery_id, item_id) DO UPDATE SET {_ADD}"
)
# SQLite: one prepared statement run over every row by the driver (executemany, in C).
_UPSERT_SQLITE = (
    "INSERT INTO gallery_access (gallery_id, item_id, vector_id, count) VALUES (?, ?, ?, ?) "
    f"ON CONFLICT (gallery_id, item_id) DO UPDATE SET {_ADD}"
)


def as_counts(values: Any, field: str = "counts") -> np.ndarray:
    """Counts as int64: an integer ``.npy`` part (already checked by ``load_npy_ints``) or a
    list (from the JSON body, already validated by its model; or from a JSON part, checked
    here the same way: integers, not booleans or floats, from 0 to 2⁶³ − 1)."""
    if isinstance(values, np.ndarray):
        return values.astype(np.int64, copy=False)
    if not isinstance(values, list):
        raise invalid(field, "expected an array of non-negative integers")
    errors = [
        FieldError(f"{field}[{n}]", "must be an integer from 0 to 2⁶³ − 1")
        for n, v in enumerate(values)
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= INT64_MAX
    ]
    if errors:
        raise invalid_fields(errors[:20])
    return np.asarray(values, dtype=np.int64)


def summed(ids: list[str], counts: np.ndarray) -> tuple[list[str], np.ndarray]:
    """(distinct ids, their summed counts), sorted by id: a repeated id adds up. Sorted, so
    concurrent uploads lock the rows they share in one order (no deadlock on PostgreSQL).

    The ids are numbered through a dict and the counts added by numpy (``np.add.at``): a Python
    sort of every row and a dict of Python ints cost more than the upsert of a 100k-row upload."""
    keys = sorted(set(ids))
    if int(counts.max(initial=0)) > INT64_MAX // max(len(ids), 1):
        # Values large enough for a sum to overflow int64: Python ints, then saturate.
        totals = dict.fromkeys(keys, 0)
        for item_id, count in zip(ids, counts.tolist(), strict=True):
            totals[item_id] += count
        return keys, np.array([min(totals[k], INT64_MAX) for k in keys], dtype=np.int64)
    position = dict(zip(keys, range(len(keys)), strict=True))
    rows = np.fromiter(map(position.__getitem__, ids), dtype=np.int64, count=len(ids))
    sums = np.zeros(len(keys), dtype=np.int64)
    np.add.at(sums, rows, counts)
    return keys, sums


def _lock_shared(session: Session, gallery: Gallery) -> Gallery:
    """The gallery row, locked against deletes of its items (which take it exclusively) but not
    against other access uploads (PostgreSQL: FOR SHARE; SQLite serialises writers anyway): an
    item checked here cannot be deleted before this upload commits."""
    if session.get_bind().dialect.name == "sqlite":
        return _lock_gallery(session, gallery)
    locked = session.scalar(
        select(Gallery)
        .where(Gallery.id == gallery.id)
        .with_for_update(read=True)
        .execution_options(populate_existing=True)
    )
    if locked is None:
        raise not_found("gallery", gallery.id)
    return locked


def _lookup(
    session: Session, gallery: Gallery, keys: Sequence[str]
) -> dict[str, tuple[int, str | None]]:
    """Which of ``keys`` the gallery holds (item id → (internal id, label)), through its own
    storage: SQL rows, segment files or Milvus alike."""
    return storage_for(session, gallery).lookup(session, gallery, keys)


def _unknown(ids: Sequence[str], present: dict[str, Any]) -> Problem:
    missing = [n for n, item_id in enumerate(ids) if item_id not in present]
    distinct = list(dict.fromkeys(ids[n] for n in missing))
    shown = ", ".join(repr(i) for i in distinct[:5])
    more = f", … ({len(distinct) - 5} more)" if len(distinct) > 5 else ""
    return Problem(
        422,
        "Invalid request",
        f"{len(distinct)} ids are not in this gallery: {shown}{more}; nothing was counted",
        errors=[
            FieldError(f"ids[{n}]", f"{ids[n]!r} is not in this gallery")
            for n in missing[:NAMED_UNKNOWN]
        ],
    )


def _fingerprinted(
    key: str | None, gallery: Gallery, ids: Sequence[str], values: np.ndarray
) -> IdempotencyRequest | None:
    """The Idempotency-Key with a fingerprint of what the request says (the ids and counts in
    order), not of its bytes: a multipart body differs on every send by its boundary alone.
    The ids joined by a control character (which no valid id holds, so the join is unambiguous)
    and the counts' int64 bytes: a JSON text of 100k ids and counts cost 20 ms a request."""
    canonical = ID_SEPARATOR.join(ids).encode() + b"\0" + values.astype("<i8").tobytes()
    return IdempotencyRequest.from_parts(
        key, "POST", f"/v1/galleries/{gallery.id}/access", canonical
    )


def add_counts(
    session: Session,
    settings: Settings,
    gallery: Gallery,
    ids: Sequence[Any],
    counts: Any,
    idempotency_key: str | None = None,
) -> dict[str, int]:
    """Add ``counts`` to the gallery's items ``ids``, all or nothing, committed before it
    returns. Returns ``updated`` (distinct items given a positive count) and ``added`` (the
    sum of the counts). With ``idempotency_key`` a retry of the same counts replays the first
    answer and adds nothing (counts add up: a retried batch would otherwise count twice); the
    record commits with the counts, so either both are stored or neither."""
    check_batch_size(len(ids), "ids", settings.max_vectors_per_request)
    ids = check_id_values(ids, "ids", max_length=settings.max_id_length)
    values = as_counts(counts)
    check_count(len(values), "counts", len(ids))
    request = _fingerprinted(idempotency_key, gallery, ids, values)
    replay = find_replay(session, gallery.tenant_id, request)
    if replay is not None:
        return replay.body
    keys, sums = summed(ids, values)
    gallery = _lock_shared(session, gallery)
    present = _lookup(session, gallery, keys)
    if len(present) < len(keys):
        raise _unknown(ids, present)
    # Zero counts change nothing and would only add rows: left out.
    positive = np.flatnonzero(sums > 0)
    item_ids = [keys[n] for n in positive.tolist()]
    vector_ids = [present[k][0] for k in item_ids]
    amounts = sums[positive].tolist()
    if item_ids:
        if session.get_bind().dialect.name == "postgresql":
            session.execute(
                _UPSERT_PG,
                {
                    "gallery_id": gallery.id,
                    "item_ids": ID_SEPARATOR.join(item_ids),
                    "separator": ID_SEPARATOR,
                    "vector_ids": ",".join(map(str, vector_ids)),
                    "counts": ",".join(map(str, amounts)),
                },
            )
        else:
            session.connection().exec_driver_sql(
                _UPSERT_SQLITE,
                list(zip([gallery.id] * len(item_ids), item_ids, vector_ids, amounts, strict=True)),
            )
    # The gallery's totals are left to GET (an aggregate over all its counts): per upload, it
    # cost as much as the write itself.
    result = {"updated": len(item_ids), "added": min(int(sum(amounts)), INT64_MAX)}
    remember(session, gallery.tenant_id, request, StoredResponse(200, result, None))
    try:
        session.commit()
    except IntegrityError:
        # The same key committed by a concurrent retry first: this one's counts are rolled
        # back with it, and its answer is the one stored.
        session.rollback()
        replay = find_replay(session, gallery.tenant_id, request)
        if replay is None:
            raise
        return replay.body
    return result


def sum_of_counts(session: Session) -> Any:
    """SUM of access counts that cannot overflow: SQLite's SUM of integers raises on an int64
    overflow (counts saturate at 2⁶³ − 1 each, so two of them overflow a sum), its TOTAL is a
    float (exact up to 2⁵³); PostgreSQL's SUM of bigint is numeric. Read it through
    ``saturated``."""
    column = AccessCount.count
    if session.get_bind().dialect.name == "sqlite":
        return func.total(column)
    return func.sum(column)


def saturated(total: Any) -> int:
    """A sum of counts as an int, at most 2⁶³ − 1 (what every count column holds)."""
    return min(int(total or 0), INT64_MAX)


def counted(session: Session, gallery_id: str) -> tuple[int, int]:
    """(items with a count, sum of their counts, saturating at 2⁶³ − 1) of a gallery."""
    items, total = session.execute(
        select(func.count(), sum_of_counts(session)).where(AccessCount.gallery_id == gallery_id)
    ).one()
    return int(items), saturated(total)


# -- reading -------------------------------------------------------------------------------------


def _token(values: list[Any]) -> str:
    raw = json.dumps(values, ensure_ascii=False, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _untoken(token: str, order: str) -> list[Any]:
    """The cursor of the previous page: [item id] (order "id") or [count, item id] ("count")."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        values = json.loads(raw.decode("utf-8"))
    except (binascii.Error, UnicodeError, ValueError) as exc:
        raise invalid("page_token", "not a token this service issued") from exc
    expected = (str,) if order == "id" else (int, str)
    if (
        not isinstance(values, list)
        or len(values) != len(expected)
        or not all(type(v) is t for v, t in zip(values, expected, strict=True))
        # What no row holds never reaches the database (PostgreSQL refuses NUL in text and
        # integers past bigint with an error, not an empty page).
        or _BAD_TOKEN_TEXT.search(values[-1])
        or (order == "count" and not 0 <= values[0] <= INT64_MAX)
    ):
        raise invalid("page_token", f"not a token of this listing (order={order})")
    return values


def page(
    session: Session, gallery_id: str, order: str, page_token: str | None, limit: int
) -> tuple[list[dict[str, Any]], str | None]:
    """One page of (id, count), by item id or by count (largest first, ties by id), and the
    token of the next (keyset paging: a page never repeats or skips a row that did not move)."""
    query = select(AccessCount.item_id, AccessCount.count).where(
        AccessCount.gallery_id == gallery_id
    )
    if order == "count":
        if page_token is not None:
            count, item_id = _untoken(page_token, order)
            query = query.where(
                (AccessCount.count < count)
                | ((AccessCount.count == count) & (AccessCount.item_id > item_id))
            )
        query = query.order_by(AccessCount.count.desc(), AccessCount.item_id)
    else:
        if page_token is not None:
            (item_id,) = _untoken(page_token, order)
            query = query.where(AccessCount.item_id > item_id)
        query = query.order_by(AccessCount.item_id)
    rows = session.execute(query.limit(limit + 1)).all()
    items = [{"id": item_id, "count": int(count)} for item_id, count in rows[:limit]]
    if len(rows) <= limit:
        return items, None
    last = items[-1]
    return items, _token([last["count"], last["id"]] if order == "count" else [last["id"]])


def counts_by_point(session: Session, gallery_id: str, point_ids: np.ndarray) -> np.ndarray | None:
    """The access count of each of ``point_ids`` (internal ids, ascending, as the gallery's
    points come), 0 for items without one; None when the gallery has no positive count."""
    rows = session.execute(
        select(AccessCount.vector_id, AccessCount.count).where(
            AccessCount.gallery_id == gallery_id, AccessCount.count > 0
        )
    ).all()
    return at_points(rows, point_ids)


def at_points(rows: Sequence[Any], point_ids: np.ndarray) -> np.ndarray | None:
    """(internal id, value) rows spread over ``point_ids`` (ascending), 0 where none; None for
    no rows. A row whose item the points do not hold (it cannot be: deleting an item deletes its
    rows under the gallery's lock) is left out rather than misplaced."""
    if not rows:
        return None
    vector_ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
    values = np.fromiter((r[1] for r in rows), dtype=np.float64, count=len(rows))
    out = np.zeros(len(point_ids), dtype=np.float64)
    if not len(point_ids):
        return out
    at = np.searchsorted(point_ids, vector_ids)
    held = (at < len(point_ids)) & (point_ids[np.minimum(at, len(point_ids) - 1)] == vector_ids)
    out[at[held]] = values[held]
    return out
