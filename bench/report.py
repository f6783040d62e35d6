"""Write one benchmark's section of BENCHMARKS.md, leaving every other section as it is."""

from __future__ import annotations

from pathlib import Path

from bench.wordnet import REPO_ROOT

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
