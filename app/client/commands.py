"""The client commands of ``nobackfill`` (parsed in ``app.cli``): thin wrappers over ``Client``
that read ``.npy`` files, draw progress on stderr and print results (``--json``: on stdout).

The upgrades' commands are here, with ``HANDLERS`` (every command) and ``run``; the others are
kept by resource beside it (``gallery_commands``, ``search_commands``, ``key_commands``,
``migration_commands``), and what they share is in ``command_io``."""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import httpx

from app.client.client import Client
from app.client.command_io import (
    CommandError,
    emit,
    load_json_option,
    load_npy,
    row_progress,
    stderr_console,
    upload_summary,
)
from app.client.errors import ApiError, UploadInterrupted
from app.client.gallery_commands import (
    access_upload,
    dataset_create,
    dataset_get,
    dataset_list,
    dataset_queries,
    dataset_upload,
    describe_gallery,
    gallery_create,
    gallery_get,
    gallery_list,
    gallery_upload,
    model_list,
)
from app.client.key_commands import key_create, key_list, key_revoke
from app.client.search_commands import export, report, search
from app.client.transport import NoServerError
from app.client.uploads import InputError

# Re-exported: ``migration_commands`` and the tests import these from here.
__all__ = ["CommandError", "describe_gallery", "emit", "load_npy", "row_progress", "upload_summary"]

EXIT_FAILED = 1
EXIT_INTERRUPTED = 130


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
