"""The package layers of ``[tool.importlinter]`` hold, and a wrong-way import breaks them by name."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint(where: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(where / "pyproject.toml"), "--no-cache"],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": str(LINT_IMPORTS.parent), "PYTHONPATH": str(where)},
    )


def test_the_layers_and_the_acyclic_modules_hold() -> None:
    done = _lint(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    # Every contract of pyproject.toml checked and kept (a contract the tool skipped would not
    # count): the layers, the engines' independence and the vector core below them (app.vectors
    # and the in-place migration), the acyclic modules.
    contracts = (ROOT / "pyproject.toml").read_text().count("[[tool.importlinter.contracts]]")
    assert contracts >= 3
    assert f"{contracts} kept, 0 broken" in done.stdout


def _copy(tmp_path: Path) -> Path:
    where = tmp_path / "copy"
    for name in ("app", "worker"):
        shutil.copytree(ROOT / name, where / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", where / "pyproject.toml")
    return where


def test_storage_importing_a_domain_package_breaks_the_layers_by_name(tmp_path: Path) -> None:
    where = _copy(tmp_path)
    sql = where / "app" / "vectors" / "sql.py"
    sql.write_text(sql.read_text() + "\nfrom app.galleries.models import Gallery  # noqa\n")
    done = _lint(where)
    assert done.returncode == 1
    assert "app.vectors is not allowed to import app.galleries" in done.stdout
    assert "app.vectors.sql -> app.galleries.models" in done.stdout


def test_a_cycle_between_two_modules_of_a_package_breaks_the_contract(tmp_path: Path) -> None:
    where = _copy(tmp_path)
    engine = where / "app" / "vectors" / "engine.py"
    # engine is what every storage imports; a function-level import back is still a cycle.
    engine.write_text(engine.read_text() + "\n\ndef _back():\n    from app.vectors import sql\n")
    done = _lint(where)
    assert done.returncode == 1
    assert "No cycles are allowed in app.vectors" in done.stdout


def test_an_engine_importing_another_engine_breaks_their_independence(tmp_path: Path) -> None:
    where = _copy(tmp_path)
    storage = where / "app" / "vectors" / "pgvector" / "storage.py"
    # What two engines share belongs in the core: borrowing it from Qdrant ties them together.
    storage.write_text(
        storage.read_text() + "\nfrom app.vectors.qdrant.storage import TIE_SLACK  # noqa\n"
    )
    done = _lint(where)
    assert done.returncode == 1
    assert "app.vectors: the engines are independent of each other BROKEN" in done.stdout
    assert "app.vectors.pgvector is not allowed to import app.vectors.qdrant" in done.stdout


def test_the_vector_core_importing_an_engine_breaks_the_layers_by_name(tmp_path: Path) -> None:
    where = _copy(tmp_path)
    rerank = where / "app" / "vectors" / "rerank.py"
    rerank.write_text(
        rerank.read_text() + "\nfrom app.vectors.faiss.index import LorentzIndex  # noqa\n"
    )
    done = _lint(where)
    assert done.returncode == 1
    assert "app.vectors: the engine registry > the engines > the shared core BROKEN" in done.stdout
    assert "app.vectors.rerank -> app.vectors.faiss.index" in done.stdout


def test_a_vector_module_outside_the_contract_breaks_it_by_name(tmp_path: Path) -> None:
    where = _copy(tmp_path)
    # Exhaustive: a new module of app.vectors is either a folder among the engines or in the core.
    (where / "app" / "vectors" / "weaviate.py").write_text('"""An engine beside the others."""\n')
    done = _lint(where)
    assert done.returncode == 1
    assert "app.vectors.weaviate" in done.stdout


def test_a_type_checking_import_back_is_a_cycle_too(tmp_path: Path) -> None:
    where = _copy(tmp_path)
    search = where / "app" / "vectors" / "milvus" / "search.py"
    # The engine imports its search; a type named back under TYPE_CHECKING is still a cycle
    # (no exception for such imports: the search names what it needs as a protocol).
    search.write_text(
        search.read_text()
        + "\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
        + "    from app.vectors.milvus.engine import MilvusGallery  # noqa\n"
    )
    done = _lint(where)
    assert done.returncode == 1
    assert "No cycles are allowed in app.vectors.milvus" in done.stdout
