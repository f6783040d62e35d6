"""What the client commands share (``app.client.commands`` and the modules beside it): reading
``.npy`` files and JSON options, printing a result (``--json``: on stdout), progress bars on
stderr, and ``CommandError``, a failure told in one message."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np


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
