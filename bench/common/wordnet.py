"""Load the WordNet-noun embedding data (real features from two public sentence encoders).

The data lives in ``../shared/data/wordnet-nouns`` beside the checkout when the workplace provides
it, or wherever ``NOBACKFILL_WORDNET_DIR`` points; ``python -m bench.data.build_wordnet`` (``make
data``) rebuilds it from public sources (Debian's ``wordnet-base`` and the PyPI-shipped models).
Tests never need it: they use the fixtures cut from it (``bench.data.make_fixtures``), and the
benchmarks' ``--quick`` modes fall back to ``FIXTURE_DATA_DIR`` when it is absent.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[2]
OLD_MODEL = "all-MiniLM-L6-v2"
NEW_MODEL = "all-mpnet-base-v2"
MODELS = (OLD_MODEL, NEW_MODEL)
FIELDS = ("gloss", "lemma")
# The mini data folder cut from the real data (old model only; ``bench.data.make_fixtures``).
FIXTURE_DATA_DIR = REPO_ROOT / "tests/fixtures/wordnet-mini"


def default_data_dir() -> Path:
    """``$NOBACKFILL_WORDNET_DIR``, else the workplace copy, else the rebuild script's output."""
    env = os.environ.get("NOBACKFILL_WORDNET_DIR")
    if env:
        return Path(env)
    for candidate in (REPO_ROOT.parent / "shared/data/wordnet-nouns", REPO_ROOT / "data/wordnet"):
        if (candidate / "meta.jsonl.gz").exists():
            return candidate
    return REPO_ROOT / "data/wordnet"


def has_data(data_dir: Path) -> bool:
    return (data_dir / "meta.jsonl.gz").exists()


def quick_data_dir(benchmark: str) -> Path:
    """The data a ``--quick`` run uses: the full data where it is, else the mini fixture folder.

    The fallback is said on stderr and made the process's default (``NOBACKFILL_WORDNET_DIR``),
    so every loader of the run, and any process it starts, reads the same rows. Full runs never
    fall back: their figures are only meaningful on the full data.
    """
    data_dir = default_data_dir()
    if has_data(data_dir):
        return data_dir
    print(
        f"{benchmark} --quick: no WordNet-noun data at {data_dir}; running on the mini fixture "
        f"{FIXTURE_DATA_DIR.relative_to(REPO_ROOT)} (real rows, old model only; figures are "
        "not comparable with full-data runs)",
        file=sys.stderr,
        flush=True,
    )
    os.environ["NOBACKFILL_WORDNET_DIR"] = str(FIXTURE_DATA_DIR)
    return FIXTURE_DATA_DIR


@dataclass
class WordNetData:
    """Rows aligned across ``meta`` and every array in ``features[(field, model)]`` (float32)."""

    meta: list[dict]
    features: dict[tuple[str, str], np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.meta)

    def get(self, field_name: str, model: str) -> np.ndarray:
        return self.features[(field_name, model)]


def _read_jsonl_gz(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def load_wordnet(
    data_dir: Path | None = None,
    fields: tuple[str, ...] = FIELDS,
    models: tuple[str, ...] = MODELS,
    prefix: str = "",
) -> WordNetData:
    """Load metadata and float32 copies of the float16 feature files.

    ``prefix="ancestors."`` loads the hypernym-ancestor rows (class-name texts) instead.
    """
    data_dir = Path(data_dir) if data_dir is not None else default_data_dir()
    meta_path = data_dir / f"{prefix}meta.jsonl.gz"
    if not meta_path.exists():
        raise FileNotFoundError(
            f"{meta_path} not found: set NOBACKFILL_WORDNET_DIR or run `python -m bench.data.build_wordnet`"
        )
    data = WordNetData(meta=_read_jsonl_gz(meta_path))
    for field_name in fields:
        for model in models:
            arr = np.load(data_dir / f"{prefix}{field_name}.{model}.f16.npy")
            if arr.shape[0] != len(data.meta):
                raise ValueError(f"{field_name}.{model}: {arr.shape[0]} rows, meta has {len(data)}")
            data.features[(field_name, model)] = arr.astype(np.float32)
    return data


def fine_labels(
    meta: list[dict], depth: int = 4, min_count: int = 12
) -> tuple[np.ndarray, list[str]]:
    """The data README's fine classes: lexname + the ancestor at ``depth`` (or the synset itself).

    Returns (indices of kept rows, their labels), keeping classes with ≥ ``min_count`` members —
    147 classes over 21,836 of the 24,000 synsets at the defaults.
    """
    raw = []
    for m in meta:
        path = [*m["ancestors"], m["synset_id"]]
        raw.append(f"{m['lexname']}/{path[min(depth, len(m['ancestors']))]}")
    counts = Counter(raw)
    keep = np.array([i for i, lab in enumerate(raw) if counts[lab] >= min_count], dtype=np.int64)
    return keep, [raw[i] for i in keep]


def encode_labels(labels: list[str]) -> tuple[np.ndarray, list[str]]:
    """Strings → integer codes 0..K−1 (sorted class names)."""
    classes = sorted(set(labels))
    index = {c: i for i, c in enumerate(classes)}
    return np.array([index[lab] for lab in labels], dtype=np.int64), classes


def split_indices(
    n: int, train_fraction: float = 0.6, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """The README's split: a ``default_rng(seed).permutation``, first ``train_fraction`` to train."""
    perm = np.random.default_rng(seed).permutation(n)
    cut = round(train_fraction * n)
    return perm[:cut], perm[cut:]
