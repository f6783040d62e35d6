"""No Docker engine runs here: the compose files are checked against the Compose specification,
the Dockerfile is linted, every command they run must exist in the project, and the project
`docker compose` builds from the base file and its overrides (CPU, Milvus) is checked by merging
them as Compose does."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from app.cli import build_parser
from app.core.settings import Settings

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
BASE = "docker-compose.yml"
CPU = "docker-compose.cpu.yml"
MILVUS = "docker-compose.milvus.yml"


def tool(name: str) -> str:
    path = BIN / name if (BIN / name).exists() else shutil.which(name)
    assert path, f"{name} is installed with the dev extras"
    return str(path)


class Reset:
    """Compose's `!reset`: the key is removed from what the earlier files set (distinct from a
    YAML null, which a declared volume such as `data:` is)."""

    def __repr__(self) -> str:
        return "!reset"


RESET = Reset()


class ComposeLoader(yaml.SafeLoader):
    """Reads Compose's `!reset` / `!override` merge tags."""


ComposeLoader.add_constructor("!reset", lambda loader, node: RESET)
ComposeLoader.add_constructor("!override", lambda loader, node: loader.construct_object(node))


def compose(name: str = BASE) -> dict:
    return yaml.load((REPO / name).read_text(), Loader=ComposeLoader)


def merge(base: object, override: object) -> object:
    """Compose's merge of a later file into an earlier one, for what these files use: mappings
    merge key by key, `!reset` removes a key, anything else replaces. Sequences (ports, volumes)
    have their own rules in Compose, so the overrides extend existing services only through
    mappings (test_milvus_file_leaves_the_plain_stack_alone holds that)."""
    if not (isinstance(base, dict) and isinstance(override, dict)):
        return copy.deepcopy(override)
    out = copy.deepcopy(base)
    for key, value in override.items():
        if value is RESET:
            out.pop(key, None)
        else:
            out[key] = merge(out[key], value) if key in out else copy.deepcopy(value)
    return out


def project(*names: str) -> dict:
    """What `docker compose -f NAME -f NAME … config` holds (before interpolation)."""
    merged: dict = {}
    for name in names:
        merged = merge(merged, compose(name))
    return merged


def interpolate(value: str) -> str:
    """Compose's `${VAR:-default}` with the variable unset."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", value)


def milvus_extra() -> list[str]:
    """The requirements of pyproject.toml's `milvus` extra."""
    project_table = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return project_table["optional-dependencies"]["milvus"]


@pytest.mark.parametrize("name", [BASE, MILVUS])
def test_compose_file_follows_the_compose_spec(name: str) -> None:
    done = subprocess.run(
        [tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", name],
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
    cpu = compose(CPU)["services"]
    assert cpu["worker"]["deploy"] is RESET
    assert set(cpu) == {"api", "migrate", "worker"}


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
    # Both install torch first, through the same line (test_torch_comes_from_...); the worker
    # has FAISS's GPU build in place of faiss-cpu (both provide `faiss`).
    for stage in ("api", "worker"):
        assert TORCH_LINE in stages[stage], stage
    assert "pip uninstall -y faiss-cpu" in stages["worker"]
    assert re.search(r'pip install "faiss-gpu==[\d.]+"', stages["worker"])
    # The worker image's own command is compose's worker command.
    worker_cmd = re.search(r"^CMD (\[.*\])$", stages["worker"], flags=re.M)
    assert yaml.safe_load(worker_cmd.group(1)) == services["worker"]["command"]
    # Both images carry the `milvus` extra: NOBACKFILL_VECTOR_ENGINE alone picks the engine.
    assert any(spec.startswith("pymilvus") for spec in milvus_extra())
    for stage in ("api", "worker"):
        assert 'RUN pip install ".[milvus]"' in stages[stage], stage


TORCH_LINE = 'RUN pip install "torch==2.13.0" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}'
CPU_WHEELS = "https://download.pytorch.org/whl/cpu"


def torch_install(env: dict[str, str]) -> list[str]:
    """The arguments the images' torch line gives pip under ``env`` (run by sh, as Docker's
    RUN does, with pip replaced by a printer)."""
    command = TORCH_LINE.removeprefix("RUN ").replace("pip install", "printf '%s\\n'", 1)
    done = subprocess.run(
        ["sh", "-c", command], env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.splitlines()


def test_torch_comes_from_the_registry_of_everything_else_unless_told() -> None:
    """Issue 44 item 8: by default torch comes from PIP_INDEX_URL, the registry every other
    package comes from (pip reads it from the environment: the base stage sets it from its build
    argument, PyPI by default); the CPU override names torch's CPU-wheel index for every image it
    builds, and only for torch."""
    base = dockerfile_stages()["base"]
    assert "ARG PIP_INDEX_URL=https://pypi.org/simple\n" in base
    assert "ARG TORCH_INDEX_URL=\n" in base
    assert "ENV PIP_INDEX_URL=$PIP_INDEX_URL" in base and "TORCH_INDEX_URL=$TORCH_INDEX_URL" in base
    assert torch_install({}) == ["torch==2.13.0"]
    assert torch_install({"TORCH_INDEX_URL": ""}) == ["torch==2.13.0"]
    assert torch_install({"TORCH_INDEX_URL": CPU_WHEELS}) == [
        "torch==2.13.0",
        "--index-url",
        CPU_WHEELS,
    ]
    services = compose()["services"]
    built = {name: s["build"] for name, s in services.items() if "build" in s}
    assert set(built) == {"api", "migrate", "worker"}
    for name, build in built.items():
        args = {k: interpolate(v) for k, v in build["args"].items()}
        assert args == {"PIP_INDEX_URL": "https://pypi.org/simple", "TORCH_INDEX_URL": ""}, name
    cpu = project(BASE, CPU)["services"]
    for name in built:
        assert cpu[name]["build"]["args"]["TORCH_INDEX_URL"] == CPU_WHEELS, name
        assert cpu[name]["build"]["args"]["PIP_INDEX_URL"] == built[name]["args"]["PIP_INDEX_URL"]
        assert cpu[name]["build"]["target"] == built[name]["target"], name


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


@pytest.mark.parametrize("files", [(BASE,), (BASE, MILVUS)])
def test_compose_environment_names_real_settings(files: tuple[str, ...]) -> None:
    fields = set(Settings.model_fields)
    for name, service in project(*files)["services"].items():
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


def added_by_milvus() -> dict[str, dict]:
    """The services docker-compose.milvus.yml adds (Milvus and what it stores into)."""
    base = compose()["services"]
    return {n: s for n, s in compose(MILVUS)["services"].items() if n not in base}


def test_milvus_services_are_pinned_healthchecked_and_keep_data_in_named_volumes() -> None:
    override = compose(MILVUS)
    added = added_by_milvus()
    kinds = {s["image"].rpartition(":")[0].rsplit("/", 1)[-1]: n for n, s in added.items()}
    assert set(kinds) == {"etcd", "minio", "milvus"}
    for name, service in added.items():
        repository, _, tag = service["image"].rpartition(":")
        assert repository and tag and tag != "latest", name
        assert service["healthcheck"]["test"][0] == "CMD", name
        for volume in service["volumes"]:
            source, target = volume.split(":")[:2]
            # A named volume declared by the file, not a host path.
            assert source in override["volumes"], (name, volume)
            assert target.startswith("/"), (name, volume)
    milvus = added[kinds["milvus"]]
    assert milvus["depends_on"] == {
        kinds["etcd"]: {"condition": "service_healthy"},
        kinds["minio"]: {"condition": "service_healthy"},
    }
    env = {k: interpolate(str(v)) for k, v in milvus["environment"].items()}
    assert env["ETCD_ENDPOINTS"].split(":")[0] == kinds["etcd"]
    assert env["MINIO_ADDRESS"].split(":")[0] == kinds["minio"]
    minio_env = {k: interpolate(str(v)) for k, v in added[kinds["minio"]]["environment"].items()}
    assert env["MINIO_ACCESS_KEY_ID"] == minio_env["MINIO_ACCESS_KEY"]
    assert env["MINIO_SECRET_ACCESS_KEY"] == minio_env["MINIO_SECRET_KEY"]
    # The server is of the line whose client the `milvus` extra pins (pymilvus N.x ↔ Milvus N.x).
    [client] = [spec for spec in milvus_extra() if spec.startswith("pymilvus")]
    major = re.search(r">=(\d+)\.", client).group(1)
    assert milvus["image"].rpartition(":")[2].startswith(f"v{major}."), (milvus["image"], client)


def test_api_and_worker_use_the_milvus_service_when_the_file_is_on() -> None:
    services = project(BASE, MILVUS)["services"]
    for name in ("api", "worker"):
        env = {k: interpolate(str(v)) for k, v in services[name]["environment"].items()}
        settings = Settings(
            _env_file=None,
            vector_engine=env["NOBACKFILL_VECTOR_ENGINE"],
            milvus_uri=env["NOBACKFILL_MILVUS_URI"],
            milvus_token=env["NOBACKFILL_MILVUS_TOKEN"],
        )
        assert settings.vector_engine == "milvus", name
        uri = urlsplit(settings.resolved_milvus_uri)
        target = services[uri.hostname]
        assert target["image"].startswith("milvusdb/milvus:"), name
        container_ports = {int(str(port).rsplit(":", 1)[-1]) for port in target["ports"]}
        assert uri.port in container_ports, (name, uri.port, container_ports)
        assert services[name]["depends_on"][uri.hostname] == {"condition": "service_healthy"}
    # Every volume a service mounts by name is declared.
    merged = project(BASE, MILVUS)
    for name, service in merged["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if not source.startswith((".", "/", "~")):
                assert source in merged["volumes"], (name, volume)


def test_milvus_file_leaves_the_plain_stack_alone() -> None:
    base = compose()
    override = compose(MILVUS)["services"]
    # Without the file: no Milvus service, no engine setting, so the default engine (faiss).
    assert Settings.model_fields["vector_engine"].default == "faiss"
    for name, service in base["services"].items():
        assert "milvus" not in service["image"], name
        for variable in service.get("environment", {}):
            assert "MILVUS" not in variable and "VECTOR_ENGINE" not in variable, (name, variable)
    # With it: the existing services are extended only through mappings (which Compose merges
    # key by key), only api and worker, only by keys they did not have.
    assert set(override) & set(base["services"]) == {"api", "worker"}
    with_milvus = project(BASE, MILVUS)["services"]
    for name, service in base["services"].items():
        got = copy.deepcopy(with_milvus[name])
        for key, added in override.get(name, {}).items():
            assert isinstance(added, dict), (name, key)
            assert not set(added) & set(service.get(key, {})), (name, key)
            for item in added:
                del got[key][item]
        assert got == service, name


def test_cpu_and_milvus_files_combine_in_either_order() -> None:
    one = project(BASE, CPU, MILVUS)
    other = project(BASE, MILVUS, CPU)
    assert one == other
    worker = one["services"]["worker"]
    assert "deploy" not in worker
    assert worker["environment"] == project(BASE, MILVUS)["services"]["worker"]["environment"]
    assert one["services"].keys() == project(BASE, MILVUS)["services"].keys()


def test_documented_compose_commands_name_existing_files() -> None:
    readme = (REPO / "README.md").read_text()
    documented = set(re.findall(r"-f (docker-compose[\w.]*\.yml)", readme))
    assert {BASE, CPU, MILVUS} <= documented
    for name in [BASE, CPU, MILVUS]:
        header = (REPO / name).read_text()
        documented |= set(re.findall(r"-f (docker-compose[\w.]*\.yml)", header))
    for name in documented:
        assert (REPO / name).exists(), name


def test_qdrant_server_is_an_opt_in_profile_pinned_to_a_compatible_version() -> None:
    """`docker compose --profile qdrant up` adds a Qdrant server for attached galleries; the
    plain `up` starts nothing new. Its tag is pinned, and close to the client the service
    installs (qdrant-client warns past one minor version apart)."""
    services = compose()["services"]
    qdrant = services["qdrant"]
    assert qdrant["profiles"] == ["qdrant"]
    assert all("profiles" not in s for n, s in services.items() if n != "qdrant")
    repository, _, tag = qdrant["image"].rpartition(":")
    assert repository == "qdrant/qdrant" and re.fullmatch(r"v\d+\.\d+\.\d+", tag), tag
    volume = qdrant["volumes"][0].split(":")[0]
    assert volume in compose()["volumes"]
    from importlib.metadata import version

    client_minor = tuple(int(p) for p in version("qdrant-client").split(".")[:2])
    server_minor = tuple(int(p) for p in tag[1:].split(".")[:2])
    assert client_minor[0] == server_minor[0] and abs(client_minor[1] - server_minor[1]) <= 2
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(d.startswith("qdrant-client") for d in dependencies)


def test_api_and_worker_may_attach_the_qdrant_profiles_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The profile's server is allowed by default (the service allows none unless told), and
    the value, read from the environment as compose passes it, parses as the setting."""
    from app.core.settings import Settings
    from app.vectors.qdrant.source import allowed_url

    services = compose()["services"]
    for name in ("api", "worker"):
        value = interpolate(str(services[name]["environment"]["NOBACKFILL_QDRANT_ALLOWED_URLS"]))
        monkeypatch.setenv("NOBACKFILL_QDRANT_ALLOWED_URLS", value)
        settings = Settings(_env_file=None)
        allowed_url(settings, "http://qdrant:6333")


@pytest.mark.parametrize(
    "value",
    [
        "http://a:6333,https://b.example/qdrant",
        " http://a:6333 , https://b.example/qdrant ",
        '["http://a:6333", "https://b.example/qdrant"]',
    ],
)
def test_qdrant_allowed_urls_read_from_a_comma_list_or_json(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """An operator writes the allowlist as `a,b` or as a JSON list; both give the same list."""
    from app.core.settings import Settings

    monkeypatch.setenv("NOBACKFILL_QDRANT_ALLOWED_URLS", value)
    assert Settings(_env_file=None).qdrant_allowed_urls == [
        "http://a:6333",
        "https://b.example/qdrant",
    ]


def test_the_api_host_port_comes_from_a_variable() -> None:
    """Issue 44 item 8: the API port was fixed at 8000 in the file and collided with an existing
    service. NOBACKFILL_API_PORT picks the host port (8000 by default); the container listens
    on 8000 as its command says."""
    api = compose()["services"]["api"]
    (port,) = api["ports"]
    assert port == "127.0.0.1:${NOBACKFILL_API_PORT:-8000}:8000"
    assert interpolate(port) == "127.0.0.1:8000:8000"
    assert api["command"][-1] == "8000"
