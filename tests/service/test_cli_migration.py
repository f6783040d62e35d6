"""``nobackfill backfill plan|upload`` and ``nobackfill upgrade list`` against a real server
process (issue 25, item 4): a migration walked with the CLI — plan → upload (batched, resumable,
row counts checked before anything is sent) → progress → transition search — on real WordNet
vectors (old: MiniLM glosses; new: mpnet)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from app.cli import main
from bench.common.service import BENCH_KEY, RunningService, start_service
from tests.service.test_cli import NEW, OLD, QUICK, FailingTransport, cli, cli_json, save

FRACTION = 0.1


@pytest.fixture(scope="module", params=["faiss", "milvus"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningService]:
    """One server per vector engine, with test_cli's small request limits."""
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
    values = {
        "NOBACKFILL_URL": server.url,
        "NOBACKFILL_KEY": BENCH_KEY,
        "NOBACKFILL_CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    return values


@pytest.fixture(scope="module")
def trained(server: RunningService, wordnet_small: dict) -> dict[str, str]:
    """A gallery of 800 old vectors and a quick procrustes upgrade of it (its job and model)."""
    from app.client import Client

    ids, old, new = wordnet_small["synset_id"], wordnet_small[OLD], wordnet_small[NEW]
    with Client(server.url, BENCH_KEY) as client:
        gallery = client.create_gallery(
            "migration", dim=old.shape[1], model_name="all-MiniLM-L6-v2", metric="cosine"
        )
        client.upload_vectors(gallery["id"], ids, old, resume=False)
        dataset = client.create_dataset("migration", gallery_id=gallery["id"])
        client.upload_items(dataset["id"], ids[:400], new[:400], resume=False)
        job = client.create_upgrade(dataset["id"], "procrustes", params=json.loads(QUICK))
        job = client.wait_upgrade(job["id"], poll_s=0.2, timeout_s=300)
    assert job["status"] == "succeeded", job["error"]
    return {
        "gallery": gallery["id"],
        "dataset": dataset["id"],
        "upgrade": job["id"],
        "model": job["model_id"],
    }


def reembedded(capsys: pytest.CaptureFixture, gallery_id: str, model_id: str) -> int:
    progress = cli_json(capsys, "gallery", "get", gallery_id).get("reembedded") or []
    return next((p["reembedded"] for p in progress if p["model_id"] == model_id), 0)


def test_a_migration_with_the_cli(
    capsys: pytest.CaptureFixture,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    trained: dict[str, str],
    wordnet_small: dict,
) -> None:
    gallery, model = trained["gallery"], trained["model"]
    all_ids = wordnet_small["synset_id"]
    row_of = {str(item): n for n, item in enumerate(all_ids)}

    # Plan: the ids written as a .npy of strings, a summary for people on stdout.
    plan_file = tmp_path / "plan_ids.npy"
    code, out, err = cli(
        capsys, "backfill", "plan", gallery, "--model", model, "--fraction", str(FRACTION),
        "-o", str(plan_file),
    )  # fmt: skip
    assert code == 0, err
    planned = np.load(plan_file, allow_pickle=False)
    assert planned.dtype.kind == "U" and planned.ndim == 1
    assert len(planned) == round(FRACTION * len(all_ids)) == len(set(planned.tolist()))
    assert set(planned.tolist()) <= set(all_ids.tolist())
    assert f"{len(planned)} items" in out and str(plan_file) in out
    assert "expected" in out and "recall@" in out
    # --json: the server's answer on stdout (the same ids, in the same order), nothing else.
    as_json = tmp_path / "plan_json.npy"
    plan = cli_json(
        capsys, "backfill", "plan", gallery, "--model", model, "--fraction", str(FRACTION),
        "-o", str(as_json),
    )  # fmt: skip
    assert plan["ids"] == planned.tolist() == np.load(as_json).tolist()
    assert plan["model_id"] == model and plan["total"] == len(all_ids) and plan["expected"]

    features = wordnet_small[NEW][[row_of[i] for i in planned.tolist()]]
    feature_file = save(tmp_path / "plan_features.npy", features)
    upload = ("backfill", "upload", gallery, "--model", model, "--ids", str(plan_file))

    # Row counts that differ: refused before anything is sent.
    short = save(tmp_path / "short.npy", features[:-1])
    with monkeypatch.context() as patched:
        sent = FailingTransport(patched)
        code, out, err = cli(capsys, *upload, "--features", short)
    assert code == 1 and out == "" and "Traceback" not in err
    assert err.startswith("error: ") and f"{len(planned)} ids" in err
    assert f"{len(planned) - 1} rows" in err and "nothing was sent" in err
    assert sent.batches == 0
    assert reembedded(capsys, gallery, model) == 0

    # Interrupted after two batches of 20; the rerun sends only what is left.
    upload += ("--features", feature_file, "--batch", "20")
    with monkeypatch.context() as patched:
        FailingTransport(patched, fail_from=3)
        code, out, err = cli(capsys, *upload)
    assert code == 1
    assert f"interrupted after 40 of {len(planned)} rows" in err and "rerun" in err
    assert reembedded(capsys, gallery, model) == 40
    with monkeypatch.context() as patched:
        rerun = FailingTransport(patched)
        code, out, err = cli(capsys, *upload, "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["upserted"] == len(planned) - 40 and result["resumed_from"] == 40
    assert result["batches"] == rerun.batches == 2
    assert {
        k: result["reembedded"][k] for k in ("model_id", "reembedded", "total", "fraction")
    } == {
        "model_id": model,
        "reembedded": len(planned),
        "total": len(all_ids),
        "fraction": FRACTION,
    }
    # The plan stored the model's fit: the progress quotes its expected quality.
    assert result["reembedded"]["expected"]["next"]["fraction"] == pytest.approx(FRACTION + 0.1)

    # Progress, as people read it.
    code, out, err = cli(capsys, "gallery", "get", gallery)
    assert code == 0, err
    assert f"re-embedded for {model}: {len(planned)}/{len(all_ids)} (10%)" in out
    # The next plan leaves the re-embedded items out.
    more = cli_json(capsys, "backfill", "plan", gallery, "--model", model, "--count", "5")
    assert len(more["ids"]) == 5 and not set(more["ids"]) & set(planned.tolist())
    assert more["reembedded"] == len(planned)

    # A transition search: re-embedded items answer in the new space, the rest in the old.
    queries = save(tmp_path / "q_new.npy", wordnet_small["lemma.all-mpnet-base-v2"][:50])
    old_q = save(tmp_path / "q_old.npy", wordnet_small["lemma.all-MiniLM-L6-v2"][:50])
    hits = cli_json(
        capsys, "search", gallery, "--queries", queries, "--old-queries", old_q,
        "--model", model, "--k", "10",
    )  # fmt: skip
    spaces = {h["space"] for row in hits["results"] for h in row}
    assert spaces == {"new", "old"}


def test_backfill_commands_refuse_bad_input(
    capsys: pytest.CaptureFixture, tmp_path: Path, trained: dict[str, str]
) -> None:
    gallery, model = trained["gallery"], trained["model"]
    code, _, err = cli(capsys, "backfill", "plan", gallery, "--model", "mdl_missing",
                       "--fraction", "0.1", "-o", str(tmp_path / "p.npy"))  # fmt: skip
    assert code == 1 and "(404)" in err and not (tmp_path / "p.npy").exists()
    code, _, err = cli(capsys, "backfill", "plan", gallery, "--model", model,
                       "--fraction", "1.5")  # fmt: skip
    assert code == 1 and "(422)" in err and "fraction" in err
    with pytest.raises(SystemExit):  # --fraction or --count: one of them
        main(["backfill", "plan", gallery, "--model", model])
    ids = save(tmp_path / "ids.npy", np.array(["a", "b"]))
    floats = save(tmp_path / "f.npy", np.ones((2, 4), np.float32))
    code, _, err = cli(capsys, "backfill", "upload", gallery, "--model", model,
                       "--ids", str(tmp_path / "none.npy"), "--features", floats)  # fmt: skip
    assert code == 1 and "--ids" in err and "no such file" in err
    code, _, err = cli(capsys, "backfill", "upload", gallery, "--model", model,
                       "--ids", floats, "--features", ids)  # fmt: skip
    assert code == 1 and "ids: expected strings" in err


def test_upgrade_list(
    capsys: pytest.CaptureFixture, tmp_path: Path, trained: dict[str, str]
) -> None:
    cancelled = cli_json(capsys, "upgrade", "--dataset", trained["dataset"], "--method", "hbct",
                         "--params", '{"epochs": 1000, "hidden_dim": 32}')  # fmt: skip
    cli_json(capsys, "cancel", cancelled["id"])
    code, _, err = cli(capsys, "status", cancelled["id"], "--wait", "--poll", "0.2")
    assert code == 1, err

    everything = cli_json(capsys, "upgrade", "list")["items"]
    by_id = {job["id"]: job for job in everything}
    assert {trained["upgrade"], cancelled["id"]} <= set(by_id)
    assert by_id[trained["upgrade"]]["status"] == "succeeded"
    succeeded = cli_json(capsys, "upgrade", "list", "--status", "succeeded")["items"]
    assert trained["upgrade"] in {j["id"] for j in succeeded}
    assert {j["status"] for j in succeeded} == {"succeeded"}
    only = cli_json(capsys, "upgrade", "list", "--status", "cancelled")["items"]
    assert [j["id"] for j in only] == [cancelled["id"]]

    code, out, err = cli(capsys, "upgrade", "list")
    assert code == 0, err
    lines = {line.split("\t")[0]: line for line in out.splitlines()}
    assert "procrustes" in lines[trained["upgrade"]] and "succeeded" in lines[trained["upgrade"]]
    assert trained["model"] in lines[trained["upgrade"]]
    assert "cancelled" in lines[cancelled["id"]]
    code, out, err = cli(capsys, "upgrade", "list", "--status", "running")
    assert code == 0 and "no upgrades" in out

    # `upgrade` alone still creates a job, and still needs --dataset.
    with pytest.raises(SystemExit) as exited:
        main(["upgrade", "--method", "procrustes"])
    assert exited.value.code == 2
    assert "--dataset" in capsys.readouterr().err
