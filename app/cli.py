"""nobackfill: the server's commands (serve, migrate, create-key) and the client's (galleries,
datasets, upgrades, backfill, search, export, reports, keys) against a running server.

Client commands talk HTTP only: they import neither torch nor the service, so they start fast.
The server is --url (or NOBACKFILL_URL; by default the URL `nobackfill serve` recorded in
$NOBACKFILL_DATA_DIR/server_url, ./data/server_url; with none of them the command says how to
name one instead of guessing a port), the API key --key (or
NOBACKFILL_KEY; for a server on this machine, by default the key `nobackfill serve` stored in
$NOBACKFILL_DATA_DIR/api_key, ./data/api_key)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

SERVER_COMMANDS = ("serve", "migrate", "create-key")


def _client_parents() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """Options every client command takes. SUPPRESS keeps a value given before the command
    (``nobackfill --url U gallery get G``) when the command does not repeat it."""
    connection = argparse.ArgumentParser(add_help=False)
    connection.add_argument("--url", default=argparse.SUPPRESS, help="server (NOBACKFILL_URL)")
    connection.add_argument("--key", default=argparse.SUPPRESS, help="API key (NOBACKFILL_KEY)")
    output = argparse.ArgumentParser(add_help=False)
    output.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    return connection, output


def _add_upload_options(parser: argparse.ArgumentParser, *aliases: str) -> None:
    parser.add_argument(
        "--batch-size",
        *aliases,
        dest="batch_size",
        type=int,
        help="rows per request (default: as many as 10,000 rows and 32 MiB allow; "
        "lowered by itself when the server answers 413)",
    )
    parser.add_argument(
        "--no-resume",
        dest="resume",
        action="store_false",
        help="send every row, ignoring what an interrupted run of this upload acknowledged",
    )


def _add_client_commands(sub: argparse._SubParsersAction) -> None:
    conn, out = _client_parents()
    both = [conn, out]

    gallery = sub.add_parser("gallery", help="create, show or fill a gallery of old vectors")
    gallery_sub = gallery.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = gallery_sub.add_parser("create", parents=both, help="create a gallery")
    create.add_argument("--name", required=True)
    create.add_argument("--dim", type=int, help="the old vectors' dimension (external gallery)")
    create.add_argument("--model-name", help="the old model's name (external gallery)")
    create.add_argument("--metric", choices=["cosine", "dot"], help="external gallery")
    create.add_argument("--model", dest="model_id", help="a trained model (model-bound gallery)")
    create.add_argument("--modality", help="model-bound gallery: the model's modality")
    create.add_argument("--index", choices=["flat", "ivf", "hnsw"], help="default: flat (exact)")
    create.add_argument("--idempotency-key", help="retrying with the same key creates one gallery")
    create.set_defaults(handler="gallery_create")
    show = gallery_sub.add_parser("get", parents=both, help="show a gallery")
    show.add_argument("gallery")
    show.set_defaults(handler="gallery_get")
    upload = gallery_sub.add_parser(
        "upload", parents=both, help="upsert vectors by id from .npy files (batched, resumable)"
    )
    upload.add_argument("gallery")
    upload.add_argument("--ids", required=True, help=".npy of N strings")
    rows = upload.add_mutually_exclusive_group(required=True)
    rows.add_argument("--vectors", help=".npy float N×D (model-bound gallery: features)")
    rows.add_argument(
        "--features",
        help="with --model: .npy float N×D, the new backbone's features of items the gallery "
        "holds (re-embedded items of a migration; their old vectors stay)",
    )
    upload.add_argument("--model", help="the backbone model the --features are re-embedded for")
    upload.add_argument("--labels", help=".npy of N strings")
    upload.add_argument(
        "--texts", help=".npy of N strings: each item's document text (for two-stage search)"
    )
    _add_upload_options(upload)
    upload.set_defaults(handler="gallery_upload")
    listing = gallery_sub.add_parser("list", parents=both, help="list this tenant's galleries")
    listing.set_defaults(handler="gallery_list")

    access = sub.add_parser("access", help="add a gallery's access counts (what users opened)")
    access_sub = access.add_subparsers(dest="action", required=True, metavar="ACTION")
    counts = access_sub.add_parser(
        "upload",
        parents=both,
        help="add access counts from .npy files (batched; never retried: counts add up)",
    )
    counts.add_argument("gallery")
    counts.add_argument("--ids", required=True, help=".npy of N strings (a repeated id sums)")
    counts.add_argument("--counts", required=True, help=".npy of N non-negative integers")
    counts.add_argument("--batch-size", type=int, help="rows per request (default: 10,000)")
    counts.set_defaults(handler="access_upload")

    dataset = sub.add_parser("dataset", help="create, show or fill a dataset of new features")
    dataset_sub = dataset.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = dataset_sub.add_parser("create", parents=both, help="create a dataset")
    create.add_argument("--name", required=True)
    create.add_argument("--gallery", help="the gallery whose item ids (and vectors) it pairs")
    create.add_argument(
        "--modality", dest="modalities", action="append", help="repeat for several modalities"
    )
    create.add_argument("--idempotency-key")
    create.set_defaults(handler="dataset_create")
    listing = dataset_sub.add_parser("list", parents=both, help="list this tenant's datasets")
    listing.set_defaults(handler="dataset_list")
    show = dataset_sub.add_parser("get", parents=both, help="show a dataset")
    show.add_argument("dataset")
    show.set_defaults(handler="dataset_get")
    upload = dataset_sub.add_parser(
        "upload", parents=both, help="upsert items by id from .npy files (batched, resumable)"
    )
    upload.add_argument("dataset")
    upload.add_argument("--ids", required=True, help=".npy of N strings (the gallery's ids)")
    upload.add_argument("--features", required=True, help=".npy float N×D, the new backbone's")
    upload.add_argument("--labels", help=".npy of N strings")
    _add_upload_options(upload)
    upload.set_defaults(handler="dataset_upload")
    queries = dataset_sub.add_parser(
        "queries", parents=both, help="add logged queries (new features, old vectors, relevant ids)"
    )
    queries.add_argument("dataset")
    queries.add_argument("--ids", required=True, help=".npy of Q strings (query ids)")
    queries.add_argument("--features", required=True, help=".npy float Q×D, the new backbone's")
    queries.add_argument("--old-vectors", help=".npy float Q×d, the same queries' old vectors")
    queries.add_argument(
        "--relevant",
        help="a JSON file: a list (one list of gallery ids per query, in order) or an object "
        "{query id: [ids]}",
    )
    _add_upload_options(queries)
    queries.set_defaults(handler="dataset_queries")

    upgrade = sub.add_parser(
        "upgrade",
        parents=both,
        help="train an upgrade from a dataset (`upgrade list`: the upgrade jobs)",
        usage="%(prog)s --dataset DATASET [options]\n       %(prog)s list [--status S] [--json]",
    )
    # Required unless `upgrade list` (checked in main: argparse cannot say "unless").
    upgrade.add_argument("--dataset", help="required: the dataset to train on")
    upgrade.add_argument(
        "--method", default=None, help="see `nobackfill methods` (default: the server's, auto)"
    )
    upgrade.add_argument("--objective", help="what model selection optimises (server's default)")
    upgrade.add_argument(
        "--old-model-gone",
        action="store_true",
        help="the old model can no longer embed queries: the verdict leaves out stay and "
        "transition",
    )
    upgrade.add_argument("--params", help="trainer parameters: JSON text, or @file.json")
    upgrade.add_argument("--gallery", help="the old gallery (default: the dataset's)")
    upgrade.add_argument("--base-model", help="continual upgrades: the version to continue")
    upgrade.add_argument("--seed", type=int)
    upgrade.add_argument("--eval-fraction", type=float, help="held-out share (server default 0.2)")
    upgrade.add_argument("--idempotency-key")
    _add_wait_options(upgrade)
    upgrade.set_defaults(handler="upgrade_create")
    _add_migration_commands(sub, upgrade, both)

    status = sub.add_parser("status", parents=both, help="show an upgrade job (or wait for it)")
    status.add_argument("upgrade")
    _add_wait_options(status)
    status.set_defaults(handler="upgrade_status")
    cancel = sub.add_parser("cancel", parents=both, help="cancel an upgrade job")
    cancel.add_argument("upgrade")
    cancel.set_defaults(handler="upgrade_cancel")

    model = sub.add_parser("model", help="the trained models")
    model_sub = model.add_subparsers(dest="action", required=True)
    listing = model_sub.add_parser("list", parents=both, help="list this tenant's models")
    listing.set_defaults(handler="model_list")
    methods = sub.add_parser("methods", parents=both, help="the upgrade methods this server offers")
    methods.set_defaults(handler="methods")

    search = sub.add_parser("search", parents=both, help="search a gallery with query rows")
    search.add_argument("gallery")
    search.add_argument("--queries", required=True, help=".npy float N×D")
    search.add_argument("--k", type=int, default=10, help="neighbours per query (10)")
    search.add_argument("--model", help="a trained model: the queries are its input features")
    search.add_argument("--modality", help="the model's modality, when it has several")
    search.add_argument(
        "--old-queries",
        help="with --model: the old model's .npy rows of the same queries (a transition search "
        "while the gallery is partly re-embedded)",
    )
    search.add_argument(
        "--rerank-depth",
        type=int,
        help="with --model: a two-stage search — this many candidates per query from the old "
        "index, ranked by the new model (embedded lazily by the model's embedder)",
    )
    search.add_argument(
        "--rerank", action="store_true", help="a two-stage search at the server's default depth"
    )
    search.add_argument("-o", "--output", help="write the results to .json or .npz")
    search.set_defaults(handler="search")

    export = sub.add_parser("export", parents=[conn], help="download a model for your own stack")
    export.add_argument("model")
    export.add_argument("--format", default="onnx", help="onnx (a zip: graph and manifest.json)")
    export.add_argument("-o", "--output", required=True, help="file to write")
    export.set_defaults(handler="export")

    report = sub.add_parser("report", parents=[conn], help="download an upgrade's HTML report")
    report.add_argument("upgrade")
    report.add_argument("-o", "--output", required=True, help="file to write (report.html)")
    report.set_defaults(handler="report")

    key = sub.add_parser("key", help="create, list or revoke this tenant's API keys (admin key)")
    key_sub = key.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = key_sub.add_parser(
        "create", parents=both, help="create a key and print it (shown this once only)"
    )
    create.add_argument("--name", help="a label to tell keys apart")
    create.add_argument("--admin", action="store_true", help="it may manage keys too")
    create.set_defaults(handler="key_create")
    listing = key_sub.add_parser("list", parents=both, help="list keys (never the keys)")
    listing.add_argument(
        "--all", dest="include_revoked", action="store_true", help="revoked keys too"
    )
    listing.set_defaults(handler="key_list")
    revoke = key_sub.add_parser(
        "revoke", parents=both, help="revoke a key (not the last admin key)"
    )
    revoke.add_argument("key_id", metavar="KEY_ID")
    revoke.set_defaults(handler="key_revoke")


def _add_migration_commands(
    sub: argparse._SubParsersAction,
    upgrade: argparse.ArgumentParser,
    both: list[argparse.ArgumentParser],
) -> None:
    """``backfill plan|upload`` and ``upgrade list`` (app.client.migration_commands)."""
    upgrade_sub = upgrade.add_subparsers(dest="action", required=False, metavar="[list]")
    listing = upgrade_sub.add_parser("list", parents=both, help="list the upgrade jobs")
    listing.add_argument(
        "--status", choices=["queued", "running", "succeeded", "failed", "cancelled"]
    )
    listing.set_defaults(handler="upgrade_list")

    backfill = sub.add_parser(
        "backfill", help="re-embed part of a gallery: plan the next items, upload them"
    )
    backfill_sub = backfill.add_subparsers(dest="action", required=True, metavar="ACTION")
    plan = backfill_sub.add_parser(
        "plan", parents=both, help="the next items to re-embed, most valuable first (.npy)"
    )
    plan.add_argument("gallery")
    plan.add_argument("--model", required=True, help="the upgrade's model (the new backbone's)")
    size = plan.add_mutually_exclusive_group(required=True)
    size.add_argument(
        "--fraction",
        type=float,
        help="share of the gallery re-embedded once the planned items are (0–1)",
    )
    size.add_argument("--count", type=int, help="how many more items to plan")
    plan.add_argument("-o", "--output", help="write the planned ids here (.npy of strings)")
    plan.set_defaults(handler="backfill_plan")
    upload = backfill_sub.add_parser(
        "upload",
        parents=both,
        help="upload re-embedded items' new-backbone features (batched, resumable)",
    )
    upload.add_argument("gallery")
    upload.add_argument("--model", required=True, help="the model the features are for")
    upload.add_argument("--ids", required=True, help=".npy of N strings (e.g. backfill plan -o)")
    upload.add_argument("--features", required=True, help=".npy float N×D, the new backbone's")
    _add_upload_options(upload, "--batch")
    upload.set_defaults(handler="backfill_upload")


def _add_wait_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--wait", action="store_true", help="follow the job to its end; exit 1 unless it succeeds"
    )
    parser.add_argument("--timeout", type=float, help="with --wait: give up after this many s")
    parser.add_argument("--poll", type=float, default=1.0, help="with --wait: seconds per poll")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nobackfill",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--url", default=None, help="server (NOBACKFILL_URL)")
    parser.add_argument("--key", default=None, help="API key (NOBACKFILL_KEY)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = sub.add_parser("serve", help="run the HTTP API (settings from NOBACKFILL_*)")
    serve.add_argument("--host", help="default: NOBACKFILL_HOST (127.0.0.1)")
    serve.add_argument("--port", type=int, help="default: NOBACKFILL_PORT (8000)")
    conn, out = _client_parents()
    migrate = sub.add_parser(
        "migrate",
        parents=[conn, out],
        help="without GALLERY: apply the database migrations (alembic upgrade head); with "
        "GALLERY: re-embed its stored texts on the server with the model's embedder",
        description="`nobackfill migrate` (no GALLERY), on the server: apply the database "
        "migrations. `nobackfill migrate GALLERY --model M [--auto | --fraction F]`, a client "
        "command: a re-embed job sends the gallery's stored texts through the model's embedder "
        "and stores the new vectors, in the backfill plan's order, with a progress bar.",
    )
    migrate.add_argument("gallery", nargs="?", help="the gallery to migrate (client command)")
    migrate.add_argument("--model", help="the upgrade's model, with an embedder (PATCH models)")
    migrate.add_argument(
        "--auto",
        action="store_true",
        help="follow the model's verdict: transition → its suggested share, reindex → all; "
        "refused (exit 1) where the verdict advises no re-embedding",
    )
    migrate.add_argument("--fraction", type=float, help="share of the gallery to re-embed (0–1]")
    migrate.add_argument("--order", choices=["plan", "gallery"], help="default: plan")
    migrate.add_argument("--batch", dest="batch_size", type=int, help="texts per embedder call")
    migrate.add_argument("--rate", dest="items_per_minute", type=int, help="items per minute")
    migrate.add_argument("--no-wait", action="store_true", help="queue the job and return")
    migrate.add_argument("--timeout", type=float, help="give up waiting after this many s")
    migrate.add_argument("--poll", type=float, default=1.0, help="seconds per poll")
    migrate.add_argument("--idempotency-key", help="retrying with the same key queues one job")
    migrate.set_defaults(handler="migrate_gallery")
    create = sub.add_parser(
        "create-key", help="print a new admin API key (creates the tenant if new)"
    )
    create.add_argument("--tenant", required=True, help="tenant name")
    create.add_argument("--name", default="", help="a label for the key")
    _add_client_commands(sub)
    return parser


def _record_url(path: Path, host: str, port: int) -> None:
    """Beside the key: the URL a client on this machine reaches this server at (a server bound to
    every interface is reached on the loopback), so ``nobackfill …`` finds a server started on
    another port. NOBACKFILL_URL and --url still win."""
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"http://{host}:{port}\n", encoding="utf-8")


def uvicorn_options(settings: Any) -> dict[str, Any]:
    """How ``nobackfill serve`` runs uvicorn: bounded request headers (size and time) and
    connections per client address (trusted proxies exempt), and
    X-Forwarded-For believed only from the configured proxies (uvicorn's own default trusts
    127.0.0.1, which let a local client choose the address its failed keys were counted
    under)."""
    from app.api.http_protocol import bounded_protocol

    proxies = list(settings.trusted_proxies)
    return {
        # httptools with bounds on headers' size and time (app.api.http_protocol).
        "http": bounded_protocol(
            settings.max_header_bytes,
            settings.header_timeout_s,
            settings.max_connections_per_address,
            proxies,
        ),
        "log_level": settings.log_level,
        "proxy_headers": bool(proxies),
        "forwarded_allow_ips": ",".join(proxies) if proxies else "",
    }


def _server_command(args: argparse.Namespace) -> int:
    from app.core.settings import get_settings

    settings = get_settings()
    if args.command == "serve":
        import uvicorn

        from app.main import create_app

        host, port = args.host or settings.host, args.port or settings.port
        _record_url(settings.local_url_file, host, port)
        uvicorn.run(create_app(settings), host=host, port=port, **uvicorn_options(settings))
        return 0

    import app.db_models  # noqa: F401  (the table registry: Database needs every mapped class)
    from app.core.db import Database, MigrationTimeout, migrate

    try:
        migrate(settings.resolved_database_url, settings=settings)
    except MigrationTimeout as exc:
        print(f"nobackfill: {exc}", file=sys.stderr)
        return 1
    if args.command == "migrate":
        return 0
    from app.auth.service import create_key

    db = Database(settings)
    try:
        with db.session() as session:
            created = create_key(session, args.tenant, args.name)
    finally:
        db.dispose()
    sys.stdout.write(
        f"tenant: {created.tenant_name} ({created.tenant_id})\nAPI key: {created.key}\n"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "migrate" and args.gallery is not None:
        if not args.model:
            parser.error("migrate GALLERY: the following arguments are required: --model")
    elif args.command in SERVER_COMMANDS:
        return _server_command(args)
    if args.handler == "upgrade_create" and args.dataset is None:
        parser.error("upgrade: the following arguments are required: --dataset (or: upgrade list)")
    from app.client.commands import run
    from app.client.migration_commands import HANDLERS

    return run(args, HANDLERS)


if __name__ == "__main__":
    raise SystemExit(main())
