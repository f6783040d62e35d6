"""No Docker engine runs here: the compose file is checked against the Compose specification,
the Dockerfile is linted, and every command they run must exist in the project."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from app.cli import build_parser
from app.core.settings import Settings

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    path = BIN / name if (BIN / name).exists() else shutil.which(name)
    assert path, f"{name} is installed with the dev extras"
    return str(path)


class ComposeLoader(yaml.SafeLoader):
    """Reads Compose's `!reset` / `!override` merge tags as plain values."""


ComposeLoader.add_constructor("!reset", lambda loader, node: None)
ComposeLoader.add_constructor("!override", lambda loader, node: loader.construct_object(node))


def compose(name: str = "docker-compose.yml") -> dict:
    return yaml.load((REPO / name).read_text(), Loader=ComposeLoader)


def test_compose_file_follows_the_compose_spec() -> None:
    done = subprocess.run(
        [tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", "docker-compose.yml"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_dockerfile_lints_clean() -> None:
    done = subprocess.run(
        [tool("hadolint"), "Dockerfile"], cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_services_and_gpu_request() -> None:
    services = compose()["services"]
    assert {"api", "worker", "redis", "postgres", "migrate"} <= set(services)
    [device] = services["worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    for name in ("api", "worker", "redis", "postgres"):
        assert "healthcheck" in services[name], name
    assert services["api"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    cpu = compose("docker-compose.cpu.yml")
    assert cpu == {"services": {"worker": {"deploy": None}}}


def project_commands() -> list[tuple[str, list[str]]]:
    services = compose()["services"]
    commands = [
        (name, s["command"])
        for name, s in services.items()
        if s.get("image", "").startswith("nobackfill")
    ]
    dockerfile = (REPO / "Dockerfile").read_text()
    for n, cmd in enumerate(re.findall(r"^CMD (\[.*\])$", dockerfile, flags=re.M)):
        commands.append((f"Dockerfile CMD {n}", yaml.safe_load(cmd)))
    return commands


def dockerfile_stages() -> dict[str, str]:
    """Each build stage's name and text."""
    text = (REPO / "Dockerfile").read_text()
    stages = re.findall(r"^FROM \S+ AS (\S+)\n(.*?)(?=^FROM |\Z)", text, flags=re.M | re.S)
    return dict(stages)


def test_api_and_worker_images_are_separate_build_targets() -> None:
    stages = dockerfile_stages()
    services = compose()["services"]
    assert services["api"]["build"]["target"] == "api"
    assert services["migrate"]["build"]["target"] == "api"
    assert services["worker"]["build"]["target"] == "worker"
    assert services["api"]["image"] != services["worker"]["image"]
    # The API image is CPU-only (torch's CPU index); the worker has CUDA torch and FAISS's GPU
    # build in place of faiss-cpu (both provide `faiss`).
    assert re.search(
        r'pip install "torch==2\.13\.0" --index-url "\$TORCH_CPU_INDEX_URL"', stages["api"]
    )
    assert "TORCH_CPU_INDEX_URL=" in stages["api"] and "/cpu" in stages["api"]
    assert "--index-url" not in stages["worker"]
    assert "pip uninstall -y faiss-cpu" in stages["worker"]
    assert re.search(r'pip install "faiss-gpu==[\d.]+"', stages["worker"])
    # The worker image's own command is compose's worker command.
    worker_cmd = re.search(r"^CMD (\[.*\])$", stages["worker"], flags=re.M)
    assert yaml.safe_load(worker_cmd.group(1)) == services["worker"]["command"]
    for stage in ("api", "worker"):
        assert "RUN pip install ." in stages[stage], stage


@pytest.mark.parametrize(("where", "command"), project_commands())
def test_commands_exist_in_the_project(where: str, command: list[str]) -> None:
    if command[0] == "nobackfill":
        scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
        assert scripts["nobackfill"] == "app.cli:main"
        build_parser().parse_args(command[1:])  # exits (fails the test) on an unknown argument
    else:
        assert command[:3] == ["celery", "-A", "worker.celery_app"], where
        done = subprocess.run(
            [tool("celery"), *command[1:], "--help"], cwd=REPO, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stdout + done.stderr
        queue = command[command.index("--queues") + 1]
        assert queue == Settings.model_fields["celery_queue"].default


def test_compose_environment_names_real_settings() -> None:
    fields = set(Settings.model_fields)
    for name, service in compose()["services"].items():
        for variable in service.get("environment", {}):
            if variable.startswith("NOBACKFILL_"):
                assert variable.removeprefix("NOBACKFILL_").lower() in fields, (name, variable)


def test_dockerfile_copies_existing_paths_and_healthz_exists() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    for line in re.findall(r"^COPY (.+)$", dockerfile, flags=re.M):
        for source in line.split()[:-1]:
            assert (REPO / source).exists(), source
    assert "torch==2.13.0" in dockerfile
    from app.main import create_app

    assert "/healthz" in create_app(Settings(_env_file=None)).openapi()["paths"]
