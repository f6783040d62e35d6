"""The service's own tally of what its searches returned: per item, the sum of 1 / rank over
every search that returned it (the top hit counts 1, the tenth 0.1).

A weaker signal of traffic than access counts (issue 25: ranking by what search merely returned,
nine hits in ten not what the user wanted, was no better than random), so the backfill plan uses
it only where its validation against the access counts finds it helps
(``app.ml.backfill.traffic_model``); it always reports it.

Searches must not wait on a database write (under SQLite one writer at a time: a long upload
would stall every search behind it), so the tally is kept in memory per process and written by
one background thread every ``search_returned_flush_s`` seconds (and when the process stops, and
before a plan reads it). It is a statistic, not acknowledged data: a crash loses at most the last
interval of it, a gallery deleted meanwhile drops its share, and a failed write keeps the tally
for the next try, up to ``MAX_PENDING`` entries (beyond, the newest are dropped and counted in
``dropped``). Off with ``search_returned_tally=false``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager

import numpy as np
from sqlalchemy import select, text
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session

from app.core.errors import log_background_failure
from app.galleries.models import Gallery, ReturnedWeight
from app.migration.access import at_points

log = logging.getLogger(__name__)

# Distinct (gallery, item) entries held in memory at most (~100 B each: about 100 MB).
MAX_PENDING = 1_000_000

_ADD = "weight = gallery_returned.weight + excluded.weight"
_UPSERT_PG = text(
    "INSERT INTO gallery_returned (gallery_id, vector_id, weight) "
    "SELECT :gallery_id, t.vector_id, t.weight FROM unnest("
    "CAST(:vector_ids AS bigint[]), CAST(:weights AS double precision[])"
    ") AS t(vector_id, weight) "
    f"ON CONFLICT (gallery_id, vector_id) DO UPDATE SET {_ADD}"
)
_UPSERT_SQLITE = (
    "INSERT INTO gallery_returned (gallery_id, vector_id, weight) VALUES (?, ?, ?) "
    f"ON CONFLICT (gallery_id, vector_id) DO UPDATE SET {_ADD}"
)

SessionFactory = Callable[[], AbstractContextManager[Session]]


def rank_weights(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct internal ids, their summed 1 / rank) of a (queries × k) block of hits, where
    −1 marks no hit."""
    ids = np.asarray(ids, dtype=np.int64)
    if ids.ndim != 2 or ids.size == 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float64)
    weights = np.broadcast_to(1.0 / np.arange(1, ids.shape[1] + 1), ids.shape)
    held = ids >= 0
    distinct, at = np.unique(ids[held], return_inverse=True)
    return distinct, np.bincount(at, weights=weights[held], minlength=len(distinct))


class ReturnedTally:
    """One process's pending tally and the thread that writes it (``start``/``stop``)."""

    def __init__(self, enabled: bool, flush_s: float, max_pending: int = MAX_PENDING) -> None:
        self.enabled = enabled
        self.flush_s = flush_s
        self.max_pending = max_pending
        self.dropped = 0
        self._pending: dict[str, dict[int, float]] = {}
        self._size = 0
        self._lock = threading.Lock()
        # One flush at a time: the thread's, a plan's and the final one never interleave.
        self._flushing = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._sessions: SessionFactory | None = None
        self._thread: threading.Thread | None = None

    # -- recording (any request thread) ------------------------------------------------------

    def record(self, gallery_id: str, ids: np.ndarray) -> None:
        """Add one search's hits (internal ids, queries × k in rank order, −1 for none)."""
        if not self.enabled:
            return
        self.add(gallery_id, *rank_weights(ids))

    def add(self, gallery_id: str, distinct: np.ndarray, weights: np.ndarray) -> None:
        """Add weights already reduced by ``rank_weights`` (``DeferredTally.commit``)."""
        if not self.enabled or not len(distinct):
            return
        with self._lock:
            tally = self._pending.setdefault(gallery_id, {})
            for vector_id, weight in zip(distinct.tolist(), weights.tolist(), strict=True):
                if vector_id in tally:
                    tally[vector_id] += weight
                elif self._size < self.max_pending:
                    tally[vector_id] = weight
                    self._size += 1
                else:
                    self.dropped += 1
            due = self._size >= self.max_pending
        if self._sessions is not None and (self.flush_s == 0 or due):
            if self.flush_s == 0:
                self.flush()
            else:
                self._wake.set()

    def pending(self, gallery_id: str) -> int:
        """Entries of ``gallery_id`` not yet written."""
        with self._lock:
            return len(self._pending.get(gallery_id, {}))

    # -- writing -------------------------------------------------------------------------------

    def flush(self, gallery_id: str | None = None) -> int:
        """Write what is pending (of one gallery, or of all) to the database, one transaction
        per gallery; returns the entries written. Does nothing before ``start``."""
        if self._sessions is None:
            return 0
        with self._flushing:
            taken = self._take(gallery_id)
            written = 0
            for gid, tally in taken.items():
                try:
                    written += self._write(gid, tally)
                except IntegrityError:
                    # The gallery was deleted meanwhile: its tally goes with it.
                    log.info("returned tally of deleted gallery %s dropped", gid)
                except OperationalError as exc:
                    # Locked or unreachable: kept for the next try.
                    log.warning("returned tally of gallery %s not written yet: %s", gid, exc)
                    self._restore(gid, tally)
            return written

    def _take(self, gallery_id: str | None) -> dict[str, dict[int, float]]:
        with self._lock:
            if gallery_id is None:
                taken, self._pending = self._pending, {}
            else:
                taken = {gallery_id: self._pending.pop(gallery_id, {})}
            self._size -= sum(len(t) for t in taken.values())
            return {g: t for g, t in taken.items() if t}

    def _restore(self, gallery_id: str, tally: dict[int, float]) -> None:
        with self._lock:
            mine = self._pending.setdefault(gallery_id, {})
            for vector_id, weight in tally.items():
                if vector_id in mine:
                    mine[vector_id] += weight
                elif self._size < self.max_pending:
                    mine[vector_id] = weight
                    self._size += 1
                else:
                    self.dropped += 1

    def _write(self, gallery_id: str, tally: dict[int, float]) -> int:
        assert self._sessions is not None
        ids = sorted(tally)
        weights = [tally[i] for i in ids]
        with self._sessions() as session:
            # A deleted gallery: nothing to add to (SQLite enforces no foreign key by itself).
            if session.scalar(select(Gallery.id).where(Gallery.id == gallery_id)) is None:
                return 0
            if session.get_bind().dialect.name == "postgresql":
                session.execute(
                    _UPSERT_PG, {"gallery_id": gallery_id, "vector_ids": ids, "weights": weights}
                )
            else:
                session.connection().exec_driver_sql(
                    _UPSERT_SQLITE,
                    [(gallery_id, i, w) for i, w in zip(ids, weights, strict=True)],
                )
            session.commit()
        return len(ids)

    # -- the writer thread -----------------------------------------------------------------------

    def start(self, sessions: SessionFactory) -> None:
        self._sessions = sessions
        if not self.enabled or self.flush_s == 0 or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="returned-tally", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait(self.flush_s)
            self._wake.clear()
            try:
                self.flush()
            except Exception as exc:  # the writer must outlive one bad write
                log_background_failure(log, "returned tally flush failed", exc)

    def stop(self) -> None:
        """Stop the thread and write what is left."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        try:
            self.flush()
        except Exception as exc:
            log_background_failure(log, "final returned tally flush failed", exc)


class DeferredTally:
    """A search's tally held back until its answer is known to be sent (an ``.npz`` answer is
    searched whole before it is written, and one refused then — too large, a full disk — returned
    nothing): ``record`` as ``ReturnedTally``'s, ``commit`` passes the sum on. It holds one weight
    per distinct item returned, not the hits."""

    def __init__(self, tally: ReturnedTally) -> None:
        self.tally = tally
        self._held: dict[str, dict[int, float]] = {}

    @property
    def enabled(self) -> bool:
        return self.tally.enabled

    def record(self, gallery_id: str, ids: np.ndarray) -> None:
        if not self.tally.enabled:
            return
        held = self._held.setdefault(gallery_id, {})
        for vector_id, weight in zip(*(a.tolist() for a in rank_weights(ids)), strict=True):
            held[vector_id] = held.get(vector_id, 0.0) + weight

    def commit(self) -> None:
        for gallery_id, held in self._held.items():
            ids = np.fromiter(held.keys(), dtype=np.int64, count=len(held))
            weights = np.fromiter(held.values(), dtype=np.float64, count=len(held))
            self.tally.add(gallery_id, ids, weights)
        self._held.clear()


def weights_by_point(session: Session, gallery_id: str, point_ids: np.ndarray) -> np.ndarray | None:
    """The returned weight of each of ``point_ids`` (internal ids, ascending), 0 for items
    never returned; None when nothing of the gallery was tallied."""
    rows = session.execute(
        select(ReturnedWeight.vector_id, ReturnedWeight.weight).where(
            ReturnedWeight.gallery_id == gallery_id, ReturnedWeight.weight > 0
        )
    ).all()
    return at_points(rows, point_ids)
