"""Cut the small real-data fixtures the tests use from the WordNet-noun data.

    python -m bench.data.make_fixtures   # writes tests/fixtures/wordnet_small.npz, its texts and wordnet-mini/

Deterministic: the same data gives the same files.

- ``wordnet_small.npz`` holds ``PER_CLASS`` synsets from each of the ``N_CLASSES`` largest fine
  classes (lexname + depth-4 ancestor), with gloss and lemma embeddings from both models (float16,
  as in the source), and each class's name embedding (the lemmas of the class's ancestor synset).
- ``wordnet_small_texts.json`` holds the same synsets' texts in the same order: ``lemma`` (the
  lemmas joined by ", ", the text the lemma vectors embed) and ``gloss``; the embedder stand-in
  of the tests (``bench.common.embedder_server``) answers these texts with their recorded vectors.
- ``wordnet-mini/`` is a data folder in the full data's own layout (``meta.jsonl.gz``,
  ``<field>.<model>.f16.npy``, ``ancestors.*``) with the old model's rows only: every class of the
  continual stream cut to its minimum size and a slice of each retrieval group. The benchmarks'
  ``--quick`` modes run on it when the full data is absent (``bench.common.wordnet.quick_data_dir``).
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections import Counter
from pathlib import Path

import numpy as np

from bench.common.wordnet import (
    FIELDS,
    FIXTURE_DATA_DIR,
    MODELS,
    OLD_MODEL,
    REPO_ROOT,
    fine_labels,
    load_wordnet,
)
from bench.quality.continual_stream import (
    CLASS_DEPTH,
    MIN_CLASS_ITEMS,
    RETRIEVAL_GROUPS,
    stream_classes,
)

N_CLASSES = 16
PER_CLASS = 50
OUT = REPO_ROOT / "tests/fixtures/wordnet_small.npz"
TEXTS_OUT = REPO_ROOT / "tests/fixtures/wordnet_small_texts.json"
# Items per retrieval group in the mini folder (the continual --quick run takes up to 400).
MINI_RETRIEVAL_ITEMS = 100


def build_fixture(data_dir: Path | None = None, out: Path = OUT) -> Path:
    data = load_wordnet(data_dir)
    ancestors = load_wordnet(data_dir, prefix="ancestors.")
    keep, labels = fine_labels(data.meta)
    counts = Counter(labels)
    # Largest classes first; ties broken by name so the choice is stable.
    classes = sorted(counts, key=lambda c: (-counts[c], c))[:N_CLASSES]
    rng = np.random.default_rng(0)
    rows: list[int] = []
    row_labels: list[str] = []
    for cls in classes:
        members = np.array([i for i, lab in zip(keep, labels, strict=True) if lab == cls])
        chosen = np.sort(rng.choice(members, size=PER_CLASS, replace=False))
        rows.extend(int(i) for i in chosen)
        row_labels.extend([cls] * PER_CLASS)
    rows_arr = np.array(rows)

    # Class-name rows: the ancestor synset named in the label, found in either metadata file.
    where = {m["synset_id"]: ("main", i) for i, m in enumerate(data.meta)}
    where.update({m["synset_id"]: ("anc", i) for i, m in enumerate(ancestors.meta)})
    arrays: dict[str, np.ndarray] = {}
    for field_name in FIELDS:
        for model in MODELS:
            key = f"{field_name}.{model}"
            arrays[key] = data.get(field_name, model)[rows_arr].astype(np.float16)
            name_rows = []
            for cls in classes:
                source, i = where[cls.split("/", 1)[1]]
                table = data if source == "main" else ancestors
                name_rows.append(table.get(field_name, model)[i])
            arrays[f"class_{key}"] = np.stack(name_rows).astype(np.float16)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        out,
        synset_id=np.array([data.meta[i]["synset_id"] for i in rows]),
        lexname=np.array([data.meta[i]["lexname"] for i in rows]),
        label=np.array(row_labels),
        classes=np.array(classes),
        **arrays,
    )
    return out


def _write_rows(out: Path, prefix: str, meta: list[dict], arrays: dict[str, np.ndarray]) -> None:
    with gzip.GzipFile(out / f"{prefix}meta.jsonl.gz", "wb", mtime=0) as fh:
        fh.write("".join(json.dumps(m) + "\n" for m in meta).encode())
    for name, arr in arrays.items():
        np.save(out / f"{prefix}{name}.f16.npy", arr.astype(np.float16))


def build_mini_data_dir(data_dir: Path | None = None, out: Path = FIXTURE_DATA_DIR) -> Path:
    """The mini data folder: real rows of the old model, in the full data's layout.

    The continual stream's classes (each cut to ``MIN_CLASS_ITEMS`` members: the same 80 classes are
    kept, dealt in another order), ``MINI_RETRIEVAL_ITEMS`` synsets of each retrieval group outside those
    classes, and the ancestor rows that name the classes.
    """
    data = load_wordnet(data_dir, models=(OLD_MODEL,))
    ancestors = load_wordnet(data_dir, models=(OLD_MODEL,), prefix="ancestors.")
    classes = [c for task in stream_classes(data.meta) for c in task]
    rng = np.random.default_rng(0)

    def class_of(m: dict) -> str | None:
        return m["ancestors"][CLASS_DEPTH] if len(m["ancestors"]) > CLASS_DEPTH else None

    rows: list[int] = []
    for cls in sorted(classes):
        members = np.array([i for i, m in enumerate(data.meta) if class_of(m) == cls])
        rows.extend(int(i) for i in rng.choice(members, size=MIN_CLASS_ITEMS, replace=False))
    # Classes the stream does not deal must stay below the threshold in the mini folder too,
    # or the deal would change: the retrieval rows come from synsets of no depth-6 class at all.
    for group in RETRIEVAL_GROUPS:
        pool = np.array(
            [i for i, m in enumerate(data.meta) if m["lexname"] in group and class_of(m) is None]
        )
        rows.extend(int(i) for i in rng.choice(pool, size=MINI_RETRIEVAL_ITEMS, replace=False))
    rows_arr = np.sort(np.array(rows))
    # Each class needs a name row: a kept main row, else the class synset's row in the full
    # data (main or ancestors), written to the mini folder's ancestor files.
    kept = {data.meta[i]["synset_id"] for i in rows_arr}
    where = {m["synset_id"]: (ancestors, i) for i, m in enumerate(ancestors.meta)}
    where.update({m["synset_id"]: (data, i) for i, m in enumerate(data.meta)})
    named = [where[c] for c in sorted(set(classes) - kept)]
    out.mkdir(parents=True, exist_ok=True)
    _write_rows(
        out,
        "",
        [data.meta[i] for i in rows_arr],
        {f"{f}.{OLD_MODEL}": data.get(f, OLD_MODEL)[rows_arr] for f in FIELDS},
    )
    _write_rows(
        out,
        "ancestors.",
        [table.meta[i] for table, i in named],
        {
            f"{f}.{OLD_MODEL}": np.stack([table.get(f, OLD_MODEL)[i] for table, i in named])
            for f in FIELDS
        },
    )
    return out


def build_texts(data_dir: Path | None = None, fixture: Path = OUT, out: Path = TEXTS_OUT) -> Path:
    """The fixture's synsets' lemma and gloss texts, in the fixture's row order."""
    data = load_wordnet(data_dir)
    by_id = {m["synset_id"]: m for m in data.meta}
    with np.load(fixture) as f:
        ids = [str(i) for i in f["synset_id"]]
    rows = [
        {"synset_id": i, "lemma": ", ".join(by_id[i]["lemmas"]), "gloss": by_id[i]["gloss"]}
        for i in ids
    ]
    out.write_text(json.dumps(rows, ensure_ascii=False, indent=0) + "\n")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--mini-out", type=Path, default=FIXTURE_DATA_DIR)
    args = parser.parse_args()
    print(build_fixture(args.data_dir, args.out))
    print(build_texts(args.data_dir, args.out))
    print(build_mini_data_dir(args.data_dir, args.mini_out))


if __name__ == "__main__":
    main()
