"""The rules on what an attached source may name (issue 45, item 1): URLs are normalised before
the allowlist (the probe escaped ``…/qd`` with ``…/qd/../mv``), two spellings of one server give
one owner key, and each tenant has a folder of its own under the attach roots."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.vectors.source_rules import (
    normalized_url,
    place_of,
    server_collection,
    tenant_folder,
    tenant_root,
    url_allowed,
)

ALLOWED = ["http://vectors:6333/qd"]


@pytest.mark.parametrize(
    "url",
    [
        "http://vectors:6333/qd/../mv",
        "http://vectors:6333/qd/%2e%2e/mv",
        "http://vectors:6333/qd/%2E%2E/mv",
        "http://vectors:6333/qd/.%2e/mv",
        "http://vectors:6333/qd%2f..%2fmv",
        "http://vectors:6333/qd/./../mv",
        "http://vectors:6333/qd/x/../../mv",
        "http://vectors:6333/qd/%252e%252e/mv",  # encoded twice: the next hop decodes again
        "http://vectors:6333/qd\\..\\mv",
        "http://vectors:6333/qd/ ../mv",
        "http://vectors:6333/qd/%09/../../mv",
        "http://user@vectors:6333/qd",
        "http://vectors:6333@evil/qd",
        "http://vectors:6333/qd?redirect=http://evil",
        "http://vectors:6333/qd#x",
        "http://vectors:6333.evil/qd",
        "http://vectors:6334/qd",
        "https://vectors:6333/qd",
        "http://vectors:6333/qdrant",
        "ftp://vectors:6333/qd",
        "http://vectors:notaport/qd",
    ],
)
def test_no_spelling_escapes_the_allowed_path(url: str) -> None:
    assert not url_allowed(ALLOWED, url)


@pytest.mark.parametrize(
    "url",
    [
        "http://vectors:6333/qd",
        "http://vectors:6333/qd/",
        "http://VECTORS:6333/qd",
        "HTTP://vectors:6333/qd/sub",
        "http://vectors:6333/qd/sub/../other",
        "http://vectors:6333/qd//sub",
        "http://vectors:6333/qd/./sub",
    ],
)
def test_spellings_under_the_allowed_path_pass(url: str) -> None:
    assert url_allowed(ALLOWED, url)


def test_dot_segments_in_an_entry_are_applied_too() -> None:
    assert url_allowed(["http://vectors:6333/other/../qd"], "http://vectors:6333/qd/x")
    assert not url_allowed(["http://vectors:6333/other/../qd"], "http://vectors:6333/other/x")


def test_one_server_one_place() -> None:
    spellings = [
        "http://vectors:80/qd",
        "http://vectors/qd/",
        "http://Vectors/qd/x/..",
        "http://vectors/%71d",  # %71 is "q"
        "http://vectors//qd",
    ]
    assert {place_of(url) for url in spellings} == {"http://vectors:80/qd"}
    assert place_of("http://vectors:6333/qd") != place_of("http://vectors/qd")
    assert place_of("http://[::1]:19530") == "http://[::1]:19530"
    assert place_of("http://vectors/a%252e") is None


def test_normalised_url_keeps_what_the_client_needs() -> None:
    assert normalized_url("http://Vectors:6333") == "http://vectors:6333"
    assert normalized_url("https://h/a/b/../c/") == "https://h/a/c/"
    assert normalized_url("http://h/a/..") == "http://h/"


@given(st.text(alphabet="abc./%2eE\\?#@:", max_size=24))
def test_an_allowed_url_normalises_to_a_path_under_the_entry(tail: str) -> None:
    """Whatever follows the allowed prefix, an accepted URL's normalised path lies under the
    entry's path: the allowlist vouches for the place the client will reach."""
    url = "http://vectors:6333/qd/" + tail
    if url_allowed(ALLOWED, url):
        normal = normalized_url(url)
        assert normal is not None
        assert (normal + "/").startswith("http://vectors:6333/qd/")


def test_server_collection_names_servers_only() -> None:
    assert server_collection({"engine": "qdrant", "path": "p", "collection": "c"}) is None
    assert server_collection({"engine": "milvus", "uri": "n.db", "collection": "c"}) is None
    assert server_collection({"engine": "qdrant", "url": "http://h/x/..", "collection": "c"}) == (
        "qdrant",
        "http://h:80",
        "c",
    )


def test_each_tenant_has_a_folder_of_its_own(tmp_path: Path) -> None:
    assert tenant_folder("ten_0001", "local") == "local"
    assert tenant_folder("ten_0001", "acme-search.eu") == "acme-search.eu"
    # Names that are no plain folder, or could be mistaken for another tenant's, give the id.
    for name in ("..", ".hidden", "Acme", "a/b", "a\\b", "ten_0002", "", "x" * 65, "é"):
        assert tenant_folder("ten_0001", name) == "ten_0001", name
    assert tenant_root(tmp_path, "local") == tmp_path / "local"
    assert tenant_root(tmp_path, "ten_00ab") == tmp_path / "ten_00ab"
    for folder in (None, "", ".", "..", "../x", "a/b", "/etc"):
        assert tenant_root(tmp_path, folder) is None, folder
