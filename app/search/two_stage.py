"""Two-stage search in the service (issue 43, items 4 and 7): candidates from the gallery's own
index, ranked by the new model; candidates without a new vector embedded lazily from their
stored texts and kept as re-embedded items of the model, so the migration advances in traffic
order by itself.

The math is ``app.ml.backfill.two_stage`` (the same rerank the benchmark measures, weight 0: the
new model alone among the candidates). Here: which candidates have new vectors, one batched
embedder call per request for those that do not (their texts), the guards (a circuit per
embedder, a budget per tenant); the order of the hits is ``app.search.ranking``'s (the whole
batch at once). Anything the embedder gets wrong raises ``Degraded``: the caller answers the
single-stage search instead, and nothing half-embedded is stored (vectors are checked whole
before ``store_embedded`` writes them in one transaction).

An attached collection (issue 43, item 2) takes part when its source names a ``text_field``:
stage one is the collection's own search, the candidates' new vectors and texts are read from
the collection, and what the embedder returns is written in place (``_in_place_vectors``,
``app.migration.in_place.texts``); without a text field the search answers 409 saying so.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.core.errors import Problem
from app.core.settings import Settings
from app.embedders.client import EmbedderFailed, EmbedderSpec, embed_texts
from app.embedders.guard import EmbeddingGuards
from app.embedders.models import Embedder
from app.embedders.service import spec_of
from app.galleries.models import Gallery
from app.galleries.service import item_texts
from app.migration.in_place import texts as in_place_texts
from app.migration.reembed import EmbeddedTexts, reembedded_by_id, store_embedded
from app.ml.backfill.two_stage import FusionScale, unit
from app.models.models import TrainedModel
from app.vectors.engine import ATTACHED
from app.vectors.faiss.index_store import IndexStore

# One lazy re-embed at a time per (gallery, model) in this process: two searches that need the
# same candidates never embed them twice (the second finds them stored).
_lazy_locks: dict[tuple[str, str], threading.Lock] = {}
_lazy_guard = threading.Lock()


def _lazy_lock(gallery_id: str, model_id: str) -> threading.Lock:
    with _lazy_guard:
        return _lazy_locks.setdefault((gallery_id, model_id), threading.Lock())


class Degraded(Exception):
    """The new model cannot rank these candidates now; ``reason`` says why (a slug)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class NewVectors:
    """The model's new vectors of some items: their internal ids sorted, the row of each sorted
    id in ``rows`` (``ids`` = the rows' ids at ``order``), and the unit rows in the order they
    came. The rows are never reordered: the in-memory copy of the features is used as it is
    (``app.migration.reembed.reembedded_by_id`` keeps its sort), so a search whose candidates
    are all embedded copies nothing of size O(gallery)."""

    ids: np.ndarray
    order: np.ndarray
    rows: np.ndarray

    @classmethod
    def of(cls, ids: np.ndarray, rows: np.ndarray) -> NewVectors:
        order = np.argsort(ids, kind="stable")
        return cls(ids[order], order, rows)

    @classmethod
    def stored(cls, session: Session, gallery_id: str, model_id: str) -> NewVectors:
        """The (gallery, model)'s re-embedded items, as committed."""
        return cls(*reembedded_by_id(session, gallery_id, model_id))

    def positions(self, wanted: np.ndarray) -> np.ndarray:
        """Row in ``rows`` of each wanted id, −1 where it has none."""
        if self.ids.size == 0:
            return np.full(wanted.shape, -1, dtype=np.int64)
        at = np.clip(np.searchsorted(self.ids, wanted), 0, self.ids.size - 1)
        return np.where(self.ids[at] == wanted, self.order[at], -1)


@dataclass(frozen=True)
class Fusion:
    """A model's served fusion: the weight on the old score and the two spaces' scale, as its
    upgrade fitted them on half of its held-out queries (``app.ml.upgrade.two_stage_curve``)."""

    weight: float
    scale: FusionScale


def model_fusion(session: Session, row: TrainedModel) -> Fusion | None:
    """The fusion the model's upgrade report holds (None: not fitted, or weight 0). A report
    never changes, so this reads one row per model and search."""
    if row.upgrade_id is None:
        return None
    from app.jobs.models import UpgradeJob

    report = session.scalar(select(UpgradeJob.report).where(UpgradeJob.id == row.upgrade_id))
    fusion = ((report or {}).get("two_stage") or {}).get("fusion")
    if not fusion or not fusion.get("weight"):
        return None
    return Fusion(float(fusion["weight"]), FusionScale(**fusion["scale"]))


def embedder_of(session: Session, row: TrainedModel) -> EmbedderSpec | None:
    if row.embedder_id is None:
        return None
    embedder = session.get(Embedder, row.embedder_id)
    return None if embedder is None else spec_of(embedder)


def guarded_embed(
    settings: Settings,
    guards: EmbeddingGuards,
    tenant_id: str,
    spec: EmbedderSpec,
    texts: Sequence[str],
    kind: str,
) -> np.ndarray:
    """The embedder's vectors of ``texts``, through the tenant's budget (429 with Retry-After
    when spent) and the embedder's circuit; raises ``Degraded`` on any failure. The caller has
    ended its transaction: no pooled connection waits on the embedder."""
    if guards.circuits.is_open(spec.id):
        raise Degraded("embedder-circuit-open")
    wait = guards.budgets.take(tenant_id, len(texts))
    if wait:
        raise Problem(
            429,
            "Embedding budget spent",
            f"this search needs {len(texts)} texts embedded and the tenant's budget "
            f"(NOBACKFILL_EMBED_ITEMS_PER_MINUTE = {settings.embed_items_per_minute}) is spent; "
            "retry later, or search without rerank",
            headers={"Retry-After": str(wait)},
            slug="embedding-budget",
        )
    try:
        vectors = embed_texts(spec, texts, kind, settings.embedder_timeout_s)
    except EmbedderFailed as exc:
        guards.circuits.record(spec.id, False)
        raise Degraded(f"embedder-{exc.reason}") from exc
    guards.circuits.record(spec.id, True)
    return vectors


def new_vectors(
    session: Session,
    settings: Settings,
    store: IndexStore,
    guards: EmbeddingGuards,
    tenant_id: str,
    gallery: Gallery,
    row: TrainedModel,
    candidates: np.ndarray,
    names: dict[int, tuple[str, str | None]],
) -> tuple[NewVectors, int]:
    """(the model's new vectors of the gallery's re-embedded items, how many this call
    embedded): candidates without one but with a stored text are embedded first, in one
    batched embedder call, and stored. Raises ``Degraded`` when the embedder fails."""
    spec = embedder_of(session, row)
    with _lazy_lock(gallery.id, row.id):
        if gallery.vector_storage in ATTACHED:
            return _in_place_vectors(
                session, settings, store, guards, tenant_id, spec, gallery, row, candidates, names
            )
        have = NewVectors.stored(session, gallery.id, row.id)
        missing = candidates[have.positions(candidates) < 0]
        missing = np.array([v for v in missing.tolist() if v in names], dtype=np.int64)
        if spec is None or missing.size == 0:
            return have, 0
        texts = item_texts(session, gallery.id, missing.tolist())
        wanted = [v for v in missing.tolist() if v in texts]
        if not wanted:
            return have, 0
        # End the read transaction first: a slow or hung embedder must not hold a pooled
        # connection (with the pool taken, every tenant's request would answer 503).
        session.commit()
        vectors = guarded_embed(
            settings, guards, tenant_id, spec, [texts[v] for v in wanted], "document"
        )
        stored = store_embedded(
            session,
            store,
            gallery,
            row,
            EmbeddedTexts({v: names[v][0] for v in wanted}, {v: texts[v] for v in wanted}, vectors),
        )
        return NewVectors.stored(session, gallery.id, row.id), stored


def _in_place_vectors(
    session: Session,
    settings: Settings,
    store: IndexStore,
    guards: EmbeddingGuards,
    tenant_id: str,
    spec: EmbedderSpec | None,
    gallery: Gallery,
    row: TrainedModel,
    candidates: np.ndarray,
    names: dict[int, tuple[str, str | None]],
) -> tuple[NewVectors, int]:
    """``new_vectors`` of an attached collection (issue 43, item 2): the candidates' new vectors
    are read from the collection (the in-place migration's vector of them), the texts of those
    without one from the collection's text field, and what the embedder returns is written in
    place (``app.migration.in_place.texts``) as an upload of re-embedded items would be."""
    items = {v: names[v][0] for v in candidates.tolist() if v in names}
    have_ids, have_rows = in_place_texts.in_place_vectors(session, gallery, row.id, items)
    have = NewVectors.of(have_ids, have_rows)
    held = set(have_ids.tolist())
    missing = {v: item for v, item in items.items() if v not in held}
    if spec is None or not missing:
        return have, 0
    texts = in_place_texts.texts_of(session, gallery, missing)
    wanted = [v for v in missing if v in texts]
    if not wanted:
        return have, 0
    session.commit()  # no pooled connection waits on the embedder
    vectors = guarded_embed(
        settings, guards, tenant_id, spec, [texts[v] for v in wanted], "document"
    )
    written = in_place_texts.store_embedded_in_place(
        session,
        store,
        gallery,
        row,
        EmbeddedTexts({v: missing[v] for v in wanted}, {v: texts[v] for v in wanted}, vectors),
    )
    if not written:
        return have, 0
    at = {v: n for n, v in enumerate(wanted)}
    new_rows = unit(np.asarray(vectors, dtype=np.float64)[[at[v] for v in written]])
    rows = new_rows if have_ids.size == 0 else np.vstack([have_rows, new_rows])
    ids = np.concatenate([have_ids, np.asarray(written, dtype=np.int64)])
    return NewVectors.of(ids, rows), len(written)


def check_depth(settings: Settings, depth: int | None, n_queries: int, k: int) -> int:
    """The depth a request gets, or 422 naming ``rerank.depth`` before any work."""
    from app.core.errors import invalid

    depth = settings.rerank_default_depth if depth is None else depth
    if depth > settings.rerank_max_depth:
        raise invalid("rerank.depth", f"must be ≤ {settings.rerank_max_depth} (RERANK_MAX_DEPTH)")
    if depth < k:
        raise invalid("rerank.depth", f"must be ≥ k ({k}): the hits come from the candidates")
    if n_queries * depth > settings.rerank_max_candidates:
        raise invalid(
            "rerank.depth",
            f"{n_queries} queries × depth {depth} exceeds {settings.rerank_max_candidates} "
            "candidates per request (RERANK_MAX_CANDIDATES): send fewer queries or a smaller "
            "depth",
        )
    return depth


def refuse_attached(gallery: Gallery, attached: Any) -> None:
    """409 for a two-stage search of an attached gallery that names no text field: its
    candidates have no texts to embed (``app.migration.in_place.texts.refuse_without_texts``)."""
    if gallery.vector_storage in attached:
        in_place_texts.refuse_without_texts(gallery, "a two-stage search")
