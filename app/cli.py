"""``nobackfill``: serve the API, migrate the database, create API keys."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nobackfill", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the HTTP API (settings from NOBACKFILL_*)")
    serve.add_argument("--host", help="default: NOBACKFILL_HOST (127.0.0.1)")
    serve.add_argument("--port", type=int, help="default: NOBACKFILL_PORT (8000)")
    sub.add_parser("migrate", help="apply the database migrations (alembic upgrade head)")
    create = sub.add_parser("create-key", help="print a new API key (creates the tenant if new)")
    create.add_argument("--tenant", required=True, help="tenant name")
    create.add_argument("--name", default="", help="a label for the key")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    from app.core.settings import get_settings

    settings = get_settings()
    if args.command == "serve":
        import uvicorn

        from app.main import create_app

        uvicorn.run(
            create_app(settings),
            host=args.host or settings.host,
            port=args.port or settings.port,
            log_level=settings.log_level,
        )
        return 0

    from app.core.db import Database, migrate

    migrate(settings.resolved_database_url)
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


if __name__ == "__main__":
    raise SystemExit(main())
