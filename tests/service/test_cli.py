"""``nobackfill``'s client commands against a real server process (uvicorn, embedded SQLite,
thread runner, small request limits): the README's CLI walk-through on real WordNet vectors,
resume after an interruption, and bad input (a readable error, exit 1, nothing changed).

Commands run in-process through ``app.cli.main`` (capsys) and, where said, as a real
``python -m app.cli`` subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from app.cli import main
from app.client.commands import with_ids
from bench.common.service import BENCH_KEY, RunningService, start_service
from bench.common.wordnet import REPO_ROOT

OLD, NEW = "gloss.all-MiniLM-L6-v2", "gloss.all-mpnet-base-v2"
QUICK = '{"epochs": 2, "hidden_dim": 32}'


@pytest.fixture(scope="module", params=["faiss", "milvus"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningService]:
    """One server per vector engine (SQLite: the CLI's commands do not depend on the backend)."""
    env = {
        "NOBACKFILL_VECTOR_ENGINE": request.param,
        "NOBACKFILL_JOB_RUNNER": "thread",
        "NOBACKFILL_MAX_VECTORS_PER_REQUEST": "300",
        "NOBACKFILL_MAX_REQUEST_BYTES": str(512 * 1024),
    }
    service = start_service(tmp_path_factory.mktemp("cli") / "data", env, startup_timeout=120)
    yield service
    service.stop()


@pytest.fixture(autouse=True)
def environment(
    server: RunningService, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> dict[str, str]:
    """The CLI's settings as a user sets them: NOBACKFILL_URL and NOBACKFILL_KEY."""
    values = {
        "NOBACKFILL_URL": server.url,
        "NOBACKFILL_KEY": BENCH_KEY,
        "NOBACKFILL_CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    return values


def cli(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    """Run ``nobackfill ARGV`` in-process: (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def cli_json(capsys: pytest.CaptureFixture, *argv: str) -> dict:
    code, out, err = cli(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def subprocess_cli(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *argv],
        cwd=REPO_ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def save(path: Path, array: np.ndarray) -> str:
    np.save(path, array, allow_pickle=False)
    return str(path)


def require_route(server: RunningService, path: str) -> None:
    """Fail, never skip, when the server does not serve ``path``: a missing endpoint is a bug."""
    paths = httpx.get(f"{server.url}/openapi.json", timeout=30).json()["paths"]
    assert path in paths, f"{path} is not served"


def gallery_count(server: RunningService, gallery_id: str) -> int:
    with server.client() as client:
        return client.get(f"/v1/galleries/{gallery_id}").json()["count"]


def test_walkthrough_on_wordnet(
    server: RunningService,
    capsys: pytest.CaptureFixture,
    tmp_path: Path,
    wordnet_small: dict,
    environment: dict[str, str],
) -> None:
    """The README's CLI walk-through, with its .npy files cut from real embeddings."""
    ids, labels = wordnet_small["synset_id"], wordnet_small["label"]
    old, new = wordnet_small[OLD], wordnet_small[NEW]
    train, held_out = slice(0, 600), slice(600, 800)
    files = {
        "ids": save(tmp_path / "ids.npy", ids),
        "labels": save(tmp_path / "labels.npy", labels),
        "old": save(tmp_path / "old_vectors.npy", old),
        "train_ids": save(tmp_path / "train_ids.npy", ids[train]),
        "new": save(tmp_path / "new_features.npy", new[train]),
        "queries": save(tmp_path / "queries.npy", new[held_out]),
    }

    # A real process, as a user types it (the key and URL from the environment).
    done = subprocess_cli(
        environment,
        "gallery", "create", "--name", "wordnet", "--dim", str(old.shape[1]),
        "--model-name", "all-MiniLM-L6-v2", "--metric", "cosine", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    gallery = json.loads(done.stdout)
    assert gallery["dim"] == old.shape[1] and gallery["count"] == 0

    uploaded = cli_json(
        capsys, "gallery", "upload", gallery["id"],
        "--ids", files["ids"], "--vectors", files["old"], "--labels", files["labels"],
    )  # fmt: skip
    assert uploaded["count"] == uploaded["upserted"] == len(ids)
    assert uploaded["batches"] >= 3  # 800 rows of 384 floats under a 512 KiB request limit

    dataset = cli_json(capsys, "dataset", "create", "--name", "mpnet", "--gallery", gallery["id"])
    items = cli_json(
        capsys, "dataset", "upload", dataset["id"],
        "--ids", files["train_ids"], "--features", files["new"],
    )  # fmt: skip
    assert items["count"] == 600

    code, out, err = cli(
        capsys, "upgrade", "--dataset", dataset["id"], "--method", "procrustes",
        "--params", QUICK, "--wait", "--poll", "0.2", "--json",
    )  # fmt: skip
    assert code == 0, err
    job = json.loads(out)
    assert job["status"] == "succeeded" and job["model_id"], job
    assert f"upgrade {job['id']}" in err  # the progress bar, on stderr

    # Held-out items' new-backbone features search the old gallery through the model.
    results = tmp_path / "results.npz"
    code, out, err = cli(
        capsys, "search", gallery["id"], "--queries", files["queries"], "--k", "10",
        "--model", job["model_id"], "-o", str(results),
    )  # fmt: skip
    assert code == 0, err
    with np.load(results) as found:
        assert found["ids"].shape == found["distances"].shape == (200, 10)
        recall = np.mean([ids[600 + i] in found["ids"][i] for i in range(200)])
    assert recall > 0.9, recall
    hits = cli_json(
        capsys, "search", gallery["id"], "--queries", files["queries"], "--k", "3",
        "--model", job["model_id"],
    )  # fmt: skip
    assert len(hits["results"]) == 200 and all(len(row) == 3 for row in hits["results"])
    # A transition search (both models' query vectors): nothing is re-embedded yet, so it is the
    # old model's own search of the old queries.
    files["old_queries"] = save(tmp_path / "old_queries.npy", old[held_out])
    transition = cli_json(
        capsys, "search", gallery["id"], "--queries", files["queries"], "--k", "5",
        "--model", job["model_id"], "--old-queries", files["old_queries"],
    )  # fmt: skip
    stay = cli_json(capsys, "search", gallery["id"], "--queries", files["old_queries"], "--k", "5")
    assert [[h["id"] for h in r] for r in transition["results"]] == [
        [h["id"] for h in r] for r in stay["results"]
    ]
    assert {h["space"] for r in transition["results"] for h in r} == {"old"}
    # Every item re-embedded (resumable batches, like any upload): the new model's own ranking.
    files["all_new"] = save(tmp_path / "all_new.npy", new)
    reembedded = cli_json(
        capsys, "gallery", "upload", gallery["id"], "--ids", files["ids"],
        "--features", files["all_new"], "--model", job["model_id"],
    )  # fmt: skip
    assert reembedded["upserted"] == len(ids) and reembedded["batches"] >= 2
    shown = cli_json(capsys, "gallery", "get", gallery["id"])
    assert shown["reembedded"][0]["reembedded"] == len(ids)
    full = cli_json(
        capsys, "search", gallery["id"], "--queries", files["queries"], "--k", "5",
        "--model", job["model_id"], "--old-queries", files["old_queries"],
    )  # fmt: skip
    docs = new / np.linalg.norm(new, axis=1, keepdims=True)
    held = new[held_out] / np.linalg.norm(new[held_out], axis=1, keepdims=True)
    expected = [[str(ids[i]) for i in np.argsort(-row)[:5]] for row in held @ docs.T]
    assert [[h["id"] for h in r] for r in full["results"]] == expected
    assert {h["space"] for r in full["results"] for h in r} == {"new"}

    code, out, _ = cli(capsys, "status", job["id"])
    assert code == 0 and job["model_id"] in out and "procrustes" in out
    verdict = job["report"]["recommendation"]
    # The next step is a command to paste: this job's ids stand for GALLERY / MODEL / DATASET.
    step = with_ids(verdict["next_step"], job)
    assert f"verdict: {verdict['action']}" in out and f"next step: {step}" in out
    assert "GALLERY" not in step and "MODEL " not in step and "DATASET" not in step
    code, out, _ = cli(capsys, "methods")
    assert code == 0 and "hbct" in out and "procrustes" in out


def test_client_commands_do_not_import_torch(environment: dict[str, str]) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from app.cli import main; code = main(['methods', '--json']); "
            "assert 'torch' not in sys.modules and 'sqlalchemy' not in sys.modules; "
            "raise SystemExit(code)",
        ],
        cwd=REPO_ROOT,
        env={**os.environ, **environment},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "procrustes" in json.loads(done.stdout)["backbone"]


def make_gallery(capsys: pytest.CaptureFixture, dim: int, name: str) -> str:
    return cli_json(
        capsys, "gallery", "create", "--name", name, "--dim", str(dim),
        "--model-name", "m", "--metric", "cosine",
    )["id"]  # fmt: skip


class FailingTransport:
    """Patched over httpx's transport: counts upload batches, and from the ``fail_from``-th on
    fails each before it is sent, as a dropped connection does (retries included)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fail_from: int | None = None) -> None:
        self.fail_from = fail_from
        self.batches = 0
        real = httpx.HTTPTransport.handle_request

        def handle_request(transport: httpx.HTTPTransport, request: httpx.Request):
            if request.method == "POST" and request.url.path.endswith("/vectors"):
                self.batches += 1
                if self.fail_from is not None and self.batches >= self.fail_from:
                    raise httpx.ConnectError("connection reset (injected)", request=request)
            return real(transport, request)

        monkeypatch.setattr(httpx.HTTPTransport, "handle_request", handle_request)


def test_an_interrupted_upload_resumes(
    server: RunningService,
    capsys: pytest.CaptureFixture,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gallery_id = make_gallery(capsys, 8, "resume")
    ids = save(tmp_path / "ids.npy", np.array([f"v{i}" for i in range(500)]))
    vectors = save(
        tmp_path / "v.npy", np.random.default_rng(0).normal(size=(500, 8)).astype(np.float32)
    )
    upload = ("gallery", "upload", gallery_id, "--ids", ids, "--vectors", vectors)
    upload += ("--batch-size", "100")

    with monkeypatch.context() as patched:
        FailingTransport(patched, fail_from=3)
        code, out, err = cli(capsys, *upload)
    assert code == 1
    assert "interrupted after 200 of 500 rows" in err and "rerun" in err
    assert gallery_count(server, gallery_id) == 200

    with monkeypatch.context() as patched:
        rerun = FailingTransport(patched)
        code, out, err = cli(capsys, *upload, "--json")
    assert code == 0, err
    assert json.loads(out) == {"upserted": 300, "count": 500, "batches": 3, "resumed_from": 200}
    assert rerun.batches == 3  # the two acknowledged batches were not sent again
    assert gallery_count(server, gallery_id) == 500


def test_bad_input_fails_readably_and_changes_nothing(
    server: RunningService, capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    gallery_id = make_gallery(capsys, 4, "bad-input")
    ids = save(tmp_path / "ids.npy", np.array(["a", "b", "c"]))
    good = save(tmp_path / "good.npy", np.eye(3, 4, dtype=np.float32))
    cases = {
        "missing file": (
            ("--ids", str(tmp_path / "nope.npy"), "--vectors", good),
            "--ids " + str(tmp_path / "nope.npy") + ": no such file",
        ),
        "int vectors": (
            ("--ids", ids, "--vectors", save(tmp_path / "int.npy", np.ones((3, 4), np.int64))),
            "vectors: expected float16/32/64, got dtype int64",
        ),
        "float ids": (
            ("--ids", save(tmp_path / "fids.npy", np.arange(3.0)), "--vectors", good),
            "ids: expected strings, got dtype float64",
        ),
        "object array": (
            ("--ids", ids, "--vectors", str(tmp_path / "object.npy")),
            "not a readable .npy array",
        ),
        "wrong dim": (
            ("--ids", ids, "--vectors", save(tmp_path / "d5.npy", np.ones((3, 5), np.float32))),
            "vectors: 5 columns, but gallery",
        ),
        "not .npy": (
            ("--ids", ids, "--vectors", str(tmp_path / "text.npy")),
            "not a .npy file (save the array with numpy.save",
        ),
        # Issue 44 item 6: a CSV said "pickled (object) data … allow_pickle".
        "csv": (
            ("--ids", ids, "--vectors", str(tmp_path / "vectors.csv")),
            "vectors.csv: not a .npy file",
        ),
    }
    (tmp_path / "vectors.csv").write_text("0.1,0.2,0.3,0.4\n" * 3)
    np.save(tmp_path / "object.npy", np.array([{"a": 1}] * 3, dtype=object), allow_pickle=True)
    (tmp_path / "text.npy").write_text("1,2,3,4\n")
    for name, (options, message) in cases.items():
        code, out, err = cli(capsys, "gallery", "upload", gallery_id, *options)
        assert code == 1, name
        assert err.startswith("error: ") and message in err, (name, err)
        assert out == ""
        assert "Traceback" not in err
    assert gallery_count(server, gallery_id) == 0

    # The server's 422: its problem detail and the field, on stderr; nothing stored.
    long_ids = save(tmp_path / "long.npy", np.array(["x" * 300, "b", "c"]))
    code, out, err = cli(
        capsys, "gallery", "upload", gallery_id, "--ids", long_ids, "--vectors", good
    )
    assert code == 1
    assert "Invalid request (422)" in err and "ids[0]" in err
    assert gallery_count(server, gallery_id) == 0

    code, out, err = cli(capsys, "gallery", "create", "--name", "zero", "--dim", "0",
                         "--model-name", "m", "--metric", "cosine")  # fmt: skip
    assert code == 1 and "Invalid request (422)" in err and "dim" in err
    code, out, err = cli(capsys, "upgrade", "--dataset", "ds_missing", "--method", "procrustes")
    assert code == 1 and "Not found (404)" in err and "ds_missing" in err
    code, out, err = cli(capsys, "upgrade", "--dataset", "ds_x", "--params", "{not json")
    assert code == 1 and "--params: not valid JSON" in err
    code, out, err = cli(capsys, "--key", "nbk_wrong_" + "k" * 32, "gallery", "get", gallery_id)
    assert code == 1 and "Unauthorized (401)" in err and "--key" in err
    code, out, err = cli(capsys, "search", gallery_id, "--queries", good, "--k", "100000")
    assert code == 1 and "422" in err and "k" in err
    code, out, err = cli(capsys, "search", gallery_id, "--queries", good, "--old-queries", good)
    assert code == 1 and "--old-queries: a transition search needs --model too" in err


def test_cannot_reach_the_server(capsys: pytest.CaptureFixture) -> None:
    code, _, err = cli(capsys, "--url", "http://127.0.0.1:9", "methods")
    assert code == 1 and "cannot reach http://127.0.0.1:9" in err


def test_wait_exits_non_zero_for_a_job_that_does_not_succeed(
    server: RunningService, capsys: pytest.CaptureFixture, tmp_path: Path, wordnet_small: dict
) -> None:
    ids, old, new = (
        wordnet_small["synset_id"][:100],
        wordnet_small[OLD][:100],
        wordnet_small[NEW][:100],
    )
    gallery_id = make_gallery(capsys, old.shape[1], "to-cancel")
    id_file = save(tmp_path / "ids.npy", ids)
    cli_json(capsys, "gallery", "upload", gallery_id, "--ids", id_file,
             "--vectors", save(tmp_path / "old.npy", old))  # fmt: skip
    dataset = cli_json(capsys, "dataset", "create", "--name", "c", "--gallery", gallery_id)
    cli_json(capsys, "dataset", "upload", dataset["id"], "--ids", id_file,
             "--features", save(tmp_path / "new.npy", new))  # fmt: skip
    job = cli_json(capsys, "upgrade", "--dataset", dataset["id"], "--method", "hbct",
                   "--params", '{"epochs": 1000, "hidden_dim": 32}')  # fmt: skip
    assert job["status"] in ("queued", "running") and job["model_id"] is None
    cancelled = cli_json(capsys, "cancel", job["id"])
    assert cancelled["cancel_requested"] or cancelled["status"] == "cancelled"
    code, out, err = cli(capsys, "status", job["id"], "--wait", "--poll", "0.2", "--json")
    assert code == 1
    assert json.loads(out)["status"] == "cancelled"
    assert f"upgrade {job['id']} cancelled" in err


@pytest.fixture(scope="module")
def trained(server: RunningService, wordnet_small: dict) -> tuple[str, str]:
    """(upgrade id, model id) of a quick procrustes upgrade, set up through the Python client."""
    from app.client import Client

    ids, old, new = wordnet_small["synset_id"], wordnet_small[OLD], wordnet_small[NEW]
    with Client(server.url, BENCH_KEY) as client:
        gallery = client.create_gallery(
            "trained", dim=old.shape[1], model_name="all-MiniLM-L6-v2", metric="cosine"
        )
        client.upload_vectors(gallery["id"], ids, old, resume=False)
        dataset = client.create_dataset("trained", gallery_id=gallery["id"])
        client.upload_items(dataset["id"], ids[:400], new[:400], resume=False)
        job = client.create_upgrade(dataset["id"], "procrustes", params=json.loads(QUICK))
        job = client.wait_upgrade(job["id"], poll_s=0.2, timeout_s=300)
    assert job["status"] == "succeeded", job["error"]
    return job["id"], job["model_id"]


def test_export_command(
    server: RunningService,
    capsys: pytest.CaptureFixture,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    require_route(server, "/v1/models/{model_id}/export")
    trained = request.getfixturevalue("trained")
    exported = tmp_path / "model.zip"
    code, out, err = cli(capsys, "export", trained[1], "--format", "onnx", "-o", str(exported))
    assert code == 0, err
    assert str(exported) in out
    with zipfile.ZipFile(exported) as archive:
        manifest = json.loads(archive.read("manifest.json"))
        assert any(name.endswith(".onnx") for name in archive.namelist())
    space = manifest["space"]  # the old space the graph's outputs search
    assert space["metric"] == "cosine" and space["model_name"] == "all-MiniLM-L6-v2"
    assert manifest["search"]["kind"] == "cosine"
    code, _, err = cli(capsys, "export", "mdl_missing", "-o", str(tmp_path / "none.zip"))
    assert code == 1 and "404" in err
    assert not (tmp_path / "none.zip").exists()


def test_report_command(
    server: RunningService,
    capsys: pytest.CaptureFixture,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    require_route(server, "/v1/upgrades/{upgrade_id}/report.html")
    trained = request.getfixturevalue("trained")
    page = tmp_path / "report.html"
    code, _, err = cli(capsys, "report", trained[0], "-o", str(page))
    assert code == 0, err
    assert "<html" in page.read_text().lower()
    code, _, err = cli(capsys, "report", "upg_missing", "-o", str(tmp_path / "none.html"))
    assert code == 1 and "404" in err
    assert not (tmp_path / "none.html").exists()


def test_download_failures_leave_no_file(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    """Whatever this build serves: an unknown model is a 404 and no file is written."""
    target = tmp_path / "out.zip"
    code, _, err = cli(capsys, "export", "mdl_missing", "-o", str(target))
    assert code == 1 and "(404)" in err
    assert list(tmp_path.iterdir()) == []


def test_queries_command(
    server: RunningService, capsys: pytest.CaptureFixture, tmp_path: Path, wordnet_small: dict
) -> None:
    require_route(server, "/v1/datasets/{dataset_id}/queries")
    ids, old, new = wordnet_small["synset_id"], wordnet_small[OLD], wordnet_small[NEW]
    gallery_id = make_gallery(capsys, old.shape[1], "queries")
    cli_json(capsys, "gallery", "upload", gallery_id, "--ids", save(tmp_path / "ids.npy", ids),
             "--vectors", save(tmp_path / "old.npy", old))  # fmt: skip
    dataset = cli_json(capsys, "dataset", "create", "--name", "q", "--gallery", gallery_id)
    query_ids = np.array([f"q{i}" for i in range(50)])
    relevant = tmp_path / "relevant.json"
    relevant.write_text(json.dumps({q: [str(ids[i])] for i, q in enumerate(query_ids)}))
    result = cli_json(
        capsys, "dataset", "queries", dataset["id"],
        "--ids", save(tmp_path / "qids.npy", query_ids),
        "--features", save(tmp_path / "qf.npy", new[:50]),
        "--old-vectors", save(tmp_path / "qo.npy", old[:50]),
        "--relevant", str(relevant),
    )  # fmt: skip
    assert result["upserted"] == 50
    relevant.write_text(json.dumps({"q0": ["x"]}))
    code, _, err = cli(
        capsys, "dataset", "queries", dataset["id"],
        "--ids", str(tmp_path / "qids.npy"), "--features", str(tmp_path / "qf.npy"),
        "--relevant", str(relevant),
    )  # fmt: skip
    assert code == 1 and "no entry for queries" in err


def test_key_commands(
    server: RunningService, capsys: pytest.CaptureFixture, environment: dict[str, str]
) -> None:
    """``nobackfill key create|list|revoke`` with the server's admin (bootstrap) key: the secret
    is printed once, by create; a revoked key is refused at once. Last in this file: its final
    step tries to revoke the bootstrap key, which the server must refuse (the last admin key)."""
    # A real process, as a user types it: the key on stdout, once.
    done = subprocess_cli(environment, "key", "create", "--name", "ci")
    assert done.returncode == 0, done.stderr
    key = next(
        line.split(": ", 1)[1] for line in done.stdout.splitlines() if line.startswith("API key:")
    )
    assert key.startswith("nbk_") and done.stdout.count(key) == 1

    created = cli_json(capsys, "key", "create", "--name", "ops", "--admin")
    assert created["admin"] is True and created["name"] == "ops"
    assert created["key"].startswith("nbk_") and created["prefix"] == created["key"][:8]

    listing = cli_json(capsys, "key", "list")
    by_name = {k["name"]: k for k in listing["items"]}
    assert {"bootstrap", "ci", "ops"} <= set(by_name)
    assert by_name["ci"]["admin"] is False and by_name["bootstrap"]["admin"] is True
    assert all("key" not in k for k in listing["items"])
    code, out, err = cli(capsys, "key", "list")
    assert code == 0, err
    assert key not in out and created["key"] not in out
    assert by_name["ci"]["id"] in out and by_name["ci"]["prefix"] in out and "admin" in out

    # A non-admin key reaches its tenant's data, not its keys.
    code, out, err = cli(capsys, "--key", key, "key", "list")
    assert code == 1 and "(403)" in err and out == ""
    code, out, err = cli(capsys, "--key", key, "methods")
    assert code == 0, err

    code, out, err = cli(capsys, "key", "revoke", by_name["ci"]["id"])
    assert code == 0, err
    assert by_name["ci"]["id"] in out and "revoked" in out
    code, out, err = cli(capsys, "--key", key, "methods")
    assert code == 1 and "Unauthorized (401)" in err
    assert by_name["ci"]["id"] not in {k["id"] for k in cli_json(capsys, "key", "list")["items"]}
    everything = cli_json(capsys, "key", "list", "--all")["items"]
    assert next(k for k in everything if k["id"] == by_name["ci"]["id"])["revoked_at"]
    revoked = cli_json(capsys, "key", "revoke", by_name["ci"]["id"])  # idempotent
    assert revoked == {"id": by_name["ci"]["id"], "revoked": True}

    code, out, err = cli(capsys, "key", "revoke", "key_missing")
    assert code == 1 and "Not found (404)" in err
    # The bootstrap key is the last admin once ops is revoked: refused, and it keeps working.
    assert cli_json(capsys, "--key", created["key"], "key", "revoke", created["id"])["revoked"]
    code, out, err = cli(capsys, "key", "revoke", by_name["bootstrap"]["id"])
    assert code == 1 and "Conflict (409)" in err and "admin" in err
    assert cli(capsys, "key", "list")[0] == 0


def test_access_upload_command(
    server: RunningService, capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    """``nobackfill access upload``: counts from .npy files, in batches under the server's row
    limit (300), a repeated id summed; bad input fails readably and counts nothing."""
    gallery_id = make_gallery(capsys, 4, "access")
    ids = np.array([f"item-{i}" for i in range(400)])
    vectors = np.random.default_rng(0).normal(size=(400, 4)).astype(np.float32)
    code, _, err = cli(capsys, "gallery", "upload", gallery_id, "--ids",
                       save(tmp_path / "ids.npy", ids), "--vectors",
                       save(tmp_path / "v.npy", vectors))  # fmt: skip
    assert code == 0, err
    clicked = save(tmp_path / "clicked.npy", np.concatenate([ids, ids[:50]]))
    counts = save(tmp_path / "counts.npy", np.ones(450, dtype=np.int32))
    result = cli_json(capsys, "access", "upload", gallery_id, "--ids", clicked, "--counts", counts)
    assert result == {
        "added": 450,
        "rows": 450,
        "batches": 2,
        "counted_items": 400,
        "total": 450,
    }
    code, out, err = cli(capsys, "access", "upload", gallery_id, "--ids", clicked,
                         "--counts", counts)  # fmt: skip
    assert code == 0, err
    assert "added 450" in out and "900" in out

    with server.client() as client:
        before = client.get(f"/v1/galleries/{gallery_id}/access", params={"limit": 200}).json()
    assert before["total"] == 900 and before["items"][0] == {"id": "item-0", "count": 4}
    unknown = save(tmp_path / "unknown.npy", np.array(["item-1", "nope"]))
    two = save(tmp_path / "two.npy", np.array([1, 1]))
    code, out, err = cli(capsys, "access", "upload", gallery_id, "--ids", unknown,
                         "--counts", two)  # fmt: skip
    assert code == 1 and "Invalid request (422)" in err and "nope" in err and out == ""
    floats = save(tmp_path / "floats.npy", np.array([1.0, 2.0]))
    code, out, err = cli(capsys, "access", "upload", gallery_id, "--ids", unknown,
                         "--counts", floats)  # fmt: skip
    assert code == 1 and "counts: expected a 1-D integer array" in err
    with server.client() as client:
        after = client.get(f"/v1/galleries/{gallery_id}/access", params={"limit": 200}).json()
    assert after == before


def test_list_commands_and_texts_upload(
    server: RunningService, capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    """``gallery list`` / ``dataset list`` / ``model list`` (issue 44 item 6: the client had them,
    the CLI did not) and ``gallery upload --texts`` (issue 43 item 2): the texts are stored with
    their items, a wrong count fails before anything is sent."""
    gallery_id = make_gallery(capsys, 4, "listed")
    listed = cli_json(capsys, "gallery", "list")["items"]
    assert gallery_id in [g["id"] for g in listed]
    code, out, err = cli(capsys, "gallery", "list")
    assert code == 0 and gallery_id in out and "listed" in out
    assert "items" in cli_json(capsys, "dataset", "list")
    assert "items" in cli_json(capsys, "model", "list")
    ids = np.array(["a", "b", "c"])
    vectors = np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32)
    texts = save(tmp_path / "texts.npy", np.array(["first text", "second", "third one"]))
    code, _, err = cli(capsys, "gallery", "upload", gallery_id, "--ids",
                       save(tmp_path / "ids.npy", ids), "--vectors",
                       save(tmp_path / "v.npy", vectors), "--texts", texts)  # fmt: skip
    assert code == 0, err
    from sqlalchemy import create_engine, text

    # The server's own SQLite database, beside its log in its data directory.
    engine = create_engine(f"sqlite:///{server.log_path.parent / 'nobackfill.db'}")
    try:
        with engine.connect() as connection:
            stored = connection.execute(
                text("SELECT text FROM gallery_texts WHERE gallery_id = :g ORDER BY text"),
                {"g": gallery_id},
            )
            assert [r[0] for r in stored] == ["first text", "second", "third one"]
    finally:
        engine.dispose()
    short = save(tmp_path / "short.npy", np.array(["only one"]))
    code, out, err = cli(capsys, "gallery", "upload", gallery_id, "--ids",
                         save(tmp_path / "ids2.npy", ids), "--vectors",
                         save(tmp_path / "v2.npy", vectors), "--texts", short)  # fmt: skip
    assert code != 0 and "texts" in err
