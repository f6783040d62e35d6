"""``nobackfill migrate GALLERY --model M [--auto | --fraction F]`` against a real server process
and a real embedder server process (issue 43, item 6): the whole migration on the server, the CLI
following the job with a progress bar on stderr and the job as JSON on stdout; ``--auto`` does
what the model's verdict says, and ``nobackfill migrate`` without a gallery is still the database
migration."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.client import Client
from app.client.commands import CommandError
from app.client.migration_commands import auto_fraction
from bench.common.embedder_server import running
from bench.common.service import BENCH_KEY, RunningService, start_service
from tests.service.test_cli import NEW, OLD, QUICK, cli

REPO = Path(__file__).resolve().parents[2]
TEXTS = json.loads((REPO / "tests/fixtures/wordnet_small_texts.json").read_text())
N = 200


@pytest.fixture(scope="module")
def embedder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running(tmp_path_factory.mktemp("embedder") / "embedder.log") as url:
        yield url


@pytest.fixture(scope="module")
def server(embedder: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningService]:
    env = {"NOBACKFILL_JOB_RUNNER": "thread", "NOBACKFILL_EMBEDDER_ALLOWED_URLS": embedder}
    service = start_service(tmp_path_factory.mktemp("cli") / "data", env, startup_timeout=120)
    yield service
    service.stop()


@pytest.fixture
def migration(server: RunningService, embedder: str, wordnet_small: dict, monkeypatch) -> dict:
    """A gallery of N old glosses with their texts, a quick procrustes model with the embedder."""
    monkeypatch.setenv("NOBACKFILL_URL", server.url)
    monkeypatch.setenv("NOBACKFILL_KEY", BENCH_KEY)
    ids, old, new = wordnet_small["synset_id"][:N], wordnet_small[OLD][:N], wordnet_small[NEW][:N]
    with Client(server.url, BENCH_KEY) as client:
        gallery = client.create_gallery(
            f"reembed-{uuid.uuid4().hex[:8]}",
            dim=old.shape[1],
            model_name="all-MiniLM-L6-v2",
            metric="cosine",
        )
        texts = [row["gloss"] for row in TEXTS[:N]]
        client.upload_vectors(gallery["id"], ids, old, texts=texts, resume=False)
        dataset = client.create_dataset(gallery["name"], gallery_id=gallery["id"])
        client.upload_items(dataset["id"], ids[: N // 2], new[: N // 2], resume=False)
        job = client.create_upgrade(dataset["id"], "procrustes", params=json.loads(QUICK))
        job = client.wait_upgrade(job["id"], poll_s=0.2, timeout_s=300)
        assert job["status"] == "succeeded", job["error"]
        registered = client.create_embedder(
            gallery["name"], embedder, "all-mpnet-base-v2", new.shape[1]
        )
        client.set_model_embedder(job["model_id"], registered["id"])
    return {"gallery": gallery["id"], "model": job["model_id"], "report": job["report"]}


def test_migrate_runs_the_job_on_the_server_and_follows_it(capsys, migration: dict) -> None:
    code, out, err = cli(
        capsys,
        "migrate",
        migration["gallery"],
        "--model",
        migration["model"],
        "--fraction",
        "0.5",
        "--poll",
        "0.2",
        "--json",
    )
    assert code == 0, err
    job = json.loads(out)
    assert job["status"] == "succeeded" and job["method"] == "reembed"
    assert job["report"]["reembed"]["embedded"] == N // 2
    code, out, err = cli(
        capsys, "migrate", migration["gallery"], "--model", migration["model"], "--poll", "0.2"
    )
    assert code == 0, err
    assert f"re-embedded now {N}/{N} (100%)" in out
    assert "re-embed rej_" in err  # the bar, on stderr
    progress = cli(capsys, "gallery", "get", migration["gallery"], "--json")[1]
    assert json.loads(progress)["reembedded"][0]["fraction"] == 1.0


def test_auto_follows_the_verdict(capsys, migration: dict) -> None:
    argv = ["migrate", migration["gallery"], "--model", migration["model"], "--auto"]
    try:
        share = auto_fraction(migration["report"])
    except CommandError as refused:
        code, _, err = cli(capsys, *argv, "--poll", "0.2")
        assert code == 1 and str(refused) in err and "Give --fraction" in err
        return
    code, out, err = cli(capsys, *argv, "--poll", "0.2", "--json")
    assert code == 0, err
    assert json.loads(out)["report"]["reembed"]["reembedded"] == round(share * N)


def test_auto_fraction_reads_the_verdict() -> None:
    transition = {"action": "transition", "suggested_fraction": 0.3, "why": "w"}
    assert auto_fraction({"recommendation": transition}) == 0.3
    assert auto_fraction({"recommendation": {"action": "reindex", "why": "w"}}) == 1.0
    for action in ("stay", "bridge", "two-stage", "measure"):
        with pytest.raises(CommandError, match=f"the verdict is {action}"):
            auto_fraction({"recommendation": {"action": action, "why": "w"}})
    with pytest.raises(CommandError, match="the verdict is missing"):
        auto_fraction(None)


def test_migrate_gallery_needs_a_model(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        cli(capsys, "migrate", "gal_x")
    assert exited.value.code == 2
    assert "--model" in capsys.readouterr().err
