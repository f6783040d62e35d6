"""A real Milvus server for the tests: Milvus 2.3.5 standalone from PyPI's ``milvus`` package,
started by ``bench.common.milvus_standalone`` (the launcher, shared with the benchmarks on a
server; its names are imported here too, as the tests have always found them).

It is a real Milvus server, unlike milvus-lite (``milvus_lite``: the engine files of the tests,
and the gRPC server process ``bench.perf.api_memory.milvus_server``), so it shows what
milvus-lite hides (issue 46, each handled where it matters): no nullable fields and one vector
field per collection (``app.vectors.milvus.engine``); a collection created without a consistency
level reads at Bounded, so a read right after a write may miss it (the service reads Strong; so
must the tests' own reads of such collections); query rows in primary-key order, not in
insertion order (``MilvusGallery.row_batches``); no default ``efConstruction`` for HNSW; an empty
filter refused without a limit; no ``add_collection_field`` (``app.vectors.milvus.sibling``).

One server per test process (``shared_uri``), started on first use and stopped when the session
ends (``milvus_server_uri``): it starts in about 10 s on 2 cores, and its embedded etcd listens on
the fixed peer port 2380, so two servers could not run side by side anyway. Tests isolate
themselves by collection name and drop what they made (``dropped_after``).

Where the server cannot start, the fixture skips, with the reason; with
``NOBACKFILL_TEST_MILVUS_SERVER=1`` (set by ``.ci/run``) it fails instead, so CI cannot pass
without having run the real-server variants.

``python -m tests.service.milvus_server [--port 19530] [--data DIR]`` (the launcher's ``main``)
runs one in the foreground for a developer (``make milvus-server``) and prints its URI.
"""

from __future__ import annotations

import atexit
import os
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
from pymilvus import MilvusClient

from bench.common.milvus_standalone import (  # noqa: F401  (the launcher's names, kept here)
    ETCD_PEER_PORT,
    START_TIMEOUT_S,
    STOP_TIMEOUT_S,
    STOP_WITH_PARENT,
    WRAPPER_GAVE_UP,
    ServerUnavailable,
    main,
    milvus_standalone,
    server_script,
    standalone_process,
)

REQUIRED_ENV = "NOBACKFILL_TEST_MILVUS_SERVER"
# The tests' server syncs its time tick every 20 ms instead of 200: a Strong read waits for the
# next tick, so with the default each read took about 0.2 s (ten ``count`` calls: 2.0 s against
# 0.3 s), which made the real-server variants several times slower; nothing else changes.
TEST_CONFIG = ("proxy.timeTickInterval=20",)


class _Shared:
    """The test process's one server (see the module docstring)."""

    def __init__(self) -> None:
        self.uri: str | None = None
        self.error: ServerUnavailable | None = None
        self._running = ExitStack()

    def start(self) -> str:
        if self.uri is not None:
            return self.uri
        if self.error is not None:
            # A failed start is not retried per test: it costs up to START_TIMEOUT_S each time.
            raise self.error
        # About 0.5 GB once the binary is unpacked and a few tests ran: removed with the server.
        data_dir = self._running.enter_context(
            tempfile.TemporaryDirectory(prefix="nobackfill-milvus-standalone-")
        )
        try:
            self.uri, _version = self._running.enter_context(
                milvus_standalone(Path(data_dir), config=TEST_CONFIG)
            )
        except ServerUnavailable as error:
            self.error = error
            self._running.close()
            raise
        # A session that ends without tearing its fixtures down still stops the server.
        atexit.register(self.stop)
        return self.uri

    def stop(self) -> None:
        self.uri = None
        self._running.close()


_shared = _Shared()


def shared_uri() -> str:
    """The URI of the test process's server, started on first use; skips (or, with
    ``NOBACKFILL_TEST_MILVUS_SERVER=1``, fails) where it cannot start."""
    try:
        return _shared.start()
    except ServerUnavailable as error:
        if os.environ.get(REQUIRED_ENV) == "1":
            pytest.fail(f"{REQUIRED_ENV}=1 but the Milvus standalone server did not start: {error}")
        pytest.skip(f"no Milvus standalone server here ({error}); {REQUIRED_ENV}=1 makes this fail")


@pytest.fixture(scope="session")
def milvus_server_uri() -> Iterator[str]:
    """The shared server's URI. Modules import this fixture; each import is a fixture of its
    own to pytest, but all of them share ``_shared``'s one server, stopped at the session's end
    by whichever is torn down first."""
    yield shared_uri()
    _shared.stop()


@contextmanager
def dropped_after(uri: str) -> Iterator[MilvusClient]:
    """A client of the server; the collections created meanwhile are dropped on exit, so that
    tests sharing the server neither see each other's collections nor fill its memory (a loaded
    collection stays in the server's query node)."""
    client = MilvusClient(uri=uri)
    before = set(client.list_collections())
    try:
        yield client
    finally:
        for name in set(client.list_collections()) - before:
            client.drop_collection(name)
        client.close()


if __name__ == "__main__":
    main()
