"""The API keys' client commands: create (the key shown once), list and revoke."""

from __future__ import annotations

import argparse
from typing import Any

from app.client.client import Client
from app.client.command_io import emit


def key_create(client: Client, args: argparse.Namespace) -> int:
    created = client.create_key(args.name, admin=args.admin)
    kind = "admin key" if created["admin"] else "key"
    name = f" {created['name']!r}" if created["name"] else ""
    # The key on a line of its own, once: it is shown by no other command, ever.
    text = f"{created['id']}\t{kind}{name} created\nAPI key: {created['key']}\n"
    text += "(shown only now: store it, the server keeps only its digest)"
    emit(args, created, text)
    return 0


def describe_key(key: dict[str, Any]) -> str:
    fields = [key["id"], f"{key['prefix']}…", "admin" if key["admin"] else "-"]
    fields.append(repr(key["name"]) if key["name"] else "-")
    fields.append(f"created {key['created_at']}")
    if key.get("revoked_at"):
        fields.append(f"revoked {key['revoked_at']}")
    return "\t".join(fields)


def key_list(client: Client, args: argparse.Namespace) -> int:
    keys = client.keys(include_revoked=args.include_revoked)
    text = "\n".join(describe_key(k) for k in keys) or "no keys"
    emit(args, {"items": keys}, text)
    return 0


def key_revoke(client: Client, args: argparse.Namespace) -> int:
    client.revoke_key(args.key_id)
    emit(args, {"id": args.key_id, "revoked": True}, f"{args.key_id}\trevoked")
    return 0
