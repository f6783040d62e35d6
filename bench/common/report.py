"""Write one benchmark's section of BENCHMARKS.md, leaving every other section as it is."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common.wordnet import REPO_ROOT

BENCHMARKS = REPO_ROOT / "BENCHMARKS.md"
HEADER = (
    "# Benchmarks\n\n"
    "Every figure here is written by the command named in its section; rerun it to reproduce.\n"
)


def replace_section(name: str, title: str, body: str, path: Path = BENCHMARKS) -> None:
    """Replace the text between ``<!-- name:start -->`` and ``<!-- name:end -->`` (appending the
    section, under ``## title``, when it is not there yet)."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    block = f"{start}\n## {title}\n\n{body.rstrip()}\n{end}"
    text = path.read_text() if path.exists() else HEADER
    if start in text and end in text:
        before, rest = text.split(start, 1)
        _, after = rest.split(end, 1)
        text = before + block + after
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)


def command_line(module: str, argv: Sequence[str] | None) -> str:
    """The command that reproduces a run, its arguments shell-quoted."""
    return f"python -m {module} {shlex.join(argv if argv is not None else sys.argv[1:])}".strip()


def publish(
    result: dict[str, Any], out: Path, markdown: str, section: str | None, title: str
) -> None:
    """Write the results JSON, print the markdown and, unless ``section`` is None, put it in
    BENCHMARKS.md between that section's markers."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(markdown)
    if section is not None:
        replace_section(section, title, markdown)
