"""Shared test configuration."""

from __future__ import annotations

import os
import tempfile

import torch

# Tests never read the full WordNet-noun data (a fresh clone has none): the data lookup points at
# an empty folder for the whole run, subprocesses included, so a test that reaches for the full
# data fails here as it would for a newcomer. They use the fixtures cut from it instead.
# (Kept in the environment too, so a test module importing ``tests.conftest`` — a second copy
# of this module — names the same folder rather than making another.)
NO_DATA_DIR = os.environ.get("NOBACKFILL_TEST_EMPTY_DATA_DIR") or tempfile.mkdtemp(
    prefix="nobackfill-no-wordnet-"
)
os.environ["NOBACKFILL_TEST_EMPTY_DATA_DIR"] = NO_DATA_DIR
os.environ["NOBACKFILL_WORDNET_DIR"] = NO_DATA_DIR

# Tests are small; more threads than cores only adds contention on the 2-core CI machine.
torch.set_num_threads(max(1, min(2, torch.get_num_threads())))


from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(autouse=True)
def _data_lookup_stays_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    """Undo, after each test, a ``--quick`` run in-process pointing the lookup at the mini fixture.

    ``bench.common.wordnet.quick_data_dir`` sets the variable for the rest of its process (the CLI's
    loaders read it); in the test process that would leak into later tests and their subprocesses.
    """
    monkeypatch.setenv("NOBACKFILL_WORDNET_DIR", NO_DATA_DIR)


@pytest.fixture(scope="session")
def wordnet_small() -> dict[str, np.ndarray]:
    """800 real WordNet synsets (16 fine classes × 50), cut by ``python -m bench.data.make_fixtures``.

    Keys: ``synset_id``, ``lexname``, ``label``, ``classes``, ``{gloss,lemma}.<model>`` (800×d) and
    ``class_{gloss,lemma}.<model>`` (16×d, the class names' embeddings); features as float32.
    """
    with np.load(FIXTURES / "wordnet_small.npz") as f:
        return {k: (f[k].astype(np.float32) if f[k].dtype == np.float16 else f[k]) for k in f.files}
