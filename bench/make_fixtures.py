"""Cut the small real-data fixture the tests use from the WordNet-noun data.

    python -m bench.make_fixtures            # writes tests/fixtures/wordnet_small.npz

Deterministic: the same data gives the same file. The fixture holds ``PER_CLASS`` synsets from each
of the ``N_CLASSES`` largest fine classes (lexname + depth-4 ancestor), with gloss and lemma
embeddings from both models (float16, as in the source), and each class's name embedding (the
lemmas of the class's ancestor synset).
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

import numpy as np

from bench.wordnet import FIELDS, MODELS, REPO_ROOT, fine_labels, load_wordnet

N_CLASSES = 16
PER_CLASS = 50
OUT = REPO_ROOT / "tests/fixtures/wordnet_small.npz"


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    print(build_fixture(args.data_dir, args.out))


if __name__ == "__main__":
    main()
