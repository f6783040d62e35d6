"""API keys: the embedded local key, the bootstrap key, the CLI, hashed storage."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import httpx
from sqlalchemy import select

from app.auth.models import ApiKey
from app.auth.service import create_key
from app.core.security import hash_api_key
from app.core.settings import Settings
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
    # A valid key is never refused because others failed from its address (issue 45 item 4:
    # behind a proxy or NAT every tenant shares one): the right key still answers.
    assert client.get("/v1/galleries").status_code == 200
    with client.app.state.service.db.sessions() as session:
        other = create_key(session, "neighbour").key
        session.commit()
    assert (
        client.get("/v1/galleries", headers={"Authorization": f"Bearer {other}"}).status_code == 200
    )
    problem(client.get("/v1/galleries", headers={"Authorization": ""}), 429)
    metrics = client.get("/metrics", headers={"Authorization": ""}).text
    assert f'nobackfill_auth_failures_total{{reason="unknown key"}} {float(limit)}' in metrics
    assert 'nobackfill_auth_failures_total{reason="throttled"} 2.0' in metrics
    # Liveness, readiness and metrics need no key and are never throttled.
    assert client.get("/healthz", headers={"Authorization": ""}).status_code == 200


def test_a_key_tried_from_many_addresses_is_throttled_by_its_prefix() -> None:
    """Failures count per presented key prefix as well as per address: rotating addresses does
    not reset a guesser that repeats a key."""
    from app.api.deps import KEY_PREFIX_CHARS
    from app.auth.throttle import AuthThrottle

    throttle = AuthThrottle(limit=3, window_s=60.0)
    prefix = "key:" + "nbk_guessing_key"[:KEY_PREFIX_CHARS]
    for address in ("10.0.0.1", "10.0.0.2", "10.0.0.3"):
        assert throttle.retry_after(address, now=0.0) is None
        throttle.failed(address, now=0.0)
        throttle.failed(prefix, now=0.0)
    assert throttle.retry_after("10.0.0.4", now=1.0) is None  # a new address…
    assert throttle.retry_after(prefix, now=1.0) == 59  # …but the same key prefix


def test_serve_believes_x_forwarded_for_only_from_configured_proxies(tmp_path) -> None:
    """Issue 45 item 4: 200 wrong keys, each with its own X-Forwarded-For, got no 429 (uvicorn
    trusts 127.0.0.1's forwarded headers by default). ``nobackfill serve`` now uses the peer
    address unless NOBACKFILL_TRUSTED_PROXIES names the proxy."""
    from app.cli import uvicorn_options
    from tests.service.serve_process import nobackfill_serve

    assert uvicorn_options(Settings(_env_file=None))["proxy_headers"] is False
    trusted = uvicorn_options(Settings(_env_file=None, trusted_proxies="10.1.2.3,10.1.2.4"))
    assert trusted["proxy_headers"] is True
    assert trusted["forwarded_allow_ips"] == "10.1.2.3,10.1.2.4"
    key = "nbk_proxy_test_" + "b" * 32
    with nobackfill_serve(tmp_path / "data", key, auth_failure_limit="5") as (url, _):
        statuses = [
            httpx.get(
                f"{url}/v1/galleries",
                headers={"Authorization": f"Bearer wrong-{i}", "X-Forwarded-For": f"10.9.0.{i}"},
            ).status_code
            for i in range(8)
        ]
        assert statuses[:5] == [401] * 5 and statuses[5:] == [429] * 3, statuses
        good = {"Authorization": f"Bearer {key}"}
        assert httpx.get(f"{url}/v1/galleries", headers=good).status_code == 200


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
