"""The administrative commands: user tokens (``token create``, ``token list``, ``token revoke``)
and a run's audit trail (``audit``)."""

from __future__ import annotations

import argparse
import json
import sys
import time

from adapter.config import ConfigError, check_config, save_token
from adapter.show.render import audit_lines, tokens_table
from protocol_specs.access.auth import Scope, TokenInfo
from relay.client import open_control

from .errors import control_call, store_at
from .settings import resolve_relay

__all__ = ["cmd_audit", "cmd_token_create", "cmd_token_list", "cmd_token_revoke"]


def _scopes(args: argparse.Namespace) -> list[Scope]:
    return sorted({Scope(name) for name in (args.scope or ["runs"])})


async def cmd_token_create(args: argparse.Namespace) -> int:
    if args.save:  # a config file it cannot write into: said before a token is made for nothing
        try:
            check_config()
        except ConfigError as exc:
            raise SystemExit(f"tether: {exc}") from None
    if args.redis:  # straight into the store: the first admin token of a new relay
        import getpass

        from relay.auth import TokenStore

        async with store_at(args.redis) as store:
            token, record = await TokenStore(store).create(
                args.user or getpass.getuser(),
                scopes=_scopes(args),
                label=args.label,
                expires_in=args.expires,
                created_by="tether token create --redis",
            )
        info: TokenInfo = record.info()
    else:
        async with open_control(resolve_relay(args.relay, args), client="tether-cli") as control:
            token, info = await control_call(
                control.create_token(
                    user=args.user, scopes=_scopes(args), label=args.label, expires_in=args.expires
                )
            )
    what = f"token {info.id} for {info.user} ({', '.join(info.scopes)})"
    if args.save:
        try:
            where = save_token(token, getattr(args, "profile", None) or "default")
        except (ConfigError, OSError) as exc:
            raise SystemExit(f"tether: cannot save the token: {exc}") from None
        print(f"tether: {what} saved in {where}")
    else:
        print(token)
        print(f"tether: {what}; shown once: keep it like a password", file=sys.stderr)
    return 0


async def cmd_token_list(args: argparse.Namespace) -> int:
    async with open_control(resolve_relay(args.relay, args), client="tether-cli") as control:
        tokens = await control_call(control.list_tokens(args.user))
    if args.json:
        print(json.dumps([t.model_dump(mode="json") for t in tokens], indent=2))
        return 0
    print(tokens_table(tokens, time.time()))
    return 0


async def cmd_token_revoke(args: argparse.Namespace) -> int:
    async with open_control(resolve_relay(args.relay, args), client="tether-cli") as control:
        info = await control_call(control.revoke_token(args.id))
    print(f"tether: token {info.id} of {info.user} revoked")
    return 0


async def cmd_audit(args: argparse.Namespace) -> int:
    async with open_control(resolve_relay(args.relay, args), client="tether-cli") as control:
        entries = await control_call(control.audit(args.run))
    if args.json:
        print(json.dumps([e.model_dump(mode="json") for e in entries], indent=2))
        return 0
    for line in audit_lines(entries):
        print(line)
    return 0
