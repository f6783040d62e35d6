"""Which results file and which renderer write each section of BENCHMARKS.md (issue 42 item 8).

Every figure in BENCHMARKS.md must come from a results file under ``bench/results`` through the
renderer of the benchmark that wrote it, never be typed. ``python -m bench.common.report --check``
renders every section listed here again from its results files and compares; ``--write`` puts the
renders in place. A section of BENCHMARKS.md that is in none of the three tables below fails the
check, so a hand-written section cannot slip in unnoticed; so does a figure in the text between
sections, which no renderer writes.

Renderers are named as ``"module:function"`` and imported only when a section is rendered: the
benchmark modules import torch, FAISS, FastAPI and the like, and this table must stay cheap to
import.
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from bench.common.wordnet import REPO_ROOT


@dataclass(frozen=True)
class Section:
    """One section of BENCHMARKS.md and how to render it again.

    ``renderer`` is called with the loaded results files in ``results`` order (one argument
    each), or with one list of them when ``as_list`` (``render_streams`` takes the continual
    runs as a list). ``title`` is the ``## `` heading the benchmark's ``main`` publishes under.
    """

    name: str
    title: str
    results: tuple[str, ...]
    renderer: str
    as_list: bool = False

    def render(self) -> str:
        """The section's body, rendered from its results files by the benchmark's own code."""
        payloads = [json.loads((REPO_ROOT / path).read_text()) for path in self.results]
        module, _, function = self.renderer.partition(":")
        render: Callable[..., str] = getattr(importlib.import_module(module), function)
        return render(payloads) if self.as_list else render(*payloads)


def _section(name: str, title: str, renderer: str, *results: str, as_list: bool = False) -> Section:
    return Section(name, title, tuple(f"bench/results/{r}" for r in results), renderer, as_list)


# Issue 46 item 4: the Milvus parts of bench.perf on a real Milvus server (``python -m
# bench.perf.milvus_server STAGE``) and a pgvector table at scale (``bench.perf.pgvector_scale``),
# each of which appends its section to BENCHMARKS.md on its first run.
# Each is registered once its run has written its results file (the first named): before that
# neither the file nor the section exists, and there is nothing to check; after it, the section
# is held to its render like any other (a section gone, or its file gone, fails the check).
SERVER_SECTIONS: tuple[Section, ...] = (
    _section(
        "bench.perf.milvus_server.engines",
        "Milvus engine on a real Milvus server (bench.perf.milvus_server engines)",
        "bench.perf.milvus_server_report:render_engines",
        "milvus_server_engines.json",
    ),
    _section(
        "bench.perf.milvus_server.api_memory",
        "API process memory on a real Milvus server (bench.perf.milvus_server api-memory)",
        "bench.perf.milvus_server_report:render_api_memory",
        "milvus_server_api_memory.json",
        "api_memory.json",
    ),
    _section(
        "bench.perf.milvus_server.attach",
        "Attached collection on a real Milvus server (bench.perf.milvus_server attach)",
        "bench.perf.milvus_server_report:render_attach",
        "milvus_server_attach.json",
    ),
    _section(
        "bench.perf.milvus_server.bridged",
        "Bridged search on a real Milvus server against FAISS (bench.perf.milvus_server bridged)",
        "bench.perf.milvus_server_report:render_bridged",
        "milvus_server_bridged.json",
    ),
    _section(
        "bench.perf.pgvector_scale",
        "Attached pgvector table at 1M rows (bench.perf.pgvector_scale)",
        "bench.perf.pgvector_scale:render",
        "pgvector_scale.json",
    ),
)

# In the order the sections appear in BENCHMARKS.md. Each entry is what the module's ``main`` (or
# its ``--render`` / ``--publish`` mode) passes to ``publish`` / ``replace_section``.
REGISTRY: tuple[Section, ...] = (
    _section(
        "bench.quality.continual",
        "Continual upgrades (HMCL): classification-style and retrieval tasks",
        "bench.quality.continual_report:render_streams",
        "continual.json",
        "continual_reordered.json",
        "continual_final.json",
        "continual_reordered_final.json",
        as_list=True,
    ),
    _section(
        "bench.perf.ingest",
        "Ingest speed (bench.perf.ingest)",
        "bench.perf.ingest:render_markdown",
        "ingest.json",
    ),
    _section(
        "bench.perf.search",
        "Search speed (bench.perf.search)",
        "bench.perf.search:render_markdown",
        "search.json",
    ),
    _section(
        "bench.perf.indexes",
        "Index choices on lifted vectors (bench.perf.indexes)",
        "bench.perf.indexes:render_markdown",
        "indexes.json",
    ),
    _section(
        "bench.perf.load", "Load (bench.perf.load)", "bench.perf.load:render_markdown", "load.json"
    ),
    _section(
        "bench.quality.compat",
        "Backward compatibility (`bench.quality.compat`)",
        "bench.quality.compat_report:render_markdown",
        "compat.json",
    ),
    # Written by ``python -m bench.quality.served_defaults`` (``--render``: from the file alone).
    _section(
        "bench.quality.served_defaults",
        "Served defaults against old→old on validation (bench.quality.served_defaults)",
        "bench.quality.served_defaults:render",
        "served_defaults.json",
    ),
    _section(
        "bench.quality.bt2_probe",
        "BT²-style extra dimensions against class-map (`bench.quality.bt2_probe`)",
        "bench.quality.bt2_probe:summary_markdown",
        "bt2_probe.json",
    ),
    _section(
        "bench.perf.training",
        "Training cost (bench.perf.training)",
        "bench.perf.training:render_markdown",
        "training.json",
    ),
    _section(
        "bench.perf.training.default_upgrade",
        "The default upgrade's time and ETA (bench.perf.training --default-upgrade)",
        "bench.perf.default_upgrade:render_markdown",
        "training_default_upgrade.json",
    ),
    _section(
        "bench.quality.compat.quick",
        "Backward compatibility (`bench.quality.compat`, quick)",
        "bench.quality.compat_report:render_markdown",
        "compat-quick.json",
    ),
    _section(
        "bench.quality.backfill",
        "Partial backfill (bench.quality.backfill)",
        "bench.quality.backfill_report:render_markdown",
        "backfill.json",
        "backfill-validation.json",
    ),
    _section(
        "bench.quality.querydoc",
        "Query → document search, every alternative (bench.quality.querydoc)",
        "bench.quality.querydoc:render_markdown",
        "querydoc.json",
    ),
    _section(
        "bench.perf.engines",
        "Vector engines (bench.perf.engines)",
        "bench.perf.engines:render_markdown",
        "engines.json",
    ),
    # The next three are rendered from files their commands write without a section
    # (``bench.perf.milvus_layouts``, ``bench.perf.engines --validate``, a 1M-row run killed
    # before its FAISS stage); ``python -m bench.common.report --write`` puts them in place.
    _section(
        "bench.perf.milvus_layouts",
        "Milvus layouts: ordering and search cost (bench.perf.milvus_layouts)",
        "bench.perf.engines_report:render_layouts",
        "milvus_layouts.json",
        "engines.json",
    ),
    _section(
        "bench.perf.engines.validation",
        "Poincaré layout's k′ and ef on validation galleries (bench.perf.engines --validate)",
        "bench.perf.engines_report:render_validation",
        "engines_validation_poincare_seed7.json",
        "engines_validation_poincare_seed7_r1.json",
        "engines_validation_poincare_seed8.json",
        "engines_validation_poincare_seed8_r1.json",
    ),
    _section(
        "bench.perf.engines.1m",
        "Vector engines at 1M rows, Milvus only (bench.perf.engines --rows 1000000)",
        "bench.perf.engines_report:render_1m",
        "engines_1m.json",
    ),
    _section(
        "bench.perf.api_memory",
        "API process memory against gallery size (bench.perf.api_memory)",
        "bench.perf.api_memory:render_markdown",
        "api_memory.json",
    ),
    _section(
        "bench.quality.transition",
        "Transition search (bench.quality.transition)",
        "bench.quality.transition:section_markdown",
        "transition.json",
        "transition-validation.json",
    ),
    _section(
        "bench.perf.mixed_search",
        "Mixed and transition search speed (bench.perf.mixed_search)",
        "bench.perf.mixed_search:render_markdown",
        "mixed_search.json",
    ),
    _section(
        "bench.perf.soak",
        "Soak under hostile load (bench.perf.soak)",
        "bench.perf.soak:render_markdown",
        "soak.json",
    ),
    _section(
        "bench.quality.traffic",
        "Skewed traffic (bench.quality.traffic)",
        "bench.quality.traffic:render_markdown",
        "traffic.json",
    ),
    _section(
        "bench.perf.access_upload",
        "Access-count upload (bench.perf.access_upload)",
        "bench.perf.access_upload:render_markdown",
        "access_upload.json",
    ),
    _section(
        "bench.perf.backfill_plan",
        "Backfill planning time (bench.perf.backfill_plan)",
        "bench.perf.backfill_plan:render_markdown",
        "backfill_plan.json",
    ),
    _section(
        "bench.perf.qdrant_attach",
        "Attached Qdrant collection (bench.perf.qdrant_attach)",
        "bench.perf.qdrant_attach:render_markdown",
        "qdrant_attach.json",
    ),
    _section(
        "bench.perf.qdrant_attach.scale",
        "Attached Qdrant collection at scale (bench.perf.qdrant_attach --scale)",
        "bench.perf.qdrant_attach:render_scale",
        "qdrant_attach_scale.json",
    ),
    _section(
        "bench.perf.milvus_attach.scale",
        "Attached Milvus collection at scale (bench.perf.milvus_attach)",
        "bench.perf.milvus_attach:render",
        "milvus_attach_scale.json",
    ),
    _section(
        "two-stage",
        "Two-stage search (issue 43)",
        "bench.quality.two_stage:render",
        "two_stage.json",
    ),
    _section(
        "bench.quality.two_stage_traffic",
        "Two-stage search under traffic: what it embeds (issue 43)",
        "bench.quality.two_stage_traffic:render",
        "two_stage_traffic.json",
    ),
    _section(
        "bench.quality.whole_gallery",
        "The report's figures on the whole gallery (bench.quality.whole_gallery)",
        "bench.quality.whole_gallery:render_markdown",
        "whole_gallery.json",
    ),
    _section(
        "bench.perf.two_stage",
        "Two-stage search speed (bench.perf.two_stage)",
        "bench.perf.two_stage:render_markdown",
        "two_stage_perf.json",
    ),
    *(s for s in SERVER_SECTIONS if (REPO_ROOT / s.results[0]).exists()),
)
SECTIONS: dict[str, Section] = {s.name: s for s in REGISTRY}

# Sections of prose alone: how figures were taken, what changed and why. They hold no figure
# (``figure_lines`` enforces it), so there is nothing to render; a measurement belongs in a
# results file and its benchmark's section, and these point at it.
PROSE_ONLY: dict[str, str] = {
    "continual.notes": "how to read the continual tables: how the settings grid moved",
    "perf.notes": "how the perf sections were taken and what issue 6 changed; figures live in "
    "the sections it names",
    "compat.notes": "how to read the compatibility tables: the runs behind them, what changed "
    "and what the figures say",
    "querydoc.notes": "how to read the query → document tables: which runs, what changed",
    "engines.notes": "the Milvus engine's layout and search cost, read from the engines, "
    "layouts and validation sections",
    "engines.1m.notes": "what the 1M-row Milvus run says",
    "access_upload.notes": "what the access-count upload figures say and what bounds them",
}

# Sections that no results file can render (the file is missing, or the renderer needs data that
# was never stored). ``--check`` names each with a warning instead of failing; the aim is none.
UNRENDERABLE: dict[str, str] = {}

# What a digit may be in a prose-only section: a code span (a command, a path, a commit), an
# issue or item number, a numbered list's marker, a metric's cut-off (`R@10`, `CMC@1`, `mAP@100`:
# part of the metric's name, not a value of it). Anything else is taken for a figure.
_CODE_SPAN = re.compile(r"`[^`]*`")
_REFERENCE = re.compile(r"\b(?:issues?|items?)\s+\d+(?:\s*(?:,|and)\s*\d+)*\b", re.IGNORECASE)
_LIST_MARKER = re.compile(r"^\s*\d+\.\s", re.MULTILINE)
_METRIC = re.compile(r"\b[A-Za-z][A-Za-z_]*@\d+\b")


def figure_lines(text: str) -> list[str]:
    """The lines of ``text`` that hold a figure: a digit outside a code span, an issue or item
    reference, a list marker and a metric's name. Prose (a prose-only section, or text outside
    every section) must have none: a typed figure is exactly what the check exists to keep out,
    and prose is where it would hide."""
    # Code spans first, over the whole text (a command may wrap onto the next line); every
    # blanking keeps its match's line breaks, so that the lines found are the text's own.
    bare = text
    for pattern, blank in (
        (_CODE_SPAN, "‹code›"),
        (_REFERENCE, ""),
        (_METRIC, "‹metric›"),
        (_LIST_MARKER, ""),
    ):
        bare = pattern.sub(lambda m, blank=blank: blank + "\n" * m.group().count("\n"), bare)
    return [
        line
        for line, blanked in zip(text.splitlines(), bare.splitlines(), strict=True)
        if re.search(r"\d", blanked)
    ]
