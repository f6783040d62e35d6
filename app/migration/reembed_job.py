"""A migration that drives itself (issue 43, item 6): a job sends a gallery's stored texts through
the model's embedder, batch by batch, and stores the vectors as re-embedded items of the model —
a whole migration with no client-side embedding.

The job is a row of ``upgrade_jobs`` of method ``reembed`` (the same claim, heartbeat, cancel,
sweeper, Celery transport and per-tenant quota as upgrades: ``app.upgrades.executor`` hands it to
``run`` here). Each batch is committed before the next is embedded, so the database is the
job's progress: an attempt computes what is still missing and embeds only that, and a worker
killed mid-run loses at most the batch in flight (nothing half-stored: a batch's vectors are
checked whole by the embedder client before ``store_embedded`` writes them in one
transaction). Items a two-stage search embedded meanwhile are not embedded again.

Order: the backfill plan's (traffic × expected gain, ``app.migration.reembed.plan``) when the
model's plan can be fitted, else the gallery's own order; ``fraction`` is the share of the
gallery re-embedded when the job ends. A rate limit (items per minute, capped by the server)
paces the embedder; a failing embedder is retried with backoff, then the job fails saying how
many items it stored (post it again to resume).

An attached collection whose source names a ``text_field`` is migrated the same way: its items'
texts are read from the collection batch by batch (items without one are skipped and counted),
and the vectors are written in place as uploaded re-embedded vectors are
(``app.migration.in_place.texts``); without a text field the job is refused with 409.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.core.db import Database, new_id
from app.core.errors import Problem, conflict
from app.core.settings import Settings
from app.embedders.client import EmbedderFailed, EmbedderSpec, embed_texts
from app.embedders.models import Embedder
from app.embedders.service import spec_of
from app.galleries.models import Gallery, GalleryText
from app.galleries.service import get_gallery
from app.jobs.models import QUEUED, RUNNING, UpgradeJob
from app.migration.in_place import texts as in_place_texts
from app.migration.reembed import (
    EmbeddedTexts,
    backbone_for,
    plan,
    reembedded_ids,
    store_embedded,
)
from app.migration.schemas import ReembedCreate
from app.ml.methods.training import TrainingHooks
from app.models.models import TrainedModel
from app.models.service import ModelCache
from app.upgrades import executor
from app.upgrades.service import check_job_quota
from app.vectors.engine import ATTACHED
from app.vectors.faiss.index_store import IndexStore
from app.vectors.storage import storage_for

log = logging.getLogger(__name__)

METHOD = "reembed"
# Longest single wait between two checks of the cancel flag while pacing or backing off.
WAIT_SLICE_S = 0.5
# Backoff after a failed embedder call: 1 s, 2 s, 4 s, … capped (a priori: long enough for a
# restarting embedder, short enough that a cancel or a fix is seen within a minute).
BACKOFF_CAP_S = 30.0


# -- POST: validate and queue ---------------------------------------------------------------------


def create_reembed(
    session: Session, settings: Settings, tenant_id: str, gallery_id: str, request: ReembedCreate
) -> UpgradeJob:
    """Validate at once (bad input never becomes a failed job) and queue the job."""
    check_job_quota(session, settings, tenant_id)
    gallery = get_gallery(session, tenant_id, gallery_id)
    # An attached collection's texts are in its text field (none named: 409 saying so).
    in_place_texts.refuse_without_texts(gallery, "a re-embed job")
    row = backbone_for(session, tenant_id, gallery, request.model_id)
    if row.embedder_id is None or session.get(Embedder, row.embedder_id) is None:
        raise conflict(
            f"model {row.id} has no embedder: register one (`POST /v1/embedders`) and set it "
            f'with `PATCH /v1/models/{row.id}` {{"embedder_id": …}}'
        )
    texts = gallery.vector_storage in ATTACHED or session.scalar(
        select(func.count()).select_from(GalleryText).where(GalleryText.gallery_id == gallery.id)
    )
    if not texts:
        raise conflict(
            f"gallery {gallery.id} holds no document texts to embed: upload its items with "
            "`texts` (`nobackfill gallery upload --texts`)"
        )
    active = session.scalar(
        select(UpgradeJob.id).where(
            UpgradeJob.method == METHOD,
            UpgradeJob.gallery_id == gallery.id,
            UpgradeJob.base_model_id == row.id,
            UpgradeJob.status.in_((QUEUED, RUNNING)),
        )
    )
    if active is not None:
        raise conflict(
            f"re-embed job {active} already migrates gallery {gallery.id} to model {row.id}; "
            "wait for it or cancel it"
        )
    cap = settings.reembed_max_items_per_minute
    if request.items_per_minute is not None and request.items_per_minute > cap:
        raise Problem(
            422,
            "Invalid request",
            f"items_per_minute: must be ≤ {cap} on this server "
            "(NOBACKFILL_REEMBED_MAX_ITEMS_PER_MINUTE)",
        )
    job = UpgradeJob(
        id=new_id("rej"),
        tenant_id=tenant_id,
        method=METHOD,
        dataset_id=None,
        gallery_id=gallery.id,
        base_model_id=row.id,
        params={
            "fraction": request.fraction,
            "order": request.order,
            "batch_size": request.batch_size,
            "items_per_minute": request.items_per_minute or cap,
        },
        status=QUEUED,
        progress={},
    )
    session.add(job)
    return job


# -- the job --------------------------------------------------------------------------------------


def pace(items_done: int, items_per_minute: int, elapsed_s: float) -> float:
    """Seconds to wait so that ``items_done`` items took at least their share of the rate."""
    return max(0.0, items_done * 60.0 / items_per_minute - elapsed_s)


def wait(seconds: float, hooks: TrainingHooks, sleep: Callable[[float], None] = time.sleep) -> None:
    """Sleep ``seconds`` in slices, raising ``TrainingCancelled`` as soon as the job must stop."""
    end = time.monotonic() + seconds
    while True:
        hooks.check()
        left = end - time.monotonic()
        if left <= 0:
            return
        sleep(min(left, WAIT_SLICE_S))


def _targets(
    session: Session,
    settings: Settings,
    gallery: Gallery,
    row: TrainedModel,
    fraction: float,
    order: str,
) -> tuple[list[int], str, str | None]:
    """(internal ids still to embed, in order; the order used; why another order was used)."""
    done = set(reembedded_ids(session, gallery.id, row.id).tolist())
    if gallery.vector_storage in ATTACHED:
        # Which items of a collection carry a text is learnt batch by batch (those without
        # are skipped and counted): every item, in id order.
        with_text = storage_for(session, gallery).all_ids(session, gallery).tolist()
    else:
        with_text = list(
            session.scalars(
                select(GalleryText.vector_id)
                .where(GalleryText.gallery_id == gallery.id)
                .order_by(GalleryText.vector_id)
            )
        )
    total = int(gallery.count)
    count = max(0, round(fraction * total) - len(done))
    note = None
    if order == "plan":
        # A private index copy: the job may run in a worker process that holds none, and must
        # not write the API's index files.
        folder = Path(tempfile.mkdtemp(prefix="nobackfill-reembed-"))
        try:
            store = IndexStore(folder, engine=settings.search_engine)
            # Exactly the plan the user sees for this share (items without a text among them
            # are skipped and counted as such).
            planned = plan(session, store, ModelCache(settings), gallery, row, None, count)
            names = planned["ids"]
            found = storage_for(session, gallery).lookup(session, gallery, names)
            return [found[n][0] for n in names if n in found], "plan", None
        except Problem as exc:
            note = f"the plan could not be fitted ({exc.detail}); the gallery's order is used"
        except ValueError as exc:
            note = f"the plan could not be fitted ({exc}); the gallery's order is used"
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    pending = [v for v in with_text if v not in done]
    return pending[:count], "gallery", note


def _embed_batch(
    settings: Settings,
    spec: EmbedderSpec,
    texts: list[str],
    hooks: TrainingHooks,
    failures: list[str],
) -> np.ndarray:
    """The batch's vectors, retrying a failing embedder with backoff; after
    ``reembed_retries`` failures in a row raises ``ValueError`` (the job fails)."""
    for attempt in range(settings.reembed_retries + 1):
        try:
            return embed_texts(spec, texts, "document", settings.embedder_timeout_s)
        except EmbedderFailed as exc:
            failures.append(exc.reason)
            log.warning("re-embed: embedder %s failed (%s): %s", spec.id, exc.reason, exc)
            if attempt == settings.reembed_retries:
                raise ValueError(
                    f"the embedder failed {attempt + 1} times in a row ({exc.reason}: {exc})"
                ) from exc
            wait(min(BACKOFF_CAP_S, 2.0**attempt), hooks)
    raise AssertionError("unreachable")


def run(db: Database, settings: Settings, job: UpgradeJob, hooks: TrainingHooks) -> dict[str, Any]:
    """Embed and store the job's items; returns the report. Raises ``TrainingCancelled`` when
    asked to stop (the executor cancels, times out or requeues the job; what was stored stays)."""
    params = job.params or {}
    with db.session() as session:
        gallery = session.get(Gallery, job.gallery_id) if job.gallery_id else None
        if gallery is None:
            raise ValueError("the gallery of this re-embed job was deleted")
        row = session.get(TrainedModel, job.base_model_id) if job.base_model_id else None
        if row is None:
            raise ValueError("the model of this re-embed job was deleted")
        embedder = session.get(Embedder, row.embedder_id) if row.embedder_id else None
        if embedder is None:
            raise ValueError(f"model {row.id} has no embedder any more")
        spec = spec_of(embedder)
        targets, order, note = _targets(
            session, settings, gallery, row, float(params.get("fraction", 1.0)), params["order"]
        )
        session.expunge(gallery)
        session.expunge(row)
    batch = min(int(params.get("batch_size") or spec.max_batch), spec.max_batch)
    rate = int(params.get("items_per_minute") or settings.reembed_max_items_per_minute)
    started = time.monotonic()
    embedded = skipped = calls = 0
    failures: list[str] = []

    def report_progress() -> None:
        handled = embedded + skipped
        elapsed = time.monotonic() - started
        eta = elapsed / handled * (len(targets) - handled) if handled else None
        hooks.progress(
            {
                "phase": "embedding",
                "done": handled,
                "total": len(targets),
                "embedded": embedded,
                "skipped": skipped,
                "order": order,
                "eta_s": eta,
            }
        )

    report_progress()
    store = IndexStore(Path(tempfile.gettempdir()))  # locks only: store_embedded reads no index
    for start in range(0, len(targets), batch):
        hooks.check()
        wait(pace(embedded + skipped, rate, time.monotonic() - started), hooks)
        chunk = targets[start : start + batch]
        with db.session() as session:
            names = {
                v: item
                for v, (item, _) in storage_for(session, gallery)
                .names(session, gallery, chunk)
                .items()
            }
            texts = in_place_texts.texts_of(session, gallery, names)
        wanted = [v for v in chunk if v in texts and v in names]
        skipped += len(chunk) - len(wanted)
        if wanted:
            vectors = _embed_batch(settings, spec, [texts[v] for v in wanted], hooks, failures)
            calls += 1
            with db.session() as session:
                fresh_gallery = session.get(Gallery, job.gallery_id)
                fresh_row = session.get(TrainedModel, row.id)
                if fresh_gallery is None or fresh_row is None:
                    raise ValueError("the gallery or the model was deleted while the job ran")
                batch_embedded = EmbeddedTexts(
                    {v: names[v] for v in wanted}, {v: texts[v] for v in wanted}, vectors
                )
                if fresh_gallery.vector_storage in ATTACHED:
                    # Written in place, as an upload would be (items the collection lost, or
                    # whose text changed, left out).
                    stored = len(
                        in_place_texts.store_embedded_in_place(
                            session, store, fresh_gallery, fresh_row, batch_embedded
                        )
                    )
                else:
                    stored = store_embedded(
                        session, store, fresh_gallery, fresh_row, batch_embedded
                    )
            embedded += stored
            # Items a search stored meanwhile, deleted or whose text changed: not this job's.
            skipped += len(wanted) - stored
        report_progress()
    with db.session() as session:
        reembedded = len(reembedded_ids(session, job.gallery_id, row.id))
        total = session.scalar(select(Gallery.count).where(Gallery.id == job.gallery_id)) or 0
    return {
        "reembed": {
            "order": order,
            "order_note": note,
            "targeted": len(targets),
            "embedded": embedded,
            "skipped": skipped,
            "embedder_calls": calls,
            "embedder_failures": failures,
            "seconds": time.monotonic() - started,
            "reembedded": reembedded,
            "total": int(total),
            "fraction_reembedded": reembedded / total if total else 0.0,
        }
    }


executor.register_kind(METHOD, run)
