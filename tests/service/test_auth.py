"""API keys: the embedded local key, the bootstrap key, the CLI, hashed storage."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from sqlalchemy import select

from app.auth.models import ApiKey
from app.core.security import hash_api_key
from tests.service.conftest import problem, stop_client

REPO = Path(__file__).resolve().parents[2]


def test_local_key_created_once_printed_and_stored(make_client, capsys) -> None:
    client = make_client(bootstrap_key=None, local_key=True)
    key_file = client.app.state.service.settings.local_key_file
    key = key_file.read_text().strip()
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert f"API key: {key}" in capsys.readouterr().out
    with client.app.state.service.db.sessions() as session:
        stored = list(session.scalars(select(ApiKey.key_hash)))
    assert stored == [hash_api_key(key)]  # only the digest is stored
    assert (
        client.get("/v1/galleries", headers={"Authorization": f"Bearer {key}"}).status_code == 200
    )
    stop_client(client)
    again = make_client(bootstrap_key=None, local_key=True)
    assert key_file.read_text().strip() == key
    assert again.get("/v1/galleries", headers={"Authorization": f"Bearer {key}"}).status_code == 200
    # Later starts name the key's file and prefix, never the key (issue 24: it landed in every
    # compose log).
    out = capsys.readouterr().out
    assert key not in out and f"(from {key_file})" in out


def test_a_changed_bootstrap_key_revokes_the_previous_one(make_client, capsys) -> None:
    first = make_client(bootstrap_key="ci-key-0123456789abcdef", local_key=False)
    old = {"Authorization": "Bearer ci-key-0123456789abcdef"}
    assert first.get("/v1/galleries", headers=old).status_code == 200
    stop_client(first)
    again = make_client(bootstrap_key="ci-key-0123456789abcdef", local_key=False)
    assert "ci-key-0123456789abcdef" not in capsys.readouterr().out.split("API key:")[-1]
    assert again.get("/v1/galleries", headers=old).status_code == 200
    stop_client(again)
    rotated = make_client(bootstrap_key="ci-key-rotated-456789abcdef", local_key=False)
    assert "API key: ci-key-rotated-456789abcdef" in capsys.readouterr().out
    new = {"Authorization": "Bearer ci-key-rotated-456789abcdef"}
    assert rotated.get("/v1/galleries", headers=new).status_code == 200
    problem(rotated.get("/v1/galleries", headers=old), 401)


def test_bootstrap_key_from_the_environment(make_client, monkeypatch, capsys) -> None:
    monkeypatch.setenv("NOBACKFILL_BOOTSTRAP_KEY", "ci-key-0123456789abcdef")
    from app.core.settings import Settings

    assert Settings(_env_file=None).bootstrap_key == "ci-key-0123456789abcdef"
    client = make_client(bootstrap_key="ci-key-0123456789abcdef", local_key=True)
    assert "API key: ci-key-0123456789abcdef" in capsys.readouterr().out
    assert not client.app.state.service.settings.local_key_file.exists()
    headers = {"Authorization": "Bearer ci-key-0123456789abcdef"}
    assert client.get("/v1/galleries", headers=headers).status_code == 200


def test_no_key_without_bootstrap_or_local(make_client, capsys) -> None:
    client = make_client(bootstrap_key=None, local_key=False)
    assert "API key:" not in capsys.readouterr().out
    problem(client.get("/v1/galleries", headers={"Authorization": "Bearer anything"}), 401)


def test_cli_creates_a_key_for_a_tenant(make_client, make_settings) -> None:
    settings = make_settings()
    env = {
        **os.environ,
        "NOBACKFILL_DATABASE_URL": settings.resolved_database_url,
        "NOBACKFILL_DATA_DIR": str(settings.data_dir),
    }
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "create-key", "--tenant", "acme"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    key = next(
        line.split(": ", 1)[1] for line in done.stdout.splitlines() if line.startswith("API key:")
    )
    client = make_client()
    as_acme = {"Authorization": f"Bearer {key}"}
    created = client.post(
        "/v1/galleries",
        json={"name": "g", "dim": 2, "model_name": "m", "metric": "dot"},
        headers=as_acme,
    )
    assert created.status_code == 201
    # The test tenant does not see acme's gallery.
    assert client.get("/v1/galleries").json()["items"] == []


def test_an_empty_bootstrap_variable_means_none(monkeypatch) -> None:
    from app.core.settings import Settings

    monkeypatch.setenv("NOBACKFILL_BOOTSTRAP_KEY", "")
    assert Settings(_env_file=None).bootstrap_key is None


def test_failed_authentications_are_throttled_per_address_and_counted(make_client) -> None:
    """Issue 24, failure 4: 300 wrong keys in 1.9 s all answered 401, none 429."""
    client = make_client()
    limit = client.app.state.service.settings.auth_failure_limit
    for i in range(limit):
        problem(client.get("/v1/galleries", headers={"Authorization": f"Bearer wrong-{i}"}), 401)
    refused = client.get("/v1/galleries", headers={"Authorization": "Bearer wrong-again"})
    body = problem(refused, 429)
    assert int(refused.headers["Retry-After"]) >= 1, body
    # Throttled before the key is looked at: even the right key waits out the window.
    problem(client.get("/v1/galleries"), 429)
    metrics = client.get("/metrics", headers={"Authorization": ""}).text
    assert f'nobackfill_auth_failures_total{{reason="unknown key"}} {float(limit)}' in metrics
    assert 'nobackfill_auth_failures_total{reason="throttled"} 2.0' in metrics
    # Liveness, readiness and metrics need no key and are never throttled.
    assert client.get("/healthz", headers={"Authorization": ""}).status_code == 200


def test_the_throttle_forgets_failures_outside_its_window() -> None:
    from app.auth.throttle import AuthThrottle

    throttle = AuthThrottle(limit=3, window_s=10.0, max_clients=2)
    for t in (0.0, 1.0, 2.0):
        assert throttle.retry_after("a", now=t) is None
        throttle.failed("a", now=t)
    assert throttle.retry_after("a", now=3.0) == 7
    assert throttle.retry_after("b", now=3.0) is None  # per address
    assert throttle.retry_after("a", now=10.5) is None  # the first failure left the window
    throttle.failed("b", now=11.0)
    throttle.failed("c", now=11.0)  # beyond max_clients: the oldest client is forgotten
    assert len(throttle._failures) <= 2
