"""The compose stack as it runs from the image, without a Docker engine: the project is installed
non-editable into a fresh virtual environment from exactly the files the Dockerfile copies, and
compose's own command lines run from another directory — `nobackfill migrate` on a fresh
PostgreSQL database, `nobackfill serve` with the Celery runner, and the Celery worker — then an
upgrade travels through Redis and its model answers a search.

The fresh environment reaches the dependencies of the test environment through a path file (no
network, no second torch), but the project itself — `app`, `worker`, `migrations` — comes only from
the wheel built from the Dockerfile's copied files.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import httpx
import numpy as np
import psycopg
import pytest
import redis

from tests.service.celery_worker import REDIS_URL, require_redis
from tests.service.conftest import (
    _admin_dsn,
)
from tests.service.test_deploy import compose, interpolate

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests/fixtures/wordnet_small.npz"
KEY = "nbk_installed_" + secrets.token_hex(16)
# A Redis database of its own: compose's worker listens on the queue named `nobackfill`.
STACK_REDIS_URL = REDIS_URL.rsplit("/", 1)[0] + "/13"


def dockerfile_sources(stage: str) -> list[str]:
    """The paths the Dockerfile's ``stage`` copies into the image (``COPY src... dest``)."""
    text = (REPO / "Dockerfile").read_text()
    blocks = re.split(r"^FROM ", text, flags=re.M)
    [block] = [b for b in blocks if re.match(rf"\S+ AS {stage}\b", b)]
    sources: list[str] = []
    for line in re.findall(r"^COPY (.+)$", block, flags=re.M):
        sources += line.split()[:-1]
    return sources


def run(command: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> str:
    done = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{command}: {done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding the project installed from a wheel of the Dockerfile's files."""
    root = tmp_path_factory.mktemp("image")
    source = root / "srv"
    source.mkdir()
    for path in dockerfile_sources("api"):
        origin = REPO / path
        if origin.is_dir():
            shutil.copytree(origin, source / path, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(origin, source / path)
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    wheels = root / "wheels"
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(wheels),
            str(source),
        ],
        root,
        env,
    )
    venv = root / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], root, env)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    # Dependencies only: a plain directory line adds the test environment's site-packages without
    # running its path files, so its editable install of this checkout stays out of sys.path.
    (site / "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    [wheel] = wheels.glob("nobackfill-*.whl")
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin/python"),
            "install",
            "--no-deps",
            str(wheel),
        ],
        root,
        env,
    )
    return venv


@pytest.fixture(scope="module")
def elsewhere(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working directory with no source tree in it (the image's WORKDIR after install)."""
    return tmp_path_factory.mktemp("workdir")


def stack_env(database_url: str, data_dir: Path) -> dict[str, str]:
    """Compose's environment for api, worker and migrate, pointed at this machine's services."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NOBACKFILL_", "PYTHON"))}
    for name, value in compose()["services"]["api"]["environment"].items():
        env[name] = interpolate(str(value))
    env.update(
        NOBACKFILL_DATABASE_URL=database_url,
        NOBACKFILL_REDIS_URL=STACK_REDIS_URL,
        NOBACKFILL_DATA_DIR=str(data_dir),
        NOBACKFILL_BOOTSTRAP_KEY=KEY,
        OMP_NUM_THREADS="1",
    )
    return env


def test_installed_copy_holds_the_project_and_its_migrations(
    installed: Path, elsewhere: Path
) -> None:
    out = run(
        [
            str(installed / "bin/python"),
            "-c",
            "import app, worker, migrations; from app.core.db import migrations_dir;"
            "print(app.__file__); print(worker.__file__); print(migrations_dir())",
        ],
        elsewhere,
        {**os.environ, "PYTHONPATH": ""},
    )
    paths = out.split()
    assert all(str(installed) in p for p in paths), paths
    assert list((Path(paths[2]) / "versions").glob("0001_*.py"))
    assert (Path(paths[2]) / "script.py.mako").is_file()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def wait_ready(url: str, process: subprocess.Popen, log: Path, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the server exited with {process.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    pytest.fail(f"the server did not answer within {timeout}s:\n{log.read_text()}")


def test_compose_commands_run_an_upgrade_through_redis(
    installed: Path, elsewhere: Path, fresh_postgres: str, tmp_path: Path
) -> None:
    require_redis()
    services = compose()["services"]
    env = stack_env(fresh_postgres, tmp_path / "data")
    bin_dir = installed / "bin"

    # migrate: compose's command, run from a directory without any source tree.
    migrate = services["migrate"]["command"]
    assert migrate[0] == "nobackfill"
    run([str(bin_dir / migrate[0]), *migrate[1:]], elsewhere, env)
    with psycopg.connect(
        _admin_dsn().rsplit("/", 1)[0] + "/" + fresh_postgres.rsplit("/", 1)[1]
    ) as conn:
        [version] = conn.execute("SELECT version_num FROM alembic_version").fetchone()
    assert version

    broker = redis.Redis.from_url(STACK_REDIS_URL)
    broker.flushdb()
    port = free_port()
    api = services["api"]["command"]
    api = [str(bin_dir / api[0]), *api[1:]]
    api[api.index("--host") + 1] = "127.0.0.1"
    api[api.index("--port") + 1] = str(port)
    worker = services["worker"]["command"]
    # celery's own console script belongs to a dependency, outside the fresh environment's bin/:
    # `python -m celery` is the same program.
    assert worker[0] == "celery"
    worker = [str(bin_dir / "python"), "-m", "celery", *worker[1:]]
    api_log, worker_log = tmp_path / "api.log", tmp_path / "worker.log"
    with open(api_log, "wb") as log:
        server = subprocess.Popen(api, cwd=elsewhere, env=env, stdout=log, stderr=subprocess.STDOUT)
    with open(worker_log, "wb") as log:
        celery = subprocess.Popen(
            worker, cwd=elsewhere, env=env, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, server, api_log)
        upgrade_through_the_api(url, celery, worker_log)
    finally:
        stop(server)
        stop(celery)
        broker.flushdb()


def upgrade_through_the_api(url: str, celery: subprocess.Popen, worker_log: Path) -> str:
    """Upload a gallery and a dataset, train a model through the worker, search with it; returns
    the gallery's id."""
    data = np.load(FIXTURE)
    n = 200
    ids = [str(s) for s in data["synset_id"][:n]]
    old = data["gloss.all-MiniLM-L6-v2"][:n].astype(np.float32)
    new = data["gloss.all-mpnet-base-v2"][:n].astype(np.float32)
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as http:
        gallery = http.post(
            "/v1/galleries",
            json={
                "name": "glosses",
                "dim": 384,
                "model_name": "all-MiniLM-L6-v2",
                "metric": "cosine",
            },
        )
        assert gallery.status_code == 201, gallery.text
        gallery_id = gallery.json()["id"]
        stored = http.post(
            f"/v1/galleries/{gallery_id}/vectors", json={"ids": ids, "vectors": old.tolist()}
        )
        assert stored.status_code == 200, stored.text
        dataset = http.post("/v1/datasets", json={"name": "mpnet", "gallery_id": gallery_id})
        assert dataset.status_code == 201, dataset.text
        dataset_id = dataset.json()["id"]
        items = http.post(
            f"/v1/datasets/{dataset_id}/items", json={"ids": ids, "features": new.tolist()}
        )
        assert items.status_code == 200, items.text
        job = http.post("/v1/upgrades", json={"dataset_id": dataset_id, "method": "procrustes"})
        assert job.status_code == 202, job.text
        job_id = job.json()["id"]
        deadline = time.monotonic() + 180
        while True:
            state = http.get(f"/v1/upgrades/{job_id}").json()
            if state["status"] in ("succeeded", "failed", "cancelled"):
                break
            if celery.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"job {state['status']}; worker log:\n{worker_log.read_text()}")
            time.sleep(0.5)
        assert state["status"] == "succeeded", (state, worker_log.read_text())
        assert state["attempts"] == 1
        assert "Task nobackfill.run_upgrade[" in worker_log.read_text()
        hits = http.post(
            f"/v1/galleries/{gallery_id}/search",
            json={"vectors": new[:5].tolist(), "k": 3, "model_id": state["model_id"]},
        )
        assert hits.status_code == 200, hits.text
        results = hits.json()["results"]
        assert len(results) == 5 and all(len(row) == 3 for row in results)
        for row in results:
            assert {hit["id"] for hit in row} <= set(ids)
            distances = [hit["distance"] for hit in row]
            assert distances == sorted(distances)
        return gallery_id
