"""Key lifecycle (issue 24, item 4): an admin key creates, lists and revokes its tenant's keys.

The secret is shown once, in the create answer, and stored only as its digest; a revoked key is
refused on its very next request; another tenant's key answers like a missing one; a tenant can
never revoke its last active admin key; bad input answers 422 problem+json and changes nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from app.auth.models import ApiKey
from app.auth.service import create_key
from app.core.idempotency import IdempotencyRecord
from app.core.security import hash_api_key
from tests.service.conftest import TEST_KEY, field_names, problem, snapshot, stop_client


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def new_key(client: TestClient, **body: Any) -> dict[str, Any]:
    response = client.post("/v1/keys", json=body)
    assert response.status_code == 201, response.text
    # The answer holds a secret: no cache (a proxy's, a browser's) may keep it.
    assert response.headers["cache-control"] == "no-store"
    return response.json()


def listed(client: TestClient, key: str | None = None, **params: Any) -> list[dict[str, Any]]:
    headers = bearer(key) if key else {}
    response = client.get("/v1/keys", params=params, headers=headers)
    assert response.status_code == 200, response.text
    return response.json()["items"]


def own_key_id(client: TestClient) -> str:
    """The id of the test's bootstrap key (TEST_KEY)."""
    with client.app.state.service.db.sessions() as session:
        return session.scalar(select(ApiKey.id).where(ApiKey.key_hash == hash_api_key(TEST_KEY)))


def test_create_list_and_revoke(client: TestClient) -> None:
    created = new_key(client, name="ci")
    key = created["key"]
    assert key.startswith("nbk_") and len(key) > 40
    assert created["prefix"] == key[:8] and created["name"] == "ci"
    assert created["admin"] is False and created["revoked_at"] is None
    assert created["id"].startswith("key_") and created["created_at"]
    # The new key works at once, for the same tenant.
    gallery = {"name": "g", "dim": 2, "model_name": "m", "metric": "dot"}
    assert client.post("/v1/galleries", json=gallery).status_code == 201
    seen = client.get("/v1/galleries", headers=bearer(key)).json()["items"]
    assert [g["name"] for g in seen] == ["g"]
    # Only its digest is stored; listings never show the secret.
    with client.app.state.service.db.sessions() as session:
        row = session.get(ApiKey, created["id"])
        assert row is not None and row.key_hash == hash_api_key(key) and not row.admin
    page = client.get("/v1/keys")
    assert key not in page.text and key[8:] not in page.text
    items = page.json()["items"]
    assert {k["id"] for k in items} == {own_key_id(client), created["id"]}
    assert all("key" not in k and "key_hash" not in k for k in items)
    mine = next(k for k in items if k["id"] == created["id"])
    assert mine == {k: v for k, v in created.items() if k != "key"}
    bootstrap = next(k for k in items if k["id"] != created["id"])
    assert bootstrap["admin"] is True and bootstrap["name"] == "bootstrap"

    revoked = client.delete(f"/v1/keys/{created['id']}")
    assert revoked.status_code == 204, revoked.text
    # Refused on its very next request, with the same answer as an unknown key.
    body = problem(client.get("/v1/galleries", headers=bearer(key)), 401)
    assert "revoked" in body["detail"]
    assert [k["id"] for k in listed(client)] == [own_key_id(client)]
    everything = listed(client, include_revoked="true")
    gone = next(k for k in everything if k["id"] == created["id"])
    assert gone["revoked_at"] is not None
    # Revoking again changes nothing (the first revocation's time stays).
    assert client.delete(f"/v1/keys/{created['id']}").status_code == 204
    again = next(k for k in listed(client, include_revoked="true") if k["id"] == created["id"])
    assert again["revoked_at"] == gone["revoked_at"]


def test_the_secret_is_never_stored_for_a_replay(client: TestClient) -> None:
    """An Idempotency-Key would store the answer, the secret with it: creating keys takes none."""
    response = client.post("/v1/keys", json={}, headers={"Idempotency-Key": "once"})
    assert response.status_code == 201, response.text
    with client.app.state.service.db.sessions() as session:
        assert session.scalar(select(func.count()).select_from(IdempotencyRecord)) == 0
    second = client.post("/v1/keys", json={}, headers={"Idempotency-Key": "once"})
    assert second.status_code == 201 and second.json()["key"] != response.json()["key"]
    assert response.json()["name"] == "" and response.json()["admin"] is False


def test_only_admin_keys_manage_keys(client: TestClient) -> None:
    plain = new_key(client, name="reader")
    admin = new_key(client, name="ops", admin=True)
    assert admin["admin"] is True
    as_plain = bearer(plain["key"])
    for method, path, kwargs in [
        ("GET", "/v1/keys", {}),
        ("POST", "/v1/keys", {"json": {"admin": True}}),
        ("DELETE", f"/v1/keys/{admin['id']}", {}),
        ("DELETE", f"/v1/keys/{plain['id']}", {}),
    ]:
        body = problem(client.request(method, path, headers=as_plain, **kwargs), 403)
        assert "admin" in body["detail"], body
    # Nothing was created or revoked; the plain key still reaches its tenant's data.
    assert {k["id"] for k in listed(client)} == {own_key_id(client), plain["id"], admin["id"]}
    assert client.get("/v1/galleries", headers=as_plain).status_code == 200
    # A key created by an admin key with admin: true manages keys itself.
    made = client.post("/v1/keys", json={"name": "by-ops"}, headers=bearer(admin["key"]))
    assert made.status_code == 201 and made.json()["admin"] is False
    assert len(listed(client, admin["key"])) == 4


def test_another_tenants_keys_answer_404(client: TestClient) -> None:
    with client.app.state.service.db.session() as session:
        acme = create_key(session, "acme", "acme-admin")
        acme_id = session.scalar(select(ApiKey.id).where(ApiKey.key_hash == hash_api_key(acme.key)))
    body = problem(client.delete(f"/v1/keys/{acme_id}"), 404)
    assert acme_id in body["detail"]
    for missing in ("key_missing", "x" * 300, "key_%00", "..%2F..%2Fkeys"):
        problem(client.delete(f"/v1/keys/{missing}"), 404)
    # acme's key still works, and each tenant lists only its own keys.
    as_acme = bearer(acme.key)
    assert client.get("/v1/galleries", headers=as_acme).status_code == 200
    assert [k["id"] for k in listed(client, acme.key)] == [acme_id]
    assert acme_id not in {k["id"] for k in listed(client, include_revoked="true")}
    # Keys made by `nobackfill create-key` are admin keys of their tenant.
    assert listed(client, acme.key)[0]["admin"] is True
    problem(client.delete(f"/v1/keys/{own_key_id(client)}", headers=as_acme), 404)


def test_the_last_active_admin_key_cannot_be_revoked(client: TestClient) -> None:
    own = own_key_id(client)
    plain = new_key(client, name="plain")  # a non-admin key does not keep the tenant manageable
    body = problem(client.delete(f"/v1/keys/{own}"), 409)
    assert "last" in body["detail"] and "admin" in body["detail"]
    assert client.get("/v1/keys").status_code == 200  # still active
    second = new_key(client, name="second", admin=True)
    # With another admin key the bootstrap key may go, even revoking itself.
    assert client.delete(f"/v1/keys/{own}").status_code == 204
    problem(client.get("/v1/keys"), 401)
    as_second = bearer(second["key"])
    problem(client.delete(f"/v1/keys/{second['id']}", headers=as_second), 409)
    assert client.delete(f"/v1/keys/{plain['id']}", headers=as_second).status_code == 204
    # A revoked admin key is no longer counted: still the last one.
    problem(client.delete(f"/v1/keys/{second['id']}", headers=as_second), 409)
    assert [k["id"] for k in listed(client, second["key"])] == [second["id"]]


def test_bad_input_answers_422_and_changes_nothing(client: TestClient) -> None:
    new_key(client, name="existing")
    before = snapshot(client)
    listing_before = listed(client, include_revoked="true")
    cases: list[tuple[Any, str]] = [
        ({"name": "x" * 129}, "name"),
        ({"admin": "yes"}, "admin"),
        ({"admin": 1}, "admin"),
        ({"admin": None}, "admin"),
        ({"name": 7}, "name"),
        ({"name": "a\x00b"}, "name"),
        ({"name": "bell\x07"}, "name"),
        ({"tenant": "other"}, "tenant"),
        ({"key": "nbk_chosen_by_the_client_0123456789"}, "key"),
        ([], "body"),
    ]
    for payload, field in cases:
        body = problem(client.post("/v1/keys", json=payload), 422)
        assert field in field_names(body), (payload, body)
    problem(
        client.post("/v1/keys", content=b"{not json", headers={"Content-Type": "application/json"}),
        422,
    )
    for params in ({"limit": 0}, {"page_token": "!!"}, {"include_revoked": "maybe"}):
        problem(client.get("/v1/keys", params=params), 422)
    assert snapshot(client) == before
    assert listed(client, include_revoked="true") == listing_before


def test_listing_pages_and_revoked_keys(make_client: Callable[..., TestClient]) -> None:
    client = make_client(max_page_size=3)
    made = [new_key(client, name=f"k{i}")["id"] for i in range(5)]
    client.delete(f"/v1/keys/{made[1]}")

    def walk(**params: Any) -> list[str]:
        ids, token = [], None
        while True:
            query = {**params, **({"page_token": token} if token else {})}
            page = client.get("/v1/keys", params={"limit": 50, **query}).json()
            assert len(page["items"]) <= 3
            ids += [k["id"] for k in page["items"]]
            token = page.get("next_page_token")
            if not token:
                return ids

    everything = [own_key_id(client), *made]
    assert walk(include_revoked="true") == everything  # oldest first, as every listing
    assert walk() == [k for k in everything if k != made[1]]


def test_local_and_bootstrap_keys_are_admin(make_client: Callable[..., TestClient]) -> None:
    first = make_client(bootstrap_key=None, local_key=True)
    local = first.app.state.service.settings.local_key_file.read_text().strip()
    (entry,) = listed(first, local)
    assert entry["admin"] is True and entry["name"] == "local"
    stop_client(first)
    rotated = make_client(bootstrap_key="ci-key-rotated-456789abcdef", local_key=False)
    keys = {k["name"]: k for k in listed(rotated, "ci-key-rotated-456789abcdef")}
    assert keys["bootstrap"]["admin"] is True


@pytest.mark.parametrize("method", ["GET", "POST", "DELETE"])
def test_keys_need_a_valid_key(client: TestClient, method: str) -> None:
    path = "/v1/keys" if method != "DELETE" else f"/v1/keys/{own_key_id(client)}"
    kwargs: dict[str, Any] = {"json": {}} if method == "POST" else {}
    problem(client.request(method, path, headers={"Authorization": ""}, **kwargs), 401)
    problem(client.request(method, path, headers=bearer("nbk_wrong_" + "w" * 32), **kwargs), 401)


def test_concurrent_revocations_leave_one_admin_key(client: TestClient) -> None:
    """Every admin key revoked at once, from as many threads: revocations of a tenant are
    serialised, so exactly one key (whichever came last) is refused and stays active."""
    from app.auth import keys
    from app.core.errors import Problem

    secrets = {own_key_id(client): TEST_KEY}
    for _ in range(3):
        made = new_key(client, admin=True)
        secrets[made["id"]] = made["key"]
    ids = list(secrets)
    with client.app.state.service.db.sessions() as session:
        tenant_id = session.scalar(select(ApiKey.tenant_id).where(ApiKey.id == ids[0]))
    db = client.app.state.service.db
    start = threading.Barrier(len(ids))

    def revoke(key_id: str) -> int:
        with db.sessions() as session:
            start.wait()
            try:
                keys.revoke_key(session, tenant_id, key_id)
            except Problem as refused:
                session.rollback()
                return refused.status
            return 204

    with ThreadPoolExecutor(len(ids)) as pool:
        statuses = list(pool.map(revoke, ids))
    assert sorted(statuses) == [204, 204, 204, 409], statuses
    survivor = ids[statuses.index(409)]
    assert [k["id"] for k in listed(client, secrets[survivor])] == [survivor]


def test_active_keys_per_tenant_are_capped(make_client: Callable[..., TestClient]) -> None:
    """An admin key cannot mint keys without end: past MAX_KEYS_PER_TENANT active keys a create
    answers 403 naming the setting; revoking one makes room (revoked keys do not count)."""
    client = make_client(max_keys_per_tenant=3)
    made = [new_key(client, name=f"k{i}")["id"] for i in range(2)]  # + the test's own key = 3
    before = snapshot(client)
    refused = problem(client.post("/v1/keys", json={"name": "one too many"}), 403)
    assert "NOBACKFILL_MAX_KEYS_PER_TENANT" in refused["detail"]
    assert snapshot(client) == before
    assert client.delete(f"/v1/keys/{made[0]}").status_code == 204
    new_key(client, name="room again")


@pytest.mark.parametrize("name", ["bootstrap", "local"])
def test_the_names_of_the_servers_own_keys_are_reserved(client: TestClient, name: str) -> None:
    """A changed NOBACKFILL_BOOTSTRAP_KEY revokes the tenant's earlier keys named 'bootstrap': a
    key created over HTTP under that name would be revoked by the next rotation."""
    before = snapshot(client)
    refused = problem(client.post("/v1/keys", json={"name": name}), 422)
    assert field_names(refused) == ["name"]
    assert snapshot(client) == before
