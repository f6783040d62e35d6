"""The client's transport: where the server is, its key, retries, paging, batched resumable
uploads and streamed downloads (``Transport``); ``app.client.client.Client`` adds the resources."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import numpy as np

from app.client.errors import ApiError, UploadInterrupted
from app.client.uploads import (
    BatchLimits,
    Checkpoint,
    RowParts,
    check_rows,
    check_unique,
    default_checkpoint_dir,
    float_matrix,
    string_array,
)

# Where `make serve` listens unless NOBACKFILL_PORT says otherwise: named in the message of a
# client that finds no server, never tried silently (another service may hold that port).
SERVE_DEFAULT_URL = "http://127.0.0.1:8000"
# Answers that a retry of the same request may well not get (a proxy or a restarting server).
RETRY_STATUSES = (502, 503, 504)
LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")

Progress = Callable[[int, int], None]


class NoServerError(ValueError):
    """No URL given, in the environment or recorded by a local ``nobackfill serve``: the client
    does not guess one (a default port may be another service's, and would get the key)."""


def _local_dir() -> Path:
    return Path(os.environ.get("NOBACKFILL_DATA_DIR", "data"))


def _local_url() -> str | None:
    """The URL ``nobackfill serve`` recorded in its data directory (a server on this machine)."""
    try:
        return (_local_dir() / "server_url").read_text().strip() or None
    except OSError:
        return None


def _local_key(url: str) -> str | None:
    """The key ``nobackfill serve`` stores in its data directory, for a server on this machine
    only (a local key is never sent elsewhere)."""
    if urlsplit(url).hostname not in LOOPBACK:
        return None
    path = _local_dir() / "api_key"
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def drop_none(values: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


class Transport:
    """The connection to a server: its URL and key, retries of requests safe to repeat,
    paging, batched resumable uploads and streamed downloads (``Client`` documents the
    arguments and adds the resources)."""

    def __init__(
        self,
        url: str | None = None,
        key: str | None = None,
        *,
        timeout: float = 300.0,
        retries: int = 3,
        retry_backoff_s: float = 0.5,
        batch_rows: int = 10_000,
        batch_bytes: int = 32 * 1024 * 1024,
        checkpoint_dir: str | Path | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        found = url or os.environ.get("NOBACKFILL_URL") or _local_url()
        if not found:
            raise NoServerError(
                "no server named: give --url or set NOBACKFILL_URL (make serve listens on "
                f"{SERVE_DEFAULT_URL} unless NOBACKFILL_PORT says otherwise), or run from the "
                "folder make serve ran in, or set NOBACKFILL_DATA_DIR to its data folder (it "
                f"records its URL in server_url there; none in {_local_dir().resolve()})"
            )
        self.url = found.rstrip("/")
        self.key = key or os.environ.get("NOBACKFILL_KEY") or _local_key(self.url)
        self.retries = retries
        self.retry_backoff_s = retry_backoff_s
        self.limits = BatchLimits(rows=batch_rows, bytes=batch_bytes)
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else default_checkpoint_dir()
        headers = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        self.http = httpx.Client(
            base_url=self.url, headers=headers, timeout=timeout, transport=transport
        )

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transport ------------------------------------------------------------------------------
    def request(
        self, method: str, path: str, *, retry: bool | None = None, **kwargs: Any
    ) -> httpx.Response:
        """One API call; raises ``ApiError`` for a 4xx/5xx. ``retry`` defaults to True for GET."""
        retry = method == "GET" if retry is None else retry
        attempts = 1 + (self.retries if retry else 0)
        for attempt in range(attempts):
            last = attempt == attempts - 1
            try:
                response = self.http.request(method, path, **kwargs)
            except httpx.TransportError:
                if last:
                    raise
            else:
                if response.status_code < 400:
                    return response
                if response.status_code not in RETRY_STATUSES or last:
                    raise ApiError.from_response(response)
            time.sleep(self.retry_backoff_s * 2**attempt)
        raise AssertionError("unreachable")

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self.request(method, path, **kwargs).json()

    def _create(self, path: str, body: dict[str, Any], idempotency_key: str | None) -> Any:
        # A key per call makes the retry of a create that the server did commit replay it.
        headers = {"Idempotency-Key": idempotency_key or f"client-{uuid.uuid4()}"}
        return self._json("POST", path, json=body, headers=headers, retry=True)

    def _pages(
        self, path: str, params: Mapping[str, Any] | None = None
    ) -> Iterator[dict[str, Any]]:
        token = None
        while True:
            query = drop_none({**(params or {}), "page_token": token})
            page = self._json("GET", path, params=query)
            yield from page["items"]
            token = page.get("next_page_token")
            if not token:
                return

    # -- rows, downloads, uploads ------------------------------------------------------------------------------
    def _rows(
        self,
        ids: Sequence[str] | np.ndarray,
        matrices: Mapping[str, Any],
        labels: Sequence[str] | np.ndarray | None,
        *,
        label_field: str | None = "labels",
    ) -> RowParts:
        id_array = string_array(ids, "ids")
        check_unique(id_array)
        arrays = {"ids": id_array}
        for name, values in matrices.items():
            arrays[name] = float_matrix(values, name)
            check_rows(len(id_array), name, arrays[name])
        if labels is not None and label_field is not None:
            arrays[label_field] = string_array(labels, label_field)
            check_rows(len(id_array), label_field, arrays[label_field])
        return RowParts(arrays)

    def _download(
        self, path: str, params: dict[str, Any] | None, target: str | Path | None
    ) -> bytes | Path:
        """The response body, or streamed into ``target`` (a temporary file renamed at the end,
        so a cut-off download never leaves a partial file under the name asked for)."""
        if target is None:
            return self.request("GET", path, params=params).content
        target = Path(target)
        partial = target.with_name(f".{target.name}.partial")
        with self.http.stream("GET", path, params=params) as response:
            if response.status_code >= 400:
                response.read()
                raise ApiError.from_response(response)
            try:
                with partial.open("wb") as handle:
                    for chunk in response.iter_bytes(1 << 20):
                        handle.write(chunk)
                partial.replace(target)
            finally:
                partial.unlink(missing_ok=True)
        return target

    def _upload(
        self,
        path: str,
        parts: RowParts,
        batch_size: int | None,
        resume: bool,
        progress: Progress | None,
        count_from: str | None,
        fixed: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """``fixed``: JSON parts every batch carries (e.g. ``model_id``), part of the checkpoint's
        fingerprint too."""
        total = len(parts)
        fixed_parts = {name: json.dumps(value) for name, value in (fixed or {}).items()}
        target = self.url + path + (json.dumps(fixed_parts, sort_keys=True) if fixed else "")
        checkpoint = Checkpoint.open(
            self.checkpoint_dir, parts.fingerprint(target), self.url + path, total
        )
        start = checkpoint.rows_done if resume else 0
        resumed_from, batches, last = start, 0, None
        # Ids the service acknowledged without writing (an attached collection's points deleted
        # since the plan listed them): reported, and not counted as upserted.
        skipped: list[str] = []
        if progress is not None:
            progress(start, total)
        while start < total:
            rows = self.limits.rows_for(parts, batch_size)
            stop = min(total, start + rows)
            files, data = parts.multipart(start, stop)
            try:
                response = self.request(
                    "POST", path, files=files, data=data | fixed_parts, retry=True
                )
            except ApiError as exc:
                if exc.status == 413 and self.limits.lower_from(exc.detail, stop - start, parts):
                    continue
                if start:
                    exc.add_note(
                        f"rows 0–{start} of {total} were stored before this batch; "
                        "the batch and the rows after it were not"
                    )
                raise
            except httpx.TransportError as exc:
                raise UploadInterrupted(start, total, exc) from exc
            last = response.json()
            skipped.extend(last.get("skipped") or [])
            start = stop
            batches += 1
            checkpoint.advance(start)
            if progress is not None:
                progress(start, total)
        checkpoint.finish()
        if last is None and count_from is not None:
            # Every row was acknowledged before this run (its last batch, then an interruption).
            last = {"count": self._json("GET", count_from)["count"]}
        result = {
            "upserted": total - resumed_from - len(skipped),
            "count": None if last is None else last.get("count"),
            "batches": batches,
            "resumed_from": resumed_from,
        }
        if skipped:
            result["skipped"] = skipped
        return result
