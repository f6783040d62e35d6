"""The galleries' and datasets' client commands: create, get, list and upload (vectors,
re-embedded items, access counts, dataset items and queries), and the models' listing."""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from app.client.client import Client
from app.client.command_io import (
    CommandError,
    emit,
    load_npy,
    load_relevant,
    row_progress,
    upload_summary,
)


def gallery_create(client: Client, args: argparse.Namespace) -> int:
    gallery = client.create_gallery(
        args.name,
        dim=args.dim,
        model_name=args.model_name,
        metric=args.metric,
        model_id=args.model_id,
        modality=args.modality,
        index=args.index,
        idempotency_key=args.idempotency_key,
    )
    emit(args, gallery, f"{gallery['id']}\t{describe_gallery(gallery)}")
    return 0


def describe_gallery(gallery: dict[str, Any]) -> str:
    space = (
        f"model {gallery['model_id']}"
        if gallery["kind"] == "model"
        else f"{gallery['model_name']}, {gallery['metric']}"
    )
    text = f"gallery {gallery['name']!r}: dim {gallery['dim']} ({space}), {gallery['count']} items"
    # A migration's progress, per model: how far the re-embedding has got.
    for progress in gallery.get("reembedded") or []:
        text += (
            f"; re-embedded for {progress['model_id']}: {progress['reembedded']}/"
            f"{progress['total']} ({progress['fraction']:.0%})"
        )
        if progress.get("traffic_covered") is not None:
            text += f", {progress['traffic_covered']:.0%} of counted traffic"
        expected = progress.get("expected")
        if expected:
            step = expected["next"]
            later = (
                ""
                if step["value"] is None
                else (f", {step['value']:.3f} at {step['fraction']:.0%}")
            )
            text += (
                f", {expected['search']} search {expected['metric']} now "
                f"{expected['now']:.3f}{later}"
            )
    return text


def gallery_get(client: Client, args: argparse.Namespace) -> int:
    gallery = client.get_gallery(args.gallery)
    emit(args, gallery, f"{gallery['id']}\t{describe_gallery(gallery)}")
    return 0


def upload_reembedded_rows(
    client: Client, args: argparse.Namespace, ids: Any, features: Any
) -> dict[str, Any]:
    """A batched upload of re-embedded items (``gallery upload --model`` and ``backfill
    upload``), with a progress bar; resumable as every upload is."""
    with row_progress(f"gallery {args.gallery} (re-embedded)") as progress:
        return client.upload_reembedded(
            args.gallery,
            ids,
            features,
            args.model,
            batch_size=args.batch_size,
            resume=args.resume,
            progress=progress,
        )


def gallery_upload(client: Client, args: argparse.Namespace) -> int:
    ids = load_npy(args.ids, "--ids")
    if args.features is not None or args.model is not None:
        if args.features is None or args.model is None or args.labels is not None:
            raise CommandError("re-embedded items: give --features and --model (no --labels)")
        features = load_npy(args.features, "--features")
        result = upload_reembedded_rows(client, args, ids, features)
        emit(args, result, upload_summary(result, "re-embedded items"))
        return 0
    vectors = load_npy(args.vectors, "--vectors")
    labels = load_npy(args.labels, "--labels")
    texts = load_npy(args.texts, "--texts")
    with row_progress(f"gallery {args.gallery}") as progress:
        result = client.upload_vectors(
            args.gallery,
            ids,
            vectors,
            labels,
            texts=texts,
            batch_size=args.batch_size,
            resume=args.resume,
            progress=progress,
        )
    emit(args, result, upload_summary(result, "vectors"))
    return 0


def access_upload(client: Client, args: argparse.Namespace) -> int:
    """``access upload``: add counts from the team's logs; never resumed or retried (a batch
    counted twice would double its counts), so a failure says how far it got."""
    ids = load_npy(args.ids, "--ids")
    counts = load_npy(args.counts, "--counts")
    with row_progress(f"gallery {args.gallery} (access counts)") as progress:
        result = client.upload_access(
            args.gallery, ids, counts, batch_size=args.batch_size, progress=progress
        )
    text = (
        f"added {result['added']} accesses over {result['rows']} rows in {result['batches']} "
        f"batches; the gallery counts {result['total']} over {result['counted_items']} items"
    )
    emit(args, result, text)
    return 0


def dataset_create(client: Client, args: argparse.Namespace) -> int:
    dataset = client.create_dataset(
        args.name,
        gallery_id=args.gallery,
        modalities=args.modalities,
        idempotency_key=args.idempotency_key,
    )
    emit(args, dataset, f"{dataset['id']}\t{describe_dataset(dataset)}")
    return 0


def describe_dataset(dataset: dict[str, Any]) -> str:
    gallery = f" for gallery {dataset['gallery_id']}" if dataset.get("gallery_id") else ""
    return f"dataset {dataset['name']!r}{gallery}: {dataset['count']} items"


def dataset_get(client: Client, args: argparse.Namespace) -> int:
    dataset = client.get_dataset(args.dataset)
    emit(args, dataset, f"{dataset['id']}\t{describe_dataset(dataset)}")
    return 0


def dataset_upload(client: Client, args: argparse.Namespace) -> int:
    ids = load_npy(args.ids, "--ids")
    features = load_npy(args.features, "--features")
    labels = load_npy(args.labels, "--labels")
    with row_progress(f"dataset {args.dataset}") as progress:
        result = client.upload_items(
            args.dataset,
            ids,
            features,
            labels,
            batch_size=args.batch_size,
            resume=args.resume,
            progress=progress,
        )
    emit(args, result, upload_summary(result, "items"))
    return 0


def dataset_queries(client: Client, args: argparse.Namespace) -> int:
    ids = load_npy(args.ids, "--ids")
    features = load_npy(args.features, "--features")
    old_vectors = load_npy(args.old_vectors, "--old-vectors")
    if old_vectors is None and args.relevant is None:
        raise CommandError("give --old-vectors, --relevant, or both")
    assert ids is not None and features is not None
    relevant = load_relevant(args.relevant, np.asarray(ids).astype(str))
    with row_progress(f"queries {args.dataset}") as progress:
        result = client.upload_queries(
            args.dataset,
            ids,
            features,
            old_vectors=old_vectors,
            relevant_ids=relevant,
            batch_size=args.batch_size,
            resume=args.resume,
            progress=progress,
        )
    emit(args, result, upload_summary(result, "queries"))
    return 0


# -- listings -------------------------------------------------------------------------------------
def _listing(args: argparse.Namespace, items: list[dict[str, Any]], what: str) -> int:
    """One line per item: its id, name (or method) and what it holds."""
    lines = []
    for item in items:
        name = item.get("name") or item.get("method") or ""
        size = item.get("count")
        lines.append(f"{item['id']}\t{name}" + (f"\t{size}" if size is not None else ""))
    emit(args, {"items": items}, "\n".join(lines) or f"no {what}")
    return 0


def gallery_list(client: Client, args: argparse.Namespace) -> int:
    return _listing(args, client.galleries(), "galleries")


def dataset_list(client: Client, args: argparse.Namespace) -> int:
    return _listing(args, client.datasets(), "datasets")


def model_list(client: Client, args: argparse.Namespace) -> int:
    return _listing(args, client.models(), "models")
