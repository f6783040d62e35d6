"""Write one benchmark's section of BENCHMARKS.md, leaving every other section as it is; check
that every section is what its renderer makes of its results file and that no figure stands
outside a section (issue 42 item 8).

    python -m bench.common.report --check   # exit 1, with a diff, where a figure was typed
    python -m bench.common.report --write   # every registered section from its results files

The table of sections, results files and renderers is ``bench.common.sections``.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import shlex
import sys
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
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
    text = path.read_text() if path.exists() else HEADER
    if start in text and end in text:
        before, rest = text.split(start, 1)
        _, after = rest.split(end, 1)
        text = before + block(name, title, body) + after
    else:
        text = text.rstrip() + "\n\n" + block(name, title, body) + "\n"
    path.write_text(text)


def block(name: str, title: str, body: str) -> str:
    """A section as it stands in BENCHMARKS.md, markers included: what ``replace_section``
    writes and what ``check`` expects to find."""
    return f"<!-- {name}:start -->\n## {title}\n\n{body.rstrip()}\n<!-- {name}:end -->"


def command_line(module: str, argv: Sequence[str] | None, local: Collection[str] = ()) -> str:
    """The command that reproduces a run, its arguments shell-quoted. ``local`` names options
    whose value means something only on the machine that ran it (where to keep its logs) and
    that change none of its figures: they are left out, value and all (``--opt value`` or
    ``--opt=value``), so that no machine-local path is published."""
    kept: list[str] = []
    args = iter(argv if argv is not None else sys.argv[1:])
    for arg in args:
        if arg in local:
            next(args, None)  # its value
        elif arg.split("=", 1)[0] not in local:
            kept.append(arg)
    return f"python -m {module} {shlex.join(kept)}".strip()


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


# --- The check (issue 42 item 8): every section is its renderer's output, none is typed. ---

_MARKER = re.compile(r"<!-- (\S+):(start|end) -->")


def sections_of(text: str) -> dict[str, str]:
    """Every marked section of ``text``: name → the block from its start marker to its end
    marker inclusive (what ``block`` writes). A start without its end, an end without its start
    or a name used twice raises: the check must never skip a section it cannot delimit."""
    found: dict[str, str] = {}
    open_name, open_at = None, 0
    for m in _MARKER.finditer(text):
        name, edge = m.group(1), m.group(2)
        if edge == "start":
            if open_name is not None:
                raise ValueError(f"section {open_name} has no end marker before {name} starts")
            if name in found:
                raise ValueError(f"section {name} appears twice")
            open_name, open_at = name, m.start()
        else:
            if name != open_name:
                raise ValueError(f"end marker of {name} without its start")
            found[name] = text[open_at : m.end()]
            open_name = None
    if open_name is not None:
        raise ValueError(f"section {open_name} has no end marker")
    return found


@dataclass
class CheckResult:
    """What ``check`` found; ``ok`` when BENCHMARKS.md is exactly its renderers' output."""

    diffs: dict[str, str] = field(default_factory=dict)  # name → unified diff
    errors: dict[str, str] = field(default_factory=dict)  # name → why it could not be compared
    unregistered: list[str] = field(default_factory=list)  # in the file, in no table
    missing: list[str] = field(default_factory=list)  # registered, not in the file
    typed: dict[str, list[str]] = field(default_factory=dict)  # prose-only name → figure lines
    unmarked: list[str] = field(default_factory=list)  # stretches outside every section
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (
            self.diffs
            or self.errors
            or self.unregistered
            or self.missing
            or self.typed
            or self.unmarked
        )

    def report(self) -> str:
        """One line per problem (diffs in full), for the terminal and for CI's log."""
        lines = [f"warning: {w}" for w in self.warnings]
        for name, diff in self.diffs.items():
            lines += [
                f"{name}: differs from its render (python -m bench.common.report --write)",
                diff,
            ]
        lines += [f"{name}: cannot be rendered: {why}" for name, why in self.errors.items()]
        lines += [
            f"{name}: not in bench/common/sections.py (a section must be rendered from a results "
            "file, or be prose without figures in PROSE_ONLY)"
            for name in self.unregistered
        ]
        lines += [f"{name}: registered but not in BENCHMARKS.md" for name in self.missing]
        for name, found in self.typed.items():
            lines.append(f"{name}: prose-only section holds figures:")
            lines += [f"    {line}" for line in found]
        lines += self.unmarked
        lines.append("BENCHMARKS.md matches its results files." if self.ok else "FAILED")
        return "\n".join(lines)


def check(path: Path = BENCHMARKS) -> CheckResult:
    """Render every registered section again from its results files and compare with ``path``.

    Only re-renders, never reruns a benchmark, so it takes seconds and needs no data set."""
    from bench.common import sections as registry

    result = CheckResult()
    text = path.read_text()
    present = sections_of(text)
    result.unmarked += unmarked_figures(text, path.name)
    for name, section_text in present.items():
        if name in registry.UNRENDERABLE:
            result.warnings.append(f"{name}: not checked: {registry.UNRENDERABLE[name]}")
        elif name in registry.PROSE_ONLY:
            found = registry.figure_lines(_MARKER.sub("", section_text))  # a name is no figure
            if found:
                result.typed[name] = found
        elif name not in registry.SECTIONS:
            result.unregistered.append(name)
    for section in registry.REGISTRY:
        if section.name not in present:
            result.missing.append(section.name)
            continue
        try:
            expected = block(section.name, section.title, section.render())
        except Exception as exc:  # a missing results file, a renderer that no longer fits it
            result.errors[section.name] = f"{type(exc).__name__}: {exc}"
            continue
        actual = present[section.name]
        if actual != expected:
            result.diffs[section.name] = "\n".join(
                difflib.unified_diff(
                    actual.splitlines(),
                    expected.splitlines(),
                    f"{path.name} ({section.name})",
                    f"render of {', '.join(section.results)}",
                    lineterm="",
                )
            )
    return result


def unmarked_figures(text: str, name: str = BENCHMARKS.name) -> list[str]:
    """Per stretch of text outside every section that holds figures, a line naming it and then
    its figure lines. No renderer writes those stretches, so no results file can vouch for a
    figure there: it fails the check, to be moved into a rendered section or rewritten to point
    at one (prose that needs a heading of its own goes in a prose-only section)."""
    from bench.common.sections import figure_lines

    found, position = [], 0
    for block_text in sections_of(text).values():
        at = text.index(block_text, position)
        found.append((position, at))
        position = at + len(block_text)
    found.append((position, len(text)))
    lines = []
    for start, end in found:
        found_lines = figure_lines(text[start:end])
        if found_lines:
            # From the line after an end marker to the line before the next start marker.
            first = text.count("\n", 0, start) + (2 if start else 1)
            last = text.count("\n", 0, end) + (0 if end < len(text) else 1)
            lines.append(
                f"lines {first}-{last} of {name} are outside every section and hold figures "
                "that no results file checks:"
            )
            lines += [f"    {line}" for line in found_lines]
    return lines


def write(path: Path = BENCHMARKS) -> list[str]:
    """Rewrite every registered section from its results files; the names of those that changed.
    Results files are only read: ``publish`` is not called, so no JSON is rewritten."""
    from bench.common import sections as registry

    before = sections_of(path.read_text())
    for section in registry.REGISTRY:
        replace_section(section.name, section.title, section.render(), path)
    after = sections_of(path.read_text())
    return [name for name, text in after.items() if before.get(name) != text]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="BENCHMARKS.md against its results files: every section re-rendered."
    )
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="compare; exit 1 on any difference")
    mode.add_argument("--write", action="store_true", help="rewrite every registered section")
    parser.add_argument("--path", type=Path, default=BENCHMARKS)
    args = parser.parse_args(argv)
    if args.write:
        changed = write(args.path)
        print("rewritten: " + (", ".join(changed) or "nothing changed"))
        return 0
    result = check(args.path)
    print(result.report())
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
