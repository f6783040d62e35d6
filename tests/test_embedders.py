"""The embedder client's checks and the guards in front of it (issue 43, item 7), without a
server: every malformed answer is an ``EmbedderFailed`` with its reason, never a vector; the
circuit opens after its count and closes on a success; the budget refills with time."""

from __future__ import annotations

import math

import httpx
import numpy as np
import pytest

from app.embedders.client import EmbedderFailed, EmbedderSpec, embed_texts
from app.embedders.guard import Budgets, Circuits

SPEC = EmbedderSpec("emb_1", "http://e/v1/embeddings", "m", 3, None, "q: ", "d: ", 2)


def _client(answer) -> tuple[httpx.Client, list[dict]]:
    sent: list[dict] = []

    def handle(request: httpx.Request) -> httpx.Response:
        import json

        body = json.loads(request.content)
        sent.append(body)
        return answer(body) if callable(answer) else answer

    return httpx.Client(transport=httpx.MockTransport(handle)), sent


def _ok(body: dict) -> httpx.Response:
    data = [
        {"index": i, "embedding": [float(len(t)), 1.0, 0.0]} for i, t in enumerate(body["input"])
    ]
    return httpx.Response(200, json={"data": list(reversed(data))})


def test_batches_prefixes_and_order() -> None:
    client, sent = _client(_ok)
    out = embed_texts(SPEC, ["a", "bb", "ccc"], "document", 1.0, client)
    assert [b["input"] for b in sent] == [["d: a", "d: bb"], ["d: ccc"]]
    assert all(b["model"] == "m" for b in sent)
    np.testing.assert_array_equal(out[:, 0], [4, 5, 6])  # by index, not by list order
    client, sent = _client(_ok)
    embed_texts(SPEC, ["x"], "query", 1.0, client)
    assert sent[0]["input"] == ["q: x"]


@pytest.mark.parametrize(
    ("response", "reason"),
    [
        (httpx.Response(500, json={}), "http-error"),
        (httpx.Response(200, content=b"not json"), "malformed"),
        (httpx.Response(200, json={"nodata": 1}), "malformed"),
        (httpx.Response(200, json={"data": [{"index": 0, "embedding": [1, 2, 3]}]}), "wrong-count"),
        (
            httpx.Response(
                200,
                json={
                    "data": [{"index": 0, "embedding": [1, 2]}, {"index": 1, "embedding": [1, 2]}]
                },
            ),
            "wrong-dimension",
        ),
        (
            httpx.Response(
                200,
                content=b'{"data": [{"index": 0, "embedding": [NaN, 1, 2]},'
                b' {"index": 1, "embedding": [1, 2, 3]}]}',
            ),
            "not-finite",
        ),
        (
            httpx.Response(
                200,
                json={
                    "data": [
                        {"index": 0, "embedding": [1, 2, 3]},
                        {"index": 0, "embedding": [1, 2, 3]},
                    ]
                },
            ),
            "malformed",
        ),
        (
            httpx.Response(
                200,
                json={
                    "data": [
                        {"index": 0, "embedding": [1, 2, 3]},
                        {"index": 1, "embedding": ["x", 2, 3]},
                    ]
                },
            ),
            "not-finite",
        ),
    ],
)
def test_every_bad_answer_is_a_failure_with_its_reason(response, reason) -> None:
    client, _ = _client(response)
    with pytest.raises(EmbedderFailed) as failed:
        embed_texts(SPEC, ["a", "b"], "document", 1.0, client)
    assert failed.value.reason == reason


def _answer(*embeddings, indexes=None) -> httpx.Response:
    indexes = range(len(embeddings)) if indexes is None else indexes
    data = [{"index": i, "embedding": e} for i, e in zip(indexes, embeddings, strict=True)]
    return httpx.Response(200, json={"data": data})


@pytest.mark.parametrize(
    ("response", "reason"),
    [
        (_answer([1, 2, 3], [1, None, 3]), "not-finite"),  # null
        (_answer([1, 2, 3], [1, [2], 3]), "not-finite"),  # a nested list
        (_answer([1, 2, 3], [1, 1e39, 3]), "not-finite"),  # finite in JSON, ∞ in float32
        (_answer([1, 2, 3], [1, 10**400, 3]), "not-finite"),  # an integer beyond any float
        (_answer([1, 2, 3], [1, 2, 3], indexes=[0, True]), "malformed"),
        (_answer([1, 2, 3], [1, 2, 3], indexes=[0, 2]), "malformed"),
        (_answer([1, 2, 3], [1, 2, 3], indexes=[0, "1"]), "malformed"),
        (
            httpx.Response(200, json={"data": [{"index": 0, "embedding": [1, 2, 3]}, 5]}),
            "malformed",
        ),
    ],
)
def test_more_bad_answers(response, reason) -> None:
    client, _ = _client(response)
    with pytest.raises(EmbedderFailed) as failed:
        embed_texts(SPEC, ["a", "b"], "document", 1.0, client)
    assert failed.value.reason == reason


def test_a_full_batch_is_parsed_into_its_rows_by_index() -> None:
    """256 texts of 768 dimensions (the service's largest batch, MPNet's width), answered out of
    order, ints mixed with floats: every value lands in its text's row, as float32."""
    spec = EmbedderSpec("e", "http://e", "m", 768, None, "", "", 256)
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((256, 768)).astype(np.float32)
    rows = vectors.tolist()
    rows[7][3] = 2  # a JSON integer
    vectors[7, 3] = 2.0
    order = rng.permutation(256)
    answer = _answer(*[rows[i] for i in order], indexes=order.tolist())
    out = embed_texts(spec, [f"t{i}" for i in range(256)], "document", 1.0, _client(answer)[0])
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, vectors)
    no_index = httpx.Response(200, json={"data": [{"embedding": r} for r in rows]})
    out = embed_texts(spec, [f"t{i}" for i in range(256)], "query", 1.0, _client(no_index)[0])
    np.testing.assert_array_equal(out, vectors)


def test_transport_failures() -> None:
    def refuse(request):
        raise httpx.ConnectError("refused")

    def slow(request):
        raise httpx.ReadTimeout("slow")

    for handler, reason in ((refuse, "unreachable"), (slow, "timeout")):
        client = httpx.Client(transport=httpx.MockTransport(handler))
        with pytest.raises(EmbedderFailed) as failed:
            embed_texts(SPEC, ["a"], "query", 1.0, client)
        assert failed.value.reason == reason


def test_the_key_comes_from_the_named_variable(monkeypatch) -> None:
    seen = []

    def handle(request):
        seen.append(request.headers.get("Authorization"))
        return _ok({"input": ["a"]})

    monkeypatch.setenv("NOBACKFILL_EMBEDDER_KEY_X", "secret")
    spec = EmbedderSpec("e", "http://e", "m", 3, "NOBACKFILL_EMBEDDER_KEY_X", "", "", 8)
    embed_texts(spec, ["a"], "query", 1.0, httpx.Client(transport=httpx.MockTransport(handle)))
    assert seen == ["Bearer secret"]


def test_the_circuit_opens_after_its_count_and_closes_on_success() -> None:
    now = [0.0]
    circuits = Circuits(failures=2, open_s=30.0, clock=lambda: now[0])
    circuits.record("e", False)
    assert not circuits.is_open("e")
    circuits.record("e", False)
    assert circuits.is_open("e") and not circuits.is_open("other")
    now[0] = 31.0
    assert not circuits.is_open("e")  # a trial call may go
    circuits.record("e", True)
    circuits.record("e", False)
    assert not circuits.is_open("e")  # the count restarted


def test_the_budget_refills_with_time() -> None:
    now = [0.0]
    budgets = Budgets(per_minute=60, clock=lambda: now[0])
    assert budgets.take("t", 50) == 0
    wait = budgets.take("t", 20)
    assert wait == math.ceil((20 - 10) / 1.0)  # 10 left, one a second
    assert budgets.take("other", 60) == 0  # per tenant
    now[0] = 10.0
    assert budgets.take("t", 20) == 0
    assert budgets.take("t", 61) == 60  # more than a minute's worth: never at once
