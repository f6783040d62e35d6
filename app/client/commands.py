"""The client commands of ``nobackfill`` (parsed in ``app.cli``): thin wrappers over ``Client``
that read ``.npy`` files, draw progress on stderr and print results (``--json``: on stdout)."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from app.client.client import Client
from app.client.errors import ApiError, UploadInterrupted
from app.client.results import SearchResults
from app.client.transport import NoServerError
from app.client.uploads import InputError

EXIT_FAILED = 1
EXIT_INTERRUPTED = 130


class CommandError(Exception):
    """A failure the command explains in one message (bad file, bad option)."""


def load_npy(path: str | None, option: str) -> np.ndarray | None:
    """A ``.npy`` file, memory-mapped (never unpickled); None when the option was not given."""
    if path is None:
        return None
    try:
        with open(path, "rb") as fh:
            magic = fh.read(6)
    except FileNotFoundError as exc:
        raise CommandError(f"{option} {path}: no such file") from exc
    except OSError as exc:
        raise CommandError(f"{option} {path}: {exc.strerror or exc}") from exc
    if magic != b"\x93NUMPY":
        # np.load reads any other file as a pickle, and then says only that pickles are
        # refused: name what the file is not (a .csv gave "pickled (object) data…").
        raise CommandError(
            f"{option} {path}: not a .npy file (save the array with numpy.save; CSV, text "
            "and pickle files are not read)"
        )
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError as exc:
        raise CommandError(f"{option} {path}: no such file") from exc
    except (OSError, ValueError) as exc:
        raise CommandError(f"{option} {path}: not a readable .npy array ({exc})") from exc


def load_json_option(text: str | None, option: str) -> Any:
    """JSON given inline or, as ``@file.json``, in a file."""
    if text is None:
        return None
    source = text
    if text.startswith("@"):
        try:
            source = Path(text[1:]).read_text()
        except OSError as exc:
            raise CommandError(f"{option} {text[1:]}: {exc.strerror or exc}") from exc
    try:
        return json.loads(source)
    except ValueError as exc:
        raise CommandError(f"{option}: not valid JSON ({exc})") from exc


def load_relevant(path: str | None, query_ids: np.ndarray) -> list[list[str]] | None:
    """``--relevant``: a list of id lists in query order, or ``{query id: [ids]}``."""
    if path is None:
        return None
    try:
        value = json.loads(Path(path).read_text())
    except FileNotFoundError as exc:
        raise CommandError(f"--relevant {path}: no such file") from exc
    except (OSError, ValueError) as exc:
        raise CommandError(f"--relevant {path}: not readable JSON ({exc})") from exc
    if isinstance(value, dict):
        missing = [q for q in query_ids.tolist() if q not in value]
        if missing:
            raise CommandError(f"--relevant {path}: no entry for queries {missing[:5]}")
        value = [value[q] for q in query_ids.tolist()]
    if not isinstance(value, list) or not all(
        isinstance(row, list) and all(isinstance(i, str) for i in row) for row in value
    ):
        raise CommandError(
            f"--relevant {path}: expected a list of lists of gallery ids (strings), one per query, "
            "or an object {query id: [gallery ids]}"
        )
    return value


def emit(args: argparse.Namespace, result: Any, text: str) -> None:
    """``result`` as JSON with ``--json``; ``text`` for people otherwise."""
    if getattr(args, "json", False):
        sys.stdout.write(json.dumps(result, indent=2, default=str) + "\n")
    else:
        sys.stdout.write(text.rstrip("\n") + "\n")


def stderr_console() -> Any:
    from rich.console import Console

    return Console(stderr=True)


@contextmanager
def row_progress(label: str) -> Iterator[Callable[[int, int], None]]:
    """A progress bar of acknowledged rows on stderr, drawn from the first report on: input
    refused before anything is sent shows only its error."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    bar = Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        "rows",
        TimeRemainingColumn(),
        console=stderr_console(),
    )
    task = bar.add_task(label, total=None)
    started = False

    def update(done: int, total: int) -> None:
        nonlocal started
        if not started:
            bar.start()
            started = True
        bar.update(task, completed=done, total=total)

    try:
        yield update
    finally:
        if started:
            bar.stop()


def upload_summary(result: dict[str, Any], what: str) -> str:
    text = f"{result['upserted']} {what} upserted in {result['batches']} batches"
    if result["resumed_from"]:
        text += f" (resumed: the first {result['resumed_from']} were already acknowledged)"
    if result.get("count") is not None:
        text += f"; it now holds {result['count']}"
    if skipped := result.get("skipped"):
        shown = ", ".join(skipped[:10]) + (", …" if len(skipped) > 10 else "")
        text += f"; {len(skipped)} skipped (no longer in the collection, nothing written): {shown}"
    return text


# -- galleries and datasets -----------------------------------------------------------------------
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


def gallery_upload(client: Client, args: argparse.Namespace) -> int:
    ids = load_npy(args.ids, "--ids")
    if args.features is not None or args.model is not None:
        if args.features is None or args.model is None or args.labels is not None:
            raise CommandError("re-embedded items: give --features and --model (no --labels)")
        features = load_npy(args.features, "--features")
        with row_progress(f"gallery {args.gallery} (re-embedded)") as progress:
            result = client.upload_reembedded(
                args.gallery,
                ids,
                features,
                args.model,
                batch_size=args.batch_size,
                resume=args.resume,
                progress=progress,
            )
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


# -- upgrades -------------------------------------------------------------------------------------
def upgrade_create(client: Client, args: argparse.Namespace) -> int:
    params = load_json_option(args.params, "--params")
    if params is not None and not isinstance(params, dict):
        raise CommandError('--params: expected a JSON object, e.g. {"epochs": 20}')
    job = client.create_upgrade(
        args.dataset,
        args.method,
        params=params,
        objective=args.objective,
        gallery_id=args.gallery,
        base_model_id=args.base_model,
        seed=args.seed,
        eval_fraction=args.eval_fraction,
        idempotency_key=args.idempotency_key,
        old_model_available=not args.old_model_gone,
    )
    if not args.wait:
        emit(args, job, f"{job['id']}\tupgrade {job['method']}: {job['status']}")
        return 0
    return follow(client, args, job["id"])


def upgrade_status(client: Client, args: argparse.Namespace) -> int:
    if args.wait:
        return follow(client, args, args.upgrade)
    job = client.get_upgrade(args.upgrade)
    emit(args, job, describe_job(job))
    return 0


def upgrade_cancel(client: Client, args: argparse.Namespace) -> int:
    job = client.cancel_upgrade(args.upgrade)
    emit(args, job, describe_job(job))
    return 0


# Steps of the whole-job bar (``job_fraction`` × this).
BAR_STEPS = 1000


def progress_text(progress: dict[str, Any]) -> str:
    """The job's ``progress`` in words: phase, candidate (with its trial and stage), epoch/epochs,
    loss, the whole job's share done, ETA (each when the server reports it)."""
    parts = [str(progress[k]) for k in ("phase", "candidate") if progress.get(k)]
    if progress.get("candidate") and isinstance(progress.get("trial"), int):
        trial = f"trial {progress['trial']}"
        if isinstance(progress.get("trials"), int):
            trial += f"/{progress['trials']}"
        if isinstance(progress.get("stage"), str):
            trial += f" ({progress['stage']})"
        parts.append(trial)
    if isinstance(progress.get("total"), int) and "done" in progress:
        parts.append(f"{progress['done']}/{progress['total']} items")
    if progress.get("epochs"):
        parts.append(f"epoch {progress.get('epoch', 0)}/{progress['epochs']}")
    if isinstance(progress.get("loss"), int | float):
        parts.append(f"loss {progress['loss']:.4g}")
    share = progress.get("job_fraction")
    if isinstance(share, int | float) and not isinstance(share, bool):
        parts.append(f"{share:.0%} of the job")
    if isinstance(progress.get("eta_s"), int | float):
        parts.append(f"ETA {progress['eta_s']:.0f} s")
    return ", ".join(parts)


def follow(
    client: Client, args: argparse.Namespace, upgrade_id: str, label: str = "upgrade"
) -> int:
    """Wait for the job with a progress bar on stderr — or, when stderr is not a terminal (a
    log, CI, ``2>file``), a line each time the progress changes (at most one per
    ``PROGRESS_LINE_S``: a bar there printed nothing until the end); exit 1 unless it
    succeeded."""
    console = stderr_console()
    if console.is_terminal:
        job = _follow_with_bar(client, args, upgrade_id, label, console)
    else:
        job = _follow_with_lines(client, args, upgrade_id, label)
    emit(args, job, describe_job(job))
    if job["status"] != "succeeded":
        reason = job.get("error") or "no reason given"
        sys.stderr.write(f"error: {label} {upgrade_id} {job['status']}: {reason}\n")
        return EXIT_FAILED
    return 0


# Seconds between two progress lines when stderr is not a terminal.
PROGRESS_LINE_S = 10.0


def _follow_with_lines(
    client: Client, args: argparse.Namespace, upgrade_id: str, label: str
) -> dict[str, Any]:
    last: dict[str, Any] = {"text": None, "at": -math.inf}

    def update(job: dict[str, Any]) -> None:
        detail = progress_text(job.get("progress") or {})
        text = f"{job['status']}, {detail}" if detail else job["status"]
        now = time.monotonic()
        if text != last["text"] and now - last["at"] >= PROGRESS_LINE_S:
            sys.stderr.write(f"{label} {upgrade_id}: {text}\n")
            sys.stderr.flush()
            last.update(text=text, at=now)

    return client.wait_upgrade(
        upgrade_id, poll_s=args.poll, timeout_s=args.timeout, on_progress=update
    )


def _follow_with_bar(
    client: Client, args: argparse.Namespace, upgrade_id: str, label: str, console: Any
) -> dict[str, Any]:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        console=console,
    ) as bar:
        task = bar.add_task(f"{label} {upgrade_id}", total=None, info="queued")

        def update(job: dict[str, Any]) -> None:
            progress = job.get("progress") or {}
            info = progress_text(progress) or job["status"]
            share = progress.get("job_fraction")
            if isinstance(progress.get("total"), int) and "done" in progress:  # items
                bar.update(task, total=progress["total"] or None, completed=progress["done"])
            elif isinstance(share, int | float) and not isinstance(share, bool):
                # The whole job's share done (every candidate and trial of an auto upgrade):
                # one bar that never goes back; the candidate and its trial are in ``info``.
                bar.update(task, total=BAR_STEPS, completed=round(BAR_STEPS * min(share, 1.0)))
            else:  # a single training's epochs (jobs that report no share of the whole)
                bar.update(task, total=progress.get("epochs") or None)
                bar.update(task, completed=progress.get("epoch", 0))
            bar.update(task, info=info)

        job = client.wait_upgrade(
            upgrade_id, poll_s=args.poll, timeout_s=args.timeout, on_progress=update
        )
        if job["status"] == "succeeded":
            bar.update(task, total=1, completed=1, info="succeeded")
    return job


def with_ids(step: str, job: dict[str, Any]) -> str:
    """The verdict's next step with this job's ids for GALLERY, MODEL and DATASET."""
    for placeholder, key in (
        ("GALLERY", "gallery_id"),
        ("MODEL", "model_id"),
        ("DATASET", "dataset_id"),
    ):
        if job.get(key):
            step = step.replace(placeholder, str(job[key]))
    return step


def describe_job(job: dict[str, Any]) -> str:
    kind = "re-embed job" if job["method"] == "reembed" else f"upgrade {job['method']}"
    lines = [f"{job['id']}\t{kind}: {job['status']}"]
    if job.get("progress") and job["status"] in ("queued", "running"):
        lines.append(f"  progress: {progress_text(job['progress'])}")
    if job.get("model_id"):
        lines.append(f"  model: {job['model_id']}")
    if job.get("error"):
        lines.append(f"  error: {job['error']}")
    moved = (job.get("report") or {}).get("reembed")
    if moved:
        lines.append(
            f"  embedded {moved['embedded']} items ({moved['order']} order), skipped "
            f"{moved['skipped']}; re-embedded now {moved['reembedded']}/{moved['total']} "
            f"({moved['fraction_reembedded']:.0%})"
        )
        if moved.get("order_note"):
            lines.append(f"  note: {moved['order_note']}")
    verdict = (job.get("report") or {}).get("recommendation")
    if verdict:
        lines.append(f"  verdict: {verdict['action']} — {verdict['why']}")
        if verdict.get("next_step"):
            lines.append(f"  next step: {with_ids(verdict['next_step'], job)}")
        if verdict.get("next_step_http"):
            lines.append(f"  over HTTP: {with_ids(verdict['next_step_http'], job)}")
    metrics = (job.get("report") or {}).get("metrics") or {}
    lines += [f"  {name}: {numbers}" for name, numbers in metric_lines(metrics)]
    return "\n".join(lines)


def metric_lines(metrics: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, str]]:
    """(name, "metric value, …") for every group of numbers in the report's nested metrics."""
    for name, values in metrics.items():
        if not isinstance(values, dict):
            continue
        numbers = ", ".join(f"{k} {v:.3f}" for k, v in values.items() if isinstance(v, int | float))
        if numbers:
            yield f"{prefix}{name}", numbers
        yield from metric_lines(values, f"{prefix}{name} ")


def methods(client: Client, args: argparse.Namespace) -> int:
    """Each method once, under its kind, with what it does (the answer's name-only lists per
    kind repeat the described entries: printing both listed every method twice)."""
    catalogue = client.methods()
    by_kind: dict[str, list[str]] = {}
    for entry in catalogue.get("methods", []):
        about = entry.get("description") or ""
        labels = " (needs labels)" if entry.get("needs_labels") else ""
        by_kind.setdefault(entry.get("kind", "other"), []).append(
            f"  {entry.get('name', '?')}{labels}" + (f"  {about}" if about else "")
        )
    lines = [line for kind, rows in by_kind.items() for line in (f"{kind}:", *rows)]
    emit(args, catalogue, "\n".join(lines))
    return 0


# -- search and downloads -------------------------------------------------------------------------
def search(client: Client, args: argparse.Namespace) -> int:
    queries = load_npy(args.queries, "--queries")
    assert queries is not None
    if queries.ndim == 1:
        queries = queries[None, :]
    output = Path(args.output) if args.output else None
    if output is not None and output.suffix not in (".json", ".npz"):
        raise CommandError(f"-o {output}: write .json or .npz")
    old_queries = load_npy(args.old_queries, "--old-queries")
    if old_queries is not None:
        if args.model is None:
            raise CommandError("--old-queries: a transition search needs --model too")
        if old_queries.ndim == 1:
            old_queries = old_queries[None, :]
        if len(old_queries) != len(queries):
            raise CommandError(
                f"--old-queries has {len(old_queries)} rows, --queries {len(queries)}"
            )
    rerank = args.rerank or args.rerank_depth is not None
    if rerank and args.model is None:
        raise CommandError("--rerank: a two-stage search needs --model too")
    if args.rerank_depth is not None and args.rerank_depth < 1:
        raise CommandError("--rerank-depth: at least 1")
    found = client.search(
        args.gallery,
        queries,
        args.k,
        model_id=args.model,
        modality=args.modality,
        old_queries=old_queries,
        rerank_depth=args.rerank_depth,
        rerank=rerank,
    )
    for warning in found.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    for report in found.reranks:
        if report.get("degraded"):
            print(
                f"warning: two-stage search degraded ({report['degraded']}): these results are "
                "the single-stage search",
                file=sys.stderr,
            )
    if output is not None:
        write_results(found, output)
    text = "\n".join(
        f"{i}\t" + "  ".join(f"{hit['id']} ({hit['distance']:.4f})" for hit in row)
        for i, row in enumerate(found.rows)
    )
    emit(args, found.to_dict(), text if output is None else f"wrote {output}")
    return 0


def write_results(found: SearchResults, path: Path) -> None:
    if path.suffix == ".json":
        path.write_text(json.dumps(found.to_dict()))
        return
    arrays = {"ids": found.ids, "distances": found.distances, "labels": found.labels}
    if found.scores is not None:
        arrays["scores"] = found.scores
    np.savez(path, **arrays)


def export(client: Client, args: argparse.Namespace) -> int:
    path = client.export_model(args.model, args.format, args.output)
    sys.stdout.write(f"wrote {path} ({Path(path).stat().st_size} bytes)\n")
    return 0


def report(client: Client, args: argparse.Namespace) -> int:
    path = client.report_html(args.upgrade, args.output)
    sys.stdout.write(f"wrote {path} ({Path(path).stat().st_size} bytes)\n")
    return 0


# -- keys -----------------------------------------------------------------------------------------
def key_create(client: Client, args: argparse.Namespace) -> int:
    created = client.create_key(args.name, admin=args.admin)
    kind = "admin key" if created["admin"] else "key"
    name = f" {created['name']!r}" if created["name"] else ""
    # The key on a line of its own, once: it is shown by no other command, ever.
    text = f"{created['id']}\t{kind}{name} created\nAPI key: {created['key']}\n"
    text += "(shown only now: store it, the server keeps only its digest)"
    emit(args, created, text)
    return 0


def describe_key(key: dict[str, Any]) -> str:
    fields = [key["id"], f"{key['prefix']}…", "admin" if key["admin"] else "-"]
    fields.append(repr(key["name"]) if key["name"] else "-")
    fields.append(f"created {key['created_at']}")
    if key.get("revoked_at"):
        fields.append(f"revoked {key['revoked_at']}")
    return "\t".join(fields)


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


def key_list(client: Client, args: argparse.Namespace) -> int:
    keys = client.keys(include_revoked=args.include_revoked)
    text = "\n".join(describe_key(k) for k in keys) or "no keys"
    emit(args, {"items": keys}, text)
    return 0


def key_revoke(client: Client, args: argparse.Namespace) -> int:
    client.revoke_key(args.key_id)
    emit(args, {"id": args.key_id, "revoked": True}, f"{args.key_id}\trevoked")
    return 0


HANDLERS: dict[str, Callable[[Client, argparse.Namespace], int]] = {
    "gallery_create": gallery_create,
    "gallery_get": gallery_get,
    "gallery_upload": gallery_upload,
    "gallery_list": gallery_list,
    "dataset_list": dataset_list,
    "model_list": model_list,
    "access_upload": access_upload,
    "dataset_create": dataset_create,
    "dataset_get": dataset_get,
    "dataset_upload": dataset_upload,
    "dataset_queries": dataset_queries,
    "upgrade_create": upgrade_create,
    "upgrade_status": upgrade_status,
    "upgrade_cancel": upgrade_cancel,
    "methods": methods,
    "search": search,
    "export": export,
    "report": report,
    "key_create": key_create,
    "key_list": key_list,
    "key_revoke": key_revoke,
}


def fail(message: str) -> int:
    sys.stderr.write(f"error: {message}\n")
    return EXIT_FAILED


def run(
    args: argparse.Namespace,
    handlers: Mapping[str, Callable[[Client, argparse.Namespace], int]] | None = None,
) -> int:
    """Run one client command; every failure is one readable message on stderr and exit 1.
    ``handlers``: commands kept in other modules (``app.client.migration_commands``)."""
    handler = {**HANDLERS, **(handlers or {})}[args.handler]
    try:
        with Client(args.url, args.key) as client:
            try:
                return handler(client, args)
            except ApiError as exc:
                hint = ""
                if exc.status == 401:
                    hint = "\n  (give the API key with --key or NOBACKFILL_KEY)"
                notes = "".join(f"\n  {note}" for note in getattr(exc, "__notes__", []))
                return fail(f"{exc}{notes}{hint}")
            except httpx.TransportError as exc:
                return fail(f"cannot reach {client.url}: {exc}")
    except (CommandError, InputError, UploadInterrupted, NoServerError) as exc:
        return fail(str(exc))
    except TimeoutError as exc:
        return fail(str(exc))
    except OSError as exc:
        # Writing -o FILE (a missing folder, a full disk): the server's side is done.
        return fail(f"{exc.filename or ''}: {exc.strerror or exc}")
    except KeyboardInterrupt:
        sys.stderr.write("interrupted (an upload resumes when run again)\n")
        return EXIT_INTERRUPTED
