"""``Client``: the nobackfill HTTP API from Python (numpy in; numpy arrays and dicts out)."""

from __future__ import annotations

import io
import json
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from app.client.errors import ApiError
from app.client.results import SearchResults
from app.client.transport import (
    Progress,
    Transport,
    drop_none,
)
from app.client.uploads import (
    InputError,
    RowParts,
    check_rows,
    float_matrix,
    npy_bytes,
    string_array,
)

NPY_MEDIA_TYPE = "application/x-npy"
NPZ_MEDIA_TYPE = "application/x-npz"
TERMINAL = ("succeeded", "failed", "cancelled")


class Client(Transport):
    """A nobackfill server. ``url`` defaults to ``$NOBACKFILL_URL`` (else the URL ``nobackfill
    serve`` recorded in ``$NOBACKFILL_DATA_DIR/server_url``; with neither, ``NoServerError``
    says how to name one: no port is guessed), ``key`` to ``$NOBACKFILL_KEY`` (else, for a
    server on this machine,
    ``$NOBACKFILL_DATA_DIR/api_key`` as ``nobackfill serve`` writes it).

    Uploads are cut into batches of at most ``batch_rows`` rows and ``batch_bytes`` bytes (below
    the server's default limits; a 413 naming a lower limit lowers them for this client) and
    resume after an interruption from a checkpoint in ``checkpoint_dir`` (default
    ``$NOBACKFILL_CHECKPOINT_DIR`` or ``~/.cache/nobackfill/uploads``). Requests that are safe to
    repeat (reads, upserts, creates with an Idempotency-Key) are retried ``retries`` times after a
    connection error or a 502/503/504."""

    def health(self) -> dict[str, Any]:
        return self._json("GET", "/healthz")

    # -- galleries ------------------------------------------------------------------------------
    def create_gallery(
        self,
        name: str,
        *,
        dim: int | None = None,
        model_name: str | None = None,
        metric: str | None = None,
        model_id: str | None = None,
        modality: str | None = None,
        index: str | None = None,
        index_params: dict[str, int] | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """An external gallery (``dim``, ``model_name``, ``metric``: "cosine" or "dot") or one
        holding a trained model's embeddings (``model_id``, ``modality``)."""
        body = drop_none(
            {
                "name": name,
                "dim": dim,
                "model_name": model_name,
                "metric": metric,
                "model_id": model_id,
                "modality": modality,
                "index": index,
                "index_params": index_params,
            }
        )
        return self._create("/v1/galleries", body, idempotency_key)

    def get_gallery(self, gallery_id: str) -> dict[str, Any]:
        return self._json("GET", f"/v1/galleries/{gallery_id}")

    def galleries(self) -> list[dict[str, Any]]:
        return list(self._pages("/v1/galleries"))

    def upload_vectors(
        self,
        gallery_id: str,
        ids: Sequence[str] | np.ndarray,
        vectors: np.ndarray | Sequence[Sequence[float]],
        labels: Sequence[str] | np.ndarray | None = None,
        *,
        texts: Sequence[str] | np.ndarray | None = None,
        batch_size: int | None = None,
        resume: bool = True,
        progress: Progress | None = None,
    ) -> dict[str, Any]:
        """Upsert rows by id in batches; returns ``{"upserted", "count", "batches",
        "resumed_from"}``. ``vectors`` are old-model vectors (external gallery) or backbone
        features (model-bound gallery, as ``features``); ``texts`` each item's document text
        (what a two-stage search embeds). Shapes, dtypes, NaN/Inf, duplicate ids and the
        gallery's dimension are checked before anything is sent."""
        gallery = self.get_gallery(gallery_id)
        model_bound = gallery["kind"] == "model"
        field = "features" if model_bound else "vectors"
        parts = self._rows(ids, {field: vectors}, labels)
        if texts is not None:
            parts.arrays["texts"] = string_array(texts, "texts")
            check_rows(len(parts), "texts", parts.arrays["texts"])
        expected = gallery.get("input_dim") if model_bound else gallery["dim"]
        width = parts.arrays[field].shape[1]
        if expected is not None and width != expected:
            raise InputError(f"{field}: {width} columns, but gallery {gallery_id} takes {expected}")
        path = f"/v1/galleries/{gallery_id}/vectors"
        return self._upload(
            path, parts, batch_size, resume, progress, f"/v1/galleries/{gallery_id}"
        )

    def upload_reembedded(
        self,
        gallery_id: str,
        ids: Sequence[str] | np.ndarray,
        features: np.ndarray | Sequence[Sequence[float]],
        model_id: str,
        *,
        batch_size: int | None = None,
        resume: bool = True,
        progress: Progress | None = None,
    ) -> dict[str, Any]:
        """Re-embedded items of a migration: the new backbone's ``features`` of items the gallery
        holds, for backbone model ``model_id`` (their old vectors stay). Batched and resumable like
        ``upload_vectors``; returns the same summary."""
        parts = self._rows(ids, {"features": features}, None)
        path = f"/v1/galleries/{gallery_id}/vectors"
        return self._upload(
            path,
            parts,
            batch_size,
            resume,
            progress,
            f"/v1/galleries/{gallery_id}",
            fixed={"model_id": model_id},
        )

    def backfill_plan(
        self,
        gallery_id: str,
        model_id: str,
        *,
        fraction: float | None = None,
        count: int | None = None,
    ) -> dict[str, Any]:
        """The next items to re-embed for ``model_id``, most valuable first (``["ids"]``), and
        what re-embedding them is expected to bring: ``fraction`` is the share of the gallery to
        have re-embedded once they are, ``count`` how many more to list (one of them). Read-only:
        retried like a GET."""
        if (fraction is None) == (count is None):
            raise InputError("give fraction or count (one of them)")
        body = drop_none({"model_id": model_id, "fraction": fraction, "count": count})
        path = f"/v1/galleries/{gallery_id}/backfill-plan"
        return self._json("POST", path, json=body, retry=True)

    def upload_access(
        self,
        gallery_id: str,
        ids: Sequence[str] | np.ndarray,
        counts: Sequence[int] | np.ndarray,
        *,
        batch_size: int | None = None,
        progress: Progress | None = None,
    ) -> dict[str, Any]:
        """Add access counts (what users opened or clicked) to the gallery's items, in batches
        of ``.npy`` parts; a repeated id is summed by the server. Returns ``{"added", "rows",
        "batches", "counted_items", "total"}``. Each batch carries an Idempotency-Key of its
        own, so a batch retried after a lost answer is counted once (the server replays its
        first answer); a failure says how many rows were counted before it."""
        names = string_array(ids, "ids")
        values = np.asarray(counts)
        if values.dtype.kind not in "iu" or values.ndim != 1:
            raise InputError(f"counts: expected a 1-D integer array, got {values.dtype}")
        if len(values) != len(names):
            raise InputError(f"counts: {len(values)} values for {len(names)} ids")
        if values.size and values.min() < 0:
            raise InputError("counts: must not be negative")
        parts = RowParts({"ids": names, "counts": values})
        total, path = len(parts), f"/v1/galleries/{gallery_id}/access"
        done, batches, added = 0, 0, 0
        while done < total:
            stop = min(total, done + self.limits.rows_for(parts, batch_size))
            files, _ = parts.multipart(done, stop)
            try:
                key = {"Idempotency-Key": f"access-{uuid.uuid4()}"}
                answer = self._json("POST", path, files=files, headers=key, retry=True)
            except (ApiError, httpx.TransportError) as exc:
                # A 413 is answered from the body's size, before anything is counted: the same
                # rows go again in smaller batches.
                too_large = isinstance(exc, ApiError) and exc.status == 413
                if too_large and self.limits.lower_from(exc.detail, stop - done, parts):
                    continue
                if done:
                    exc.add_note(f"rows 0–{done} of {total} were counted before this batch")
                raise
            done, batches, added = stop, batches + 1, added + answer["added"]
            if progress is not None:
                progress(done, total)
        # The gallery's totals once every batch is in (one read, not one per batch).
        summary = self._json("GET", path, params={"limit": 1})
        return {
            "added": added,
            "rows": total,
            "batches": batches,
            "counted_items": summary["counted_items"],
            "total": summary["total"],
        }

    # -- datasets -------------------------------------------------------------------------------
    def create_dataset(
        self,
        name: str,
        *,
        gallery_id: str | None = None,
        modalities: Sequence[str] | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        body = drop_none(
            {
                "name": name,
                "gallery_id": gallery_id,
                "modalities": None if modalities is None else list(modalities),
            }
        )
        return self._create("/v1/datasets", body, idempotency_key)

    def get_dataset(self, dataset_id: str) -> dict[str, Any]:
        return self._json("GET", f"/v1/datasets/{dataset_id}")

    def datasets(self) -> list[dict[str, Any]]:
        return list(self._pages("/v1/datasets"))

    def upload_items(
        self,
        dataset_id: str,
        ids: Sequence[str] | np.ndarray,
        features: np.ndarray | None = None,
        labels: Sequence[str] | np.ndarray | None = None,
        *,
        modalities: Mapping[str, np.ndarray] | None = None,
        batch_size: int | None = None,
        resume: bool = True,
        progress: Progress | None = None,
    ) -> dict[str, Any]:
        """Upsert a dataset's items (new-backbone ``features``, or one matrix per modality) in
        batches, checked and resumable as ``upload_vectors``."""
        if (features is None) == (modalities is None):
            raise InputError("give features or modalities (one matrix per modality), not both")
        matrices = (
            {"features": features}
            if features is not None
            else {f"modalities.{name}": m for name, m in (modalities or {}).items()}
        )
        parts = self._rows(ids, matrices, labels)
        dims = self.get_dataset(dataset_id).get("dims") or {}
        for name, array in parts.arrays.items():
            modality = name.removeprefix("modalities.") if "." in name else None
            expected = dims.get(modality) if modality else next(iter(dims.values()), None)
            if expected is not None and array.shape[1] != expected:
                raise InputError(
                    f"{name}: {array.shape[1]} columns, but dataset {dataset_id} holds {expected}"
                )
        path = f"/v1/datasets/{dataset_id}/items"
        return self._upload(path, parts, batch_size, resume, progress, f"/v1/datasets/{dataset_id}")

    def upload_queries(
        self,
        dataset_id: str,
        ids: Sequence[str] | np.ndarray,
        features: np.ndarray,
        *,
        old_vectors: np.ndarray | None = None,
        relevant_ids: Sequence[Sequence[str]] | None = None,
        batch_size: int | None = None,
        resume: bool = True,
        progress: Progress | None = None,
    ) -> dict[str, Any]:
        """Logged queries for a dataset (``POST /v1/datasets/{id}/queries``): the new backbone's
        ``features`` per query, and the old model's ``old_vectors`` of the same queries and/or
        the gallery ids ``relevant_ids`` each query is about."""
        if old_vectors is None and relevant_ids is None:
            raise InputError("queries need old_vectors, relevant_ids, or both")
        matrices = {"features": features}
        if old_vectors is not None:
            matrices["old_vectors"] = old_vectors
        parts = self._rows(ids, matrices, None, label_field=None)
        if relevant_ids is not None:
            relevant = [[str(i) for i in row] for row in relevant_ids]
            check_rows(len(parts), "relevant_ids", relevant)
            parts = RowParts(parts.arrays, {"relevant_ids": relevant})
        path = f"/v1/datasets/{dataset_id}/queries"
        return self._upload(path, parts, batch_size, resume, progress, None)

    # -- upgrades -------------------------------------------------------------------------------
    def methods(self) -> dict[str, Any]:
        return self._json("GET", "/v1/upgrades/methods")

    def create_upgrade(
        self,
        dataset_id: str,
        method: str | None = None,
        *,
        params: dict[str, Any] | None = None,
        objective: str | None = None,
        gallery_id: str | None = None,
        base_model_id: str | None = None,
        seed: int | None = None,
        eval_fraction: float | None = None,
        idempotency_key: str | None = None,
        old_model_available: bool = True,
    ) -> dict[str, Any]:
        """Queue an upgrade job; returns the job (``status`` "queued"). Without ``method`` the
        server picks (``auto``: several candidates, chosen on validation).
        ``old_model_available=False``: the old model can no longer embed queries (no stay, no
        transition in the verdict)."""
        body = drop_none(
            {
                "dataset_id": dataset_id,
                "method": method,
                "params": params,
                "objective": objective,
                "gallery_id": gallery_id,
                "base_model_id": base_model_id,
                "seed": seed,
                "eval_fraction": eval_fraction,
                "old_model_available": None if old_model_available else False,
            }
        )
        return self._create("/v1/upgrades", body, idempotency_key)

    def get_upgrade(self, upgrade_id: str) -> dict[str, Any]:
        return self._json("GET", f"/v1/upgrades/{upgrade_id}")

    def upgrades(self, *, status: str | None = None) -> list[dict[str, Any]]:
        """Every upgrade job of this tenant (every page, in the server's order); ``status``: only
        those (queued, running, succeeded, failed or cancelled), filtered here."""
        jobs = self._pages("/v1/upgrades")
        return [job for job in jobs if status is None or job["status"] == status]

    def cancel_upgrade(self, upgrade_id: str) -> dict[str, Any]:
        return self._json("POST", f"/v1/upgrades/{upgrade_id}/cancel", retry=True)

    def wait_upgrade(
        self,
        upgrade_id: str,
        *,
        poll_s: float = 1.0,
        timeout_s: float | None = None,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Poll until the job succeeds, fails or is cancelled; returns the final job (check its
        ``status``). ``on_progress(job)`` is called on every poll. ``TimeoutError`` after
        ``timeout_s``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            job = self.get_upgrade(upgrade_id)
            if on_progress is not None:
                on_progress(job)
            if job["status"] in TERMINAL:
                return job
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(
                    f"upgrade {upgrade_id} still {job['status']} after {timeout_s} s"
                )
            time.sleep(poll_s)

    def reembed(
        self,
        gallery_id: str,
        model_id: str,
        *,
        fraction: float | None = None,
        order: str | None = None,
        batch_size: int | None = None,
        items_per_minute: int | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """Queue a re-embed job: the server sends the gallery's stored texts through the
        model's embedder and stores them, up to ``fraction`` of the gallery (default all), in
        the plan's order. Returns the job; follow it with ``wait_upgrade`` (jobs of every kind
        are read and cancelled as upgrades are)."""
        body = drop_none(
            {
                "model_id": model_id,
                "fraction": fraction,
                "order": order,
                "batch_size": batch_size,
                "items_per_minute": items_per_minute,
            }
        )
        return self._create(f"/v1/galleries/{gallery_id}/reembed", body, idempotency_key)

    def report_html(self, upgrade_id: str, path: str | Path | None = None) -> bytes | Path:
        """The upgrade's self-contained HTML report: bytes, or written to ``path``."""
        return self._download(f"/v1/upgrades/{upgrade_id}/report.html", None, path)

    # -- models ---------------------------------------------------------------------------------
    def create_embedder(
        self,
        name: str,
        url: str,
        model: str,
        dimension: int,
        *,
        api_key_env: str | None = None,
        query_prefix: str | None = None,
        document_prefix: str | None = None,
        max_batch: int | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """Register the new backbone's embedding endpoint (OpenAI-compatible embeddings
        protocol; the URL must match the server's NOBACKFILL_EMBEDDER_ALLOWED_URLS)."""
        body = drop_none(
            {
                "name": name,
                "url": url,
                "model": model,
                "dimension": dimension,
                "api_key_env": api_key_env,
                "query_prefix": query_prefix,
                "document_prefix": document_prefix,
                "max_batch": max_batch,
            }
        )
        return self._create("/v1/embedders", body, idempotency_key)

    def set_model_embedder(self, model_id: str, embedder_id: str | None) -> dict[str, Any]:
        """Give the model its embedder (None: clear it); two-stage search and re-embed jobs
        embed texts with it."""
        return self._json("PATCH", f"/v1/models/{model_id}", json={"embedder_id": embedder_id})

    def get_model(self, model_id: str) -> dict[str, Any]:
        return self._json("GET", f"/v1/models/{model_id}")

    def models(self) -> list[dict[str, Any]]:
        return list(self._pages("/v1/models"))

    def export_model(
        self, model_id: str, format: str = "onnx", path: str | Path | None = None
    ) -> bytes | Path:
        """The exported model (a zip: the ONNX graph and ``manifest.json``): bytes, or written to
        ``path``."""
        return self._download(f"/v1/models/{model_id}/export", {"format": format}, path)

    # -- search ---------------------------------------------------------------------------------
    def search(
        self,
        gallery_id: str,
        queries: np.ndarray | Sequence[Sequence[float]],
        k: int = 10,
        *,
        model_id: str | None = None,
        modality: str | None = None,
        old_queries: np.ndarray | Sequence[Sequence[float]] | None = None,
        rerank_depth: int | None = None,
        rerank: bool = False,
    ) -> SearchResults:
        """The ``k`` nearest gallery items of each query row (old-space vectors, or with
        ``model_id`` that model's input features), sent as ``.npy`` bodies in batches.

        ``old_queries`` with ``model_id``: a transition search — the old model's vectors of the
        same queries score the items not yet re-embedded for the model (sent as multipart).
        ``rerank`` (or a ``rerank_depth``) with ``model_id``: a two-stage search — candidates
        from the old index (by ``old_queries`` when given), ranked by the new model; each
        batch's report is in ``SearchResults.reranks``."""
        rows: list[list[dict[str, Any]]] = []
        reranks: list[dict[str, Any]] = []
        warnings: list[str] = []
        batches = self._search_batches(
            gallery_id, queries, k, model_id, modality, old_queries, rerank_depth, rerank, {}
        )
        for response in batches:
            answer = response.json()
            rows += answer["results"]
            if "rerank" in answer:
                reranks.append(answer["rerank"])
            if answer.get("warning") and answer["warning"] not in warnings:
                warnings.append(answer["warning"])
        found = SearchResults.from_rows(rows, k)
        found.reranks = reranks
        found.warnings = warnings
        return found

    def search_npz(
        self,
        gallery_id: str,
        queries: np.ndarray | Sequence[Sequence[float]],
        k: int = 10,
        *,
        model_id: str | None = None,
        modality: str | None = None,
        old_queries: np.ndarray | Sequence[Sequence[float]] | None = None,
    ) -> dict[str, np.ndarray]:
        """The same search answered as ``.npz`` archives (``Accept: application/x-npz``), for
        answers past the server's JSON limit on queries × k: the archives' arrays, batches
        concatenated — ``ids``, ``distances``, ``scores``, ``labels``, ``spaces`` (queries × k,
        "" and NaN where a query has fewer hits) and ``counts`` (hits per query). Not for
        two-stage searches (the server answers 406)."""
        batches = self._search_batches(
            gallery_id,
            queries,
            k,
            model_id,
            modality,
            old_queries,
            None,
            False,
            {"Accept": NPZ_MEDIA_TYPE},
        )
        parts: list[dict[str, np.ndarray]] = []
        for response in batches:
            with np.load(io.BytesIO(response.content), allow_pickle=False) as archive:
                parts.append({name: archive[name] for name in archive.files})
        return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}

    def _search_batches(
        self,
        gallery_id: str,
        queries: np.ndarray | Sequence[Sequence[float]],
        k: int,
        model_id: str | None,
        modality: str | None,
        old_queries: np.ndarray | Sequence[Sequence[float]] | None,
        rerank_depth: int | None,
        rerank: bool,
        headers: dict[str, str],
    ) -> Iterator[httpx.Response]:
        """One search's answers, a batch of query rows each (a 413 naming a lower limit lowers
        the batch and sends it again)."""
        matrix = float_matrix(queries, "queries")
        old = None if old_queries is None else float_matrix(old_queries, "old_queries")
        if old is not None and (model_id is None or len(old) != len(matrix)):
            raise ValueError("old_queries: give model_id, and one row per query row")
        rerank = rerank or rerank_depth is not None
        if rerank and model_id is None:
            raise ValueError("rerank: a two-stage search needs model_id")
        parts = RowParts({"queries": matrix} | ({} if old is None else {"old": old}))
        params = drop_none({"k": k, "model_id": model_id, "modality": modality})
        if rerank:
            params["rerank"] = drop_none({"depth": rerank_depth})
        start = 0
        while start < len(matrix):
            batch = self.limits.rows_for(parts)
            stop = min(len(matrix), start + batch)
            if old is None and not rerank:
                body: dict[str, Any] = {
                    "params": params,
                    "content": npy_bytes(matrix[start:stop]),
                    "headers": {"Content-Type": NPY_MEDIA_TYPE} | headers,
                }
            else:
                files = (
                    {
                        "features": ("features.npy", npy_bytes(matrix[start:stop]), NPY_MEDIA_TYPE),
                    }
                    | (
                        {}
                        if old is None
                        else {
                            "old_vectors": ("old.npy", npy_bytes(old[start:stop]), NPY_MEDIA_TYPE)
                        }
                    )
                    | {
                        name: (None, json.dumps(value), "application/json")
                        for name, value in params.items()
                    }
                )
                body = {"files": files, "headers": headers}
            try:
                response = self.request(
                    "POST", f"/v1/galleries/{gallery_id}/search", retry=True, **body
                )
            except ApiError as exc:
                if exc.status == 413 and self.limits.lower_from(exc.detail, stop - start, parts):
                    continue
                raise
            yield response
            start = stop

    # -- keys (an admin key) --------------------------------------------------------------------
    def create_key(self, name: str | None = None, *, admin: bool = False) -> dict[str, Any]:
        """A new API key of this tenant; ``["key"]`` is the key itself, in this answer only.
        Never retried: the server keeps no copy of the key to replay, so a retry after a lost
        answer would make a second key (the first would show in ``keys()``, unused)."""
        body = drop_none({"name": name, "admin": admin or None})
        return self._json("POST", "/v1/keys", json=body, retry=False)

    def keys(self, *, include_revoked: bool = False) -> list[dict[str, Any]]:
        """This tenant's keys (prefixes and names, never the keys), oldest first."""
        params = {"include_revoked": "true"} if include_revoked else None
        return list(self._pages("/v1/keys", params))

    def revoke_key(self, key_id: str) -> None:
        """Revoke a key: its next request answers 401. Safe to repeat (a revoked key stays so);
        the tenant's last active admin key is refused with a 409."""
        self.request("DELETE", f"/v1/keys/{key_id}", retry=True)
