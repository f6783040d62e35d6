"""A Qdrant collection attached as a gallery's source: where it is, one client per place, and
what the service may open.

A gallery with ``vector_storage = "qdrant"`` keeps no vector of its own: its ``source`` (a JSON
column) names a Qdrant server (``url``) or an embedded local-mode folder (``path``), the
collection and the named vector (None: the unnamed one). The service only reads it.

Multi-tenant rules, checked on attach and again on every open (a row written before a rule
tightened must not bypass it):

* ``path`` must lie under the tenant's own folder of ``settings.resolved_qdrant_root``
  (``source_rules.tenant_folder``, recorded as ``folder``; symlinks resolved): a tenant cannot
  make the server open an arbitrary folder of its disk, nor another tenant's store, and an
  existing local-mode folder is required (opening a missing one would create it).
* ``url`` must match an entry of ``settings.qdrant_allowed_urls`` (``allowed_url``; none by
  default): otherwise a tenant could make the server connect to any host it can reach (an
  internal service, a cloud metadata address) and read what answers.
* ``api_key_env`` must be ``settings.qdrant_api_key_env_prefix`` or start with it: the key is sent
  to a URL the tenant chose, so naming any other variable (the database URL…) would leak it.

Local mode allows one client per folder at a time (a file lock), and its SQLite handles are not
thread-safe: the process keeps one client per place and serialises calls to a local one.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qdrant_client import QdrantClient, models

from app.core.errors import Problem, invalid
from app.core.settings import Settings
from app.vectors import source_rules
from app.vectors.source_rules import (
    env_secret,
    normalized_url,
    tenant_root,
    under_root,
    url_allowed,
)

# The local-mode folder's catalogue: a folder without it is not a Qdrant folder (and the client
# would create one there).
LOCAL_META = "meta.json"
# Named vectors the in-place migration writes (``app.vectors.qdrant.named``): never a
# gallery's own vector.
MIGRATION_PREFIX = "nobackfill_"
# Seconds a client is told to wait before retrying after the collection could not be reached.
RETRY_AFTER_S = 5


@dataclass(frozen=True)
class QdrantSource:
    collection: str
    url: str | None = None
    path: str | None = None
    vector: str | None = None  # None: the collection's unnamed vector
    api_key_env: str | None = None
    # With ``path``: the owning tenant's folder under the root (``source_rules.tenant_folder``).
    folder: str | None = None
    # The payload key holding each point's document text (``app.vectors.qdrant.texts``).
    text_field: str | None = None

    @classmethod
    def of(cls, source: dict[str, Any]) -> QdrantSource:
        return cls(
            collection=source["collection"],
            url=source.get("url"),
            path=source.get("path"),
            vector=source.get("vector"),
            api_key_env=source.get("api_key_env"),
            folder=source.get("folder"),
            text_field=source.get("text_field"),
        )

    def as_dict(self) -> dict[str, Any]:
        out = {"engine": "qdrant", "collection": self.collection, "vector": self.vector}
        out.update(
            {"url": self.url}
            if self.url is not None
            else {"path": self.path, "folder": self.folder}
        )
        if self.api_key_env is not None:
            out["api_key_env"] = self.api_key_env
        if self.text_field is not None:
            out["text_field"] = self.text_field
        return out


@dataclass(frozen=True)
class CollectionShape:
    dim: int
    count: int


Connection = source_rules.Connection[QdrantClient]
_connections: source_rules.Connections[QdrantClient] = source_rules.Connections()


def local_folder(settings: Settings, tenant: str | None, path: str) -> Path:
    """The local-mode folder ``path`` names (relative: under the tenant's folder ``tenant`` of
    the root), refused outside that folder or when it holds no Qdrant catalogue."""
    root = tenant_root(settings.resolved_qdrant_root, tenant)
    if root is None:
        raise invalid(
            "source.path",
            "this source was attached before each tenant had its own folder and may name "
            "another tenant's store: move the folder under your tenant's folder of "
            "NOBACKFILL_QDRANT_ROOT and attach it again",
        )
    folder = under_root(root, path)
    if folder is None or folder == root:
        raise invalid(
            "source.path",
            f"must lie under this tenant's Qdrant folder {root} (NOBACKFILL_QDRANT_ROOT/"
            f"{tenant}); a relative path is taken from there",
        )
    try:
        catalogue = (folder / LOCAL_META).is_file()
    except OSError:  # a name too long for the disk: no folder
        catalogue = False
    if not catalogue:
        raise invalid("source.path", f"{path!r} is not an embedded Qdrant folder (no {LOCAL_META})")
    return folder


def allowed_url(settings: Settings, url: str) -> None:
    """422 unless ``url`` falls under an entry of ``qdrant_allowed_urls``
    (``source_rules.url_allowed``)."""
    if not url_allowed(settings.qdrant_allowed_urls, url):
        raise invalid(
            "source.url",
            "not an allowed Qdrant server (NOBACKFILL_QDRANT_ALLOWED_URLS lists them; "
            f"{len(settings.qdrant_allowed_urls)} allowed)",
        )


def api_key(settings: Settings, name: str | None) -> str | None:
    return env_secret(settings.qdrant_api_key_env_prefix, name, "source.api_key_env")


def connection(settings: Settings, source: QdrantSource) -> Connection:
    """The process's client for the source's place, opened on first use."""
    if source.path is not None:
        key: tuple[str, ...] = ("path", str(local_folder(settings, source.folder, source.path)))
    else:
        assert source.url is not None
        allowed_url(settings, source.url)
        # The spelling that was checked is the one the client connects to.
        key = ("url", normalized_url(source.url) or source.url, source.api_key_env or "")
    return _connections.get(key, lambda: _open(settings, key, source))


def _open(settings: Settings, key: tuple[str, ...], source: QdrantSource) -> Connection:
    if key[0] == "path":
        try:
            # Calls come from the API's worker threads; ``Connection`` serialises them.
            client = QdrantClient(path=key[1], force_disable_check_same_thread=True)
        except RuntimeError as exc:  # the folder's lock is held by another process
            raise invalid("source.path", f"cannot open the embedded Qdrant folder: {exc}") from exc
        return Connection(client, local=True)
    client = QdrantClient(
        url=key[1],
        api_key=api_key(settings, source.api_key_env),
        timeout=int(settings.qdrant_timeout_s),
        # A plain http:// server URL with a key is a development setup; the client would warn.
        https=key[1].startswith("https://"),
        # The version check is one more request per client, and a warning when it fails.
        check_compatibility=False,
    )
    return Connection(client, local=False)


def close_connections() -> None:
    """The app stopping: close every client (a local-mode folder's lock goes with it)."""
    _connections.close(lambda client: client.close())


def is_unreachable(exc: BaseException) -> bool:
    """A transport failure (refused, timed out, lost) as opposed to an answer."""
    from qdrant_client.http.exceptions import ResponseHandlingException

    return isinstance(exc, ResponseHandlingException | ConnectionError | TimeoutError) or (
        type(exc).__module__.startswith(("httpx", "httpcore", "grpc"))
    )


def reachable(source: QdrantSource) -> contextlib.AbstractContextManager[None]:
    """While the service uses the collection: transport failures answer 503 (retry later)."""
    return source_rules.unreachable_is_503(
        is_unreachable,
        f"the gallery's Qdrant collection {source.collection!r} is unreachable; retry shortly",
        RETRY_AFTER_S,
    )


def describe(settings: Settings, source: QdrantSource) -> CollectionShape:
    """Check the collection can serve as a cosine gallery; 422 naming the field otherwise."""
    conn = connection(settings, source)
    try:
        with conn.use() as client:
            if not client.collection_exists(source.collection):
                raise invalid(
                    "source.collection", f"no collection {source.collection!r} at this source"
                )
            info = client.get_collection(source.collection)
            count = client.count(source.collection, exact=True).count
    except Problem:
        raise
    except Exception as exc:
        if not is_unreachable(exc):
            raise
        where = "source.url" if source.url is not None else "source.path"
        raise invalid(where, f"the Qdrant server is unreachable: {exc}") from exc
    if (source.vector or "").startswith(MIGRATION_PREFIX):
        # A migration's vector holds only the re-embedded points, in the new model's space:
        # searched as a gallery of its own it would mix nothing and miss the rest, unmerged.
        raise invalid(
            "source.vector",
            f"{source.vector!r} holds the service's re-embedded vectors of an in-place "
            "migration; attach the collection's own vector and search the re-embedded ones "
            "through a mixed or transition search",
        )
    params = _vector_params(info.config.params.vectors, source.vector)
    if params.multivector_config is not None:
        raise invalid("source.vector", "a multivector cannot serve as a gallery's vector")
    if params.distance != models.Distance.COSINE:
        raise invalid(
            "source.vector",
            f"the collection's metric is {params.distance.value}; attached galleries need "
            "Cosine (the methods lift unit vectors; upload Dot or Euclid vectors as a gallery "
            "of their own instead)",
        )
    return CollectionShape(dim=int(params.size), count=int(count))


def _vector_params(vectors: Any, name: str | None) -> models.VectorParams:
    if isinstance(vectors, models.VectorParams):
        if name is not None:
            raise invalid(
                "source.vector", f"the collection has one unnamed vector, not {name!r}: omit it"
            )
        return vectors
    named = dict(vectors or {})
    if name is None and "" not in named:
        raise invalid(
            "source.vector", f"the collection's vectors are named: one of {sorted(named)}"
        )
    params = named.get(name or "")
    if params is None:
        raise invalid("source.vector", f"no vector {name!r}; the collection has {sorted(named)}")
    return params
