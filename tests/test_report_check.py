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


def test_a_figure_between_sections_fails(copy: Path) -> None:
    """Text outside every section has no renderer to vouch for it: a figure typed there fails the
    check (it used to be a warning), and the report names the stretch and the line."""
    text = copy.read_text()
    end, start = "<!-- bench.perf.ingest:end -->\n", "<!-- bench.perf.search:start -->"
    assert end + "\n" + start in text
    copy.write_text(text.replace(end + "\n", end + "\nIngest is now 1.4× faster.\n\n"))
    result = check(copy)
    assert not result.ok
    assert not (result.diffs or result.typed or result.unregistered or result.missing)
    assert len(result.unmarked) == 2
    assert "outside every section" in result.unmarked[0]
    assert result.unmarked[1].strip() == "Ingest is now 1.4× faster."
    assert "Ingest is now 1.4× faster." in result.report()
    assert main(["--check", "--path", str(copy)]) == 1


def test_prose_between_sections_without_figures_passes(copy: Path) -> None:
    text = copy.read_text()
    end = "<!-- bench.perf.ingest:end -->\n"
    copy.write_text(text.replace(end, end + "\nThe `http_npy` row is the one to read; see R@10.\n"))
    assert check(copy).ok


def test_served_defaults_render_writes_its_section(
    copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``python -m bench.quality.served_defaults --render`` puts its section back from the
    results file alone, so rerunning it keeps BENCHMARKS.md what the check expects."""
    from bench.common.report import replace_section
    from bench.quality import served_defaults

    text = copy.read_text()
    section = sections_of(text)[served_defaults.SECTION]
    assert "| 10 | 14/15 |" in section
    copy.write_text(text.replace(section, section.replace("| 10 | 14/15 |", "| 10 | 15/15 |")))
    assert set(check(copy).diffs) == {served_defaults.SECTION}
    monkeypatch.setattr(
        served_defaults,
        "replace_section",
        lambda name, title, body: replace_section(name, title, body, copy),
    )
    served_defaults.main(["--render"])
    assert copy.read_text() == text


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


def test_figure_lines_allows_metric_names_not_their_values() -> None:
    """`R@10`, `CMC@1`, `P_com(CMC@1)`, `mAP@100` name a metric; a value beside one is a figure."""
    assert figure_lines("auto leads on R@10 and P_com(CMC@1), level on mAP@100 and MRR@100.") == []
    assert figure_lines("auto's R@10 is 0.451.") == ["auto's R@10 is 0.451."]
    assert figure_lines("recall@10 ten points up") == []
    assert figure_lines("the 1M-row gallery") == ["the 1M-row gallery"]


def test_unbalanced_markers_raise() -> None:
    with pytest.raises(ValueError, match="no end marker"):
        sections_of("<!-- a:start -->\n## A\n")
    with pytest.raises(ValueError, match="without its start"):
        sections_of("<!-- a:end -->\n")
