"""Shared test configuration."""

from __future__ import annotations

import functools
import os
import tempfile
from typing import Any

# Under pytest-xdist (``make test`` runs two workers on the 2-core CI machine) each worker keeps
# to one thread: two workers with a thread per core each would only contend, and OpenMP's spinning
# threads (FAISS) make contention costly. Set before torch or FAISS start their thread pools; the
# servers and workers the tests spawn inherit it.
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if XDIST_WORKER:
    os.environ["OMP_NUM_THREADS"] = "1"

import torch  # noqa: E402

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
torch.set_num_threads(1 if XDIST_WORKER else max(1, min(2, torch.get_num_threads())))


from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures"

# How ``make test`` spreads the suite over pytest-xdist workers (``--dist loadfile``): a module
# runs on one worker, so its module-scoped fixtures are built once, as in a serial run; and every
# module that uses the real Milvus server runs on one and the same worker, as one scope: a test
# session starts one such server (its embedded etcd's peer port 2380 is fixed, so two cannot run
# side by side). Such a module names the server's fixture (``tests/service/milvus_server.py``).
# (xdist's own ``loadgroup`` marks are not applied under pytest 9.2 with xdist 3.8: the worker's
# hook that reads them is never called, so the grouping is done in the scheduler here.)
MILVUS_SERVER_SCOPE = "milvus-server"
TESTS = Path(__file__).parent


@functools.cache
def uses_milvus_server(module_path: str) -> bool:
    path = TESTS.parent / module_path
    return path.is_file() and "milvus_server_uri" in path.read_text(encoding="utf-8")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return MILVUS_SERVER_SCOPE if uses_milvus_server(module) else module

    return ModuleScheduling(config, log)


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
