"""A Milvus collection attached as a gallery's source: where it is, one client per place, and
what the service may open — the Milvus twin of ``app.vectors.qdrant.source``.

A gallery with ``vector_storage = "milvus_attached"`` keeps no vector of its own: its ``source``
(a JSON column) names a Milvus server (``uri`` an http(s) URL) or a milvus-lite file (``uri`` a
path ending in ``.db``), the collection, its primary-key field (INT64 or VARCHAR: the item ids)
and its FLOAT_VECTOR field, indexed for COSINE. The service only reads it
(``app.vectors.milvus.attach.AttachedCollection``).

Multi-tenant rules (``app.vectors.source_rules``), checked on attach and again on every open:

* a file ``uri`` must lie under the tenant's own folder of
  ``settings.resolved_milvus_attach_root`` (``source_rules.tenant_folder``, recorded as
  ``folder``; symlinks resolved) and exist (milvus-lite would create a missing one);
* a server ``uri`` must match an entry of ``settings.milvus_allowed_urls`` (none by default);
* ``token_env`` must be ``settings.milvus_token_env_prefix`` or start with it;
* the service's own Milvus store (``milvus_uri``) is never a source, nor a collection the service
  created (a gallery's, or an in-place migration's ``<collection>__nobackfill_<model>``): another
  tenant's vectors live there.

Metric: attached galleries are cosine galleries (the methods lift unit vectors), so the vector
field must be indexed for COSINE. IP on vectors that happen to be unit length would rank alike,
but nothing in the collection guarantees they are, and an IP index over vectors of several norms
ranks by norm too: refused rather than trusted.

milvus-lite opens a file in one process only: the process keeps one client per place and
serialises calls to a file's.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pymilvus import MilvusClient
from pymilvus.exceptions import MilvusException

from app.core.errors import Problem, invalid, unavailable
from app.core.settings import Settings
from app.vectors import source_rules
from app.vectors.milvus.attach import AttachedCollection, AttachError
from app.vectors.milvus.engine import PROPERTY, is_remote
from app.vectors.source_rules import (
    env_secret,
    normalized_url,
    tenant_root,
    under_root,
    url_allowed,
)

# In-place migrations write a model's vectors into ``<collection><MIGRATION_INFIX><model id>``
# (``app.vectors.milvus.sibling``): never a gallery's own collection.
MIGRATION_INFIX = "__nobackfill_"
# Seconds a client is told to wait before retrying after the collection could not be reached.
RETRY_AFTER_S = 5
LITE_SUFFIX = ".db"
LITE_CATALOGUE = "collections"
# The metric every attached gallery needs (see the module docstring).
METRIC = "COSINE"


@dataclass(frozen=True)
class MilvusSource:
    uri: str
    collection: str
    id_field: str
    vector_field: str
    metric: str = METRIC
    token_env: str | None = None
    id_type: str | None = None  # "INT64" or "VARCHAR", learnt on attach
    # With a file ``uri``: the owning tenant's folder under the root (``source_rules.tenant_folder``).
    folder: str | None = None
    # The VARCHAR field holding each row's document text (``app.vectors.milvus.texts``).
    text_field: str | None = None

    @classmethod
    def of(cls, source: dict[str, Any]) -> MilvusSource:
        return cls(
            uri=source["uri"],
            collection=source["collection"],
            id_field=source["id_field"],
            vector_field=source["vector_field"],
            metric=source.get("metric", METRIC),
            token_env=source.get("token_env"),
            id_type=source.get("id_type"),
            folder=source.get("folder"),
            text_field=source.get("text_field"),
        )

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "engine": "milvus",
            "uri": self.uri,
            "collection": self.collection,
            "id_field": self.id_field,
            "vector_field": self.vector_field,
            "metric": self.metric,
        }
        if self.token_env is not None:
            out["token_env"] = self.token_env
        if self.id_type is not None:
            out["id_type"] = self.id_type
        if self.text_field is not None:
            out["text_field"] = self.text_field
        if not self.remote:
            out["folder"] = self.folder
        return out

    @property
    def remote(self) -> bool:
        return is_remote(self.uri)

    @property
    def string_ids(self) -> bool:
        return self.id_type == "VARCHAR"


@dataclass(frozen=True)
class CollectionShape:
    dim: int
    count: int
    id_type: str


Connection = source_rules.Connection[MilvusClient]
_connections: source_rules.Connections[MilvusClient] = source_rules.Connections()


def lite_file(settings: Settings, tenant: str | None, uri: str) -> Path:
    """The milvus-lite file ``uri`` names (relative: under the tenant's folder ``tenant`` of the
    root), refused outside that folder, when missing, or when it is the service's own store."""
    root = tenant_root(settings.resolved_milvus_attach_root, tenant)
    if root is None:
        raise invalid(
            "source.uri",
            "this source was attached before each tenant had its own folder and may name "
            "another tenant's store: move the file under your tenant's folder of "
            "NOBACKFILL_MILVUS_ATTACH_ROOT and attach it again",
        )
    path = under_root(root, uri)
    if path is None or path == root:
        raise invalid(
            "source.uri",
            f"a milvus-lite file must lie under this tenant's folder {root} "
            f"(NOBACKFILL_MILVUS_ATTACH_ROOT/{tenant}); a relative path is taken from there",
        )
    # milvus-lite 3 keeps a store as a folder named ….db holding its catalogue (2.x: one file
    # of that name); any other folder would be made a store by opening it.
    try:
        store = path.is_file() or (path / LITE_CATALOGUE).is_dir()
    except OSError:  # a name too long for the disk: no store
        store = False
    if path.suffix != LITE_SUFFIX or not store:
        raise invalid("source.uri", f"{uri!r} is not a milvus-lite file (an existing ….db)")
    if settings.milvus_lite and Path(settings.resolved_milvus_uri).resolve() == path:
        raise invalid("source.uri", "the service's own Milvus store cannot be attached")
    return path


def allowed_server(settings: Settings, uri: str) -> None:
    """422 unless ``uri`` falls under an entry of ``milvus_allowed_urls``, or when it is the
    service's own Milvus server."""
    if not url_allowed(settings.milvus_allowed_urls, uri):
        raise invalid(
            "source.uri",
            "not an allowed Milvus server (NOBACKFILL_MILVUS_ALLOWED_URLS lists them; "
            f"{len(settings.milvus_allowed_urls)} allowed)",
        )
    if not settings.milvus_lite and url_allowed([settings.resolved_milvus_uri], uri):
        raise invalid("source.uri", "the service's own Milvus server cannot be attached")


def token(settings: Settings, name: str | None) -> str:
    return env_secret(settings.milvus_token_env_prefix, name, "source.token_env") or ""


def connection(settings: Settings, source: MilvusSource) -> Connection:
    """The process's client for the source's place, opened on first use."""
    if source.remote:
        allowed_server(settings, source.uri)
        # The spelling that was checked is the one the client connects to.
        uri = normalized_url(source.uri) or source.uri
        key: tuple[str, ...] = ("url", uri, source.token_env or "")
    else:
        key = ("file", str(lite_file(settings, source.folder, source.uri)))
    return _connections.get(key, lambda: _open(settings, key, source))


def _open(settings: Settings, key: tuple[str, ...], source: MilvusSource) -> Connection:
    """A client of the place. pymilvus connects at once (unlike qdrant-client): a server out of
    reach, or a milvus-lite store another process holds, answers 503 here, on whichever request
    first opens the place (``describe`` turns it into the attach's 422)."""
    secret = token(settings, source.token_env) if key[0] == "url" else ""
    try:
        client = MilvusClient(uri=key[1], token=secret, timeout=settings.milvus_attach_timeout_s)
    except MilvusException as exc:
        where = "server" if key[0] == "url" else "milvus-lite store"
        raise unavailable(
            f"the gallery's Milvus {where} ({source.collection!r}) is unreachable; retry "
            f"shortly: {exc}",
            RETRY_AFTER_S,
        ) from exc
    return Connection(client, local=key[0] == "file")


def close_connections() -> None:
    """The app stopping: close every client (a milvus-lite file's lock goes with it)."""
    _connections.close(lambda client: client.close())


def is_unreachable(exc: BaseException) -> bool:
    """A transport failure (refused, timed out, lost) as opposed to an answer."""
    import grpc
    from pymilvus.client.types import Status
    from pymilvus.exceptions import ConnectError, MilvusUnavailableException

    if isinstance(exc, MilvusUnavailableException | ConnectError | ConnectionError | TimeoutError):
        return True
    if isinstance(exc, grpc.RpcError) and hasattr(exc, "code"):
        return exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    if isinstance(exc, MilvusException):
        # pymilvus's own wording for a lost server and for retries that ran out of time.
        return exc.code == Status.CONNECT_FAILED or "Retry timeout" in str(exc.message)
    return False


def reachable(source: MilvusSource) -> contextlib.AbstractContextManager[None]:
    """While the service uses the collection: transport failures answer 503 (retry later)."""
    return source_rules.unreachable_is_503(
        is_unreachable,
        f"the gallery's Milvus collection {source.collection!r} is unreachable; retry shortly",
        RETRY_AFTER_S,
    )


def reader(conn: Connection, source: MilvusSource, dim: int) -> AttachedCollection:
    """A reader of an attached gallery's collection (checked on attach: no request here)."""
    return AttachedCollection.known(
        conn.client,
        source.collection,
        source.id_field,
        source.vector_field,
        dim,
        source.string_ids,
        source.metric,
    )


def describe(settings: Settings, source: MilvusSource) -> CollectionShape:
    """Check the collection can serve as a cosine gallery; 422 naming the field otherwise."""
    if source.metric != METRIC:
        raise invalid(
            "source.metric",
            f"attached galleries need {METRIC} (the methods lift unit vectors); a collection "
            f"searched by {source.metric} can be uploaded as a gallery of its own instead",
        )
    if MIGRATION_INFIX in source.collection:
        # A migration's collection holds only the re-embedded items, in the new model's space:
        # searched as a gallery of its own it would mix nothing and miss the rest, unmerged.
        raise invalid(
            "source.collection",
            f"{source.collection!r} holds the service's re-embedded vectors of an in-place "
            "migration; attach the owner's collection and search the re-embedded ones through "
            "a mixed or transition search",
        )
    try:
        conn = connection(settings, source)
    except Problem as exc:
        if exc.status != 503:
            raise
        raise invalid("source.uri", exc.detail) from exc
    try:
        with conn.use() as client:
            found = AttachedCollection(
                source.uri,
                source.collection,
                source.id_field,
                source.vector_field,
                source.metric,
                client=client,
            )
            count = found.count()
    except AttachError as exc:
        raise invalid(f"source.{exc.field}", str(exc)) from exc
    except Problem:
        raise
    except Exception as exc:
        if not is_unreachable(exc):
            raise
        raise invalid("source.uri", f"the Milvus server is unreachable: {exc}") from exc
    if PROPERTY in found.properties:
        raise invalid(
            "source.collection", "a gallery collection of this service cannot be attached"
        )
    return CollectionShape(
        dim=found.dim, count=count, id_type="VARCHAR" if found.string_ids else "INT64"
    )
