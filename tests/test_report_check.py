"""``python -m bench.common.report --check`` (issue 42 item 8): BENCHMARKS.md is its renderers'
output from the committed results files, and the check does fail when a figure is typed."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.common.report import BENCHMARKS, check, main, sections_of, write
from bench.common.sections import PROSE_ONLY, SECTIONS, figure_lines


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """A scratch copy of BENCHMARKS.md to spoil (the real one is never written)."""
    path = tmp_path / "BENCHMARKS.md"
    path.write_text(BENCHMARKS.read_text())
    return path


def test_benchmarks_matches_its_results_files() -> None:
    result = check(BENCHMARKS)
    assert result.ok, result.report()


def test_every_section_is_rendered_or_prose() -> None:
    """No section of the real file is left to the allowlists by accident: the prose ones are
    named, the rest rendered."""
    names = set(sections_of(BENCHMARKS.read_text()))
    assert names - set(PROSE_ONLY) == set(SECTIONS)


def test_a_typed_figure_fails_and_names_its_section(copy: Path) -> None:
    text = copy.read_text()
    section = sections_of(text)["bench.perf.ingest"]
    assert "| faiss_add | 351,561 |" in section
    copy.write_text(text.replace(section, section.replace("351,561", "351,562")))
    result = check(copy)
    assert not result.ok
    assert set(result.diffs) == {"bench.perf.ingest"}
    assert "-| faiss_add | 351,562 |" in result.diffs["bench.perf.ingest"]
    assert "+| faiss_add | 351,561 |" in result.diffs["bench.perf.ingest"]
    assert main(["--check", "--path", str(copy)]) == 1


def test_write_puts_the_render_back(copy: Path) -> None:
    original = copy.read_text()
    copy.write_text(original.replace("| faiss_add | 351,561 |", "| faiss_add | 351,562 |"))
    assert write(copy) == ["bench.perf.ingest"]
    assert copy.read_text() == original


def test_an_unregistered_section_fails(copy: Path) -> None:
    typed = "<!-- hand.typed:start -->\n## Typed\n\n| x | 1.23 |\n<!-- hand.typed:end -->\n"
    copy.write_text(copy.read_text() + "\n" + typed)
    result = check(copy)
    assert not result.ok
    assert result.unregistered == ["hand.typed"]
    assert main(["--check", "--path", str(copy)]) == 1


def test_a_figure_in_a_prose_section_fails(copy: Path) -> None:
    text = copy.read_text()
    end = "<!-- perf.notes:end -->"
    copy.write_text(text.replace(end, "Ingest is now 1.4× faster.\n" + end))
    result = check(copy)
    assert not result.ok
    assert result.typed == {"perf.notes": ["Ingest is now 1.4× faster."]}


def test_a_registered_section_gone_fails(copy: Path) -> None:
    text = copy.read_text()
    copy.write_text(text.replace(sections_of(text)["two-stage"], ""))
    result = check(copy)
    assert result.missing == ["two-stage"]


def test_figure_lines_allows_references_code_and_list_markers() -> None:
    prose = (
        "### Changed (issue 6, item 5)\n"
        "1. **Flat search** (`python -m bench.perf.search --sizes 100000\n"
        "   1000000`), since items 6 and 7, commit `b07c2d3`.\n"
        "A flat gallery's file is 2× smaller."
    )
    assert figure_lines(prose) == ["A flat gallery's file is 2× smaller."]


def test_unbalanced_markers_raise() -> None:
    with pytest.raises(ValueError, match="no end marker"):
        sections_of("<!-- a:start -->\n## A\n")
    with pytest.raises(ValueError, match="without its start"):
        sections_of("<!-- a:end -->\n")
