"""The ``sluicegate`` command: ``local``, ``rules put|get|delete|list|import``, ``check``, ``proxy``.

Example::

    sluicegate local --partitions 4 --port 8080
    sluicegate rules put alice --capacity 1000 --rate 100
    sluicegate rules put alice --capacity 10 --rate 10 --limit name=daily,quota=250,per=day
    sluicegate check alice --cost 5
    sluicegate check alice --cost 5 --max-wait-ms 500
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from sluicegate.config import Config, ConfigError
from sluicegate.importer import FORMATS, ImportSummary, import_rules
from sluicegate.proxy import command as proxy_command
from sluicegate.rule_text import parse_limit, policy_from_text
from sluicegate.rules import Rule, RuleError
from sluicegate.store import RuleStore, StoreError, store_from_config

EXIT_ALLOWED, EXIT_DENIED, EXIT_ERROR = 0, 1, 2


def _parser(config: Config) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sluicegate", description="Sluicegate quota service")
    commands = parser.add_subparsers(dest="command", required=True)

    local = commands.add_parser("local", help="run the whole service on this machine")
    local.add_argument(
        "--partitions", type=int, default=config.partitions, help="partition servers (default %(default)s)"
    )
    local.add_argument("--host", default=config.host, help="HTTP address (default %(default)s)")
    local.add_argument("--port", type=int, default=config.port, help="HTTP port, 0 = any free (default %(default)s)")
    local.add_argument("--db", default=config.db, help="SQLite file (default %(default)s)")
    local.add_argument("--rules", type=Path, help="import rules from this YAML/JSON/CSV file first")

    rules = commands.add_parser("rules", help="manage rules in the store")
    rules.add_argument("--db", default=config.db, help="SQLite file (default %(default)s)")
    actions = rules.add_subparsers(dest="action", required=True)
    put = actions.add_parser(
        "put",
        help="create or replace a key's (or a pattern's) rule",
        description="Create or replace the rule of KEY: an exact key, or a pattern with *, ? or [...].",
        epilog="example: rules put 'tenant:acme:*' --capacity 100 --rate 10 "
        "--limit name=daily,quota=250,per=day,offset=+02:00 --precedence 5",
    )
    put.add_argument("key")
    put.add_argument("--capacity", required=True, help="main bucket size (credits)")
    put.add_argument("--rate", required=True, help="main bucket refill per second")
    put.add_argument(
        "--limit",
        action="append",
        default=[],
        metavar="SPEC",
        help="one more limit, repeatable: name=daily,quota=250,per=day[,offset=+02:00][,shadow] "
        "(per: minute|hour|day|week|month) or name=burst,capacity=20,rate=5[,shadow], or its JSON object",
    )
    put.add_argument("--shadow", action="store_true", help="the whole rule only reports would_deny, never denies")
    put.add_argument("--precedence", metavar="N", help="a pattern's rank among overlapping patterns (higher wins)")
    put.add_argument("--parent", metavar="KEY", help="share the rate of this parent key (same {tag} routing key)")
    put.add_argument("--weight", metavar="W", help="this child's weight in its parent's share (default 1)")
    put.add_argument("--priority", metavar="P", help="this child's priority, 0 to 255 (default 0)")
    put.add_argument("--share", metavar="MODE", help="as a parent: weighted (default) or strict priorities")
    put.add_argument(
        "--level-weights",
        metavar="P=W,...",
        help="as a parent in weighted mode: weight of each priority, e.g. 2=4,1=2,0=1",
    )
    actions.add_parser("get", help="show a key's rule").add_argument("key")
    actions.add_parser("delete", help="delete a key's rule").add_argument("key")
    listing = actions.add_parser("list", help="list rules in key order")
    listing.add_argument("--prefix", default="")
    listing.add_argument("--limit", type=int, default=100)
    bulk = actions.add_parser("import", help="import rules from a YAML, JSON or CSV file")
    bulk.add_argument("file", type=Path)
    bulk.add_argument("--format", choices=FORMATS, help="default: from the file extension")

    migrate = commands.add_parser("migrate", help="create the store's tables/schema if missing (SLUICEGATE_STORE)")
    migrate.add_argument("--db", default=config.db, help="SQLite file (default %(default)s)")

    check = commands.add_parser("check", help="ask a running service whether KEY may spend COST")
    check.add_argument("key")
    check.add_argument("--cost", type=int, default=1)
    check.add_argument(
        "--max-wait-ms", type=int, default=0, help="let the service hold the check up to this long for credit"
    )
    check.add_argument("--endpoint", default=f"http://{config.host}:{config.port}")
    proxy_command.add_parser(commands, config)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        config = Config.from_env()
    except (ConfigError, RuleError) as exc:
        print(f"sluicegate: configuration error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    args = _parser(config).parse_args(argv)
    try:
        if args.command == "local":
            return _local(args, config)
        if args.command == "rules":
            return _rules(args, config)
        if args.command == "migrate":
            return _migrate(args, config)
        if args.command == "proxy":
            return proxy_command.run(args, config)
        return _check(args)
    except (ConfigError, RuleError, StoreError, OSError, ValueError) as exc:
        print(f"sluicegate: {exc}", file=sys.stderr)
        return EXIT_ERROR


def _local(args: argparse.Namespace, config: Config) -> int:
    from sluicegate.local import StartupError, run_local
    from sluicegate.server.__main__ import install_event_loop_policy

    config = dataclasses.replace(config, partitions=args.partitions, host=args.host, port=args.port, db=args.db)
    config.validate()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(levelname)s %(message)s")
    install_event_loop_policy()
    try:
        asyncio.run(run_local(config, rules_file=args.rules))
    except StartupError as exc:
        print(f"sluicegate: could not start: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:  # Ctrl-C before the signal handlers were installed (e.g. during --rules)
        print("sluicegate: interrupted", file=sys.stderr)
        return 130
    return 0


def _migrate(args: argparse.Namespace, config: Config) -> int:
    store = store_from_config(config, db=args.db)
    try:
        store.migrate()
    finally:
        store.close()
    print(f"sluicegate: the {config.store} store is ready", file=sys.stderr)
    return EXIT_ALLOWED


def _rules(args: argparse.Namespace, config: Config) -> int:
    store = store_from_config(config, db=args.db)
    try:
        if args.action == "put":
            rule = _rule_from_options(args)
            store.put_rule(rule)
            print(json.dumps(rule.to_dict()))
        elif args.action in ("get", "delete"):
            found = store.get_rule(args.key) if args.action == "get" else store.delete_rule(args.key)
            if not found:
                print(f"sluicegate: no rule for {args.key!r}", file=sys.stderr)
                return EXIT_DENIED
            if args.action == "get":
                print(json.dumps(found.to_dict()))  # type: ignore[union-attr]
        elif args.action == "list":
            for rule in store.list_rules(prefix=args.prefix, limit=args.limit):
                print(json.dumps(rule.to_dict()))
        else:
            return _import(store, args.file, args.format)
    finally:
        store.close()
    return EXIT_ALLOWED


def _rule_from_options(args: argparse.Namespace) -> Rule:
    """The rule ``rules put`` asks for; every field is checked by the rule model (RuleError)."""
    texts = {
        "shadow": "true" if args.shadow else None,
        "precedence": args.precedence,
        "parent": args.parent,
        "weight": args.weight,
        "priority": args.priority,
        "share": args.share,
        "level_weights": args.level_weights,
    }
    for name, text in texts.items():
        if text is not None and not text.strip():
            raise RuleError(f"--{name.replace('_', '-')} must not be empty")
    data = {"key": args.key, "capacity": args.capacity, "rate": args.rate, **policy_from_text(texts)}
    if args.limit:
        data["limits"] = [parse_limit(spec) for spec in args.limit]
    return Rule.from_dict(data)


def _import(store: RuleStore, path: Path, fmt: str | None) -> int:
    """Import good rows in batches with a progress line; report bad rows as ``file:line: message``."""
    last_print = 0.0
    interactive = sys.stderr.isatty()

    def progress(summary: ImportSummary) -> None:
        nonlocal last_print
        now = time.monotonic()
        if now - last_print >= (0.2 if interactive else 2.0):
            last_print = now
            end = "\r" if interactive else "\n"
            line = f"imported {summary.stored} rules ({summary.rows} rows read, {summary.bad} bad)"
            print(line, end=end, file=sys.stderr, flush=True)

    summary = import_rules(store, path, fmt, on_bad=lambda message: print(message, file=sys.stderr), progress=progress)
    print(
        f"imported {summary.stored} rules from {path}; {summary.bad} bad rows skipped ({summary.rows} rows read)",
        file=sys.stderr,
    )
    return EXIT_ALLOWED if summary.bad == 0 else EXIT_DENIED


def _check(args: argparse.Namespace) -> int:
    url = f"{args.endpoint.rstrip('/')}/v1/check/{urllib.parse.quote(args.key, safe='')}?cost={args.cost}"
    if args.max_wait_ms:
        url += f"&max_wait_ms={args.max_wait_ms}"  # the service checks the range (400 with a message)
    try:
        with urllib.request.urlopen(url, timeout=5 + max(0, args.max_wait_ms) / 1000) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        body = exc.read()
        if exc.code != 429:
            print(f"sluicegate: {exc.code} {body.decode(errors='replace')}", file=sys.stderr)
            return EXIT_ERROR
    except urllib.error.URLError as exc:
        print(f"sluicegate: cannot reach {args.endpoint}: {exc.reason}", file=sys.stderr)
        return EXIT_ERROR
    try:
        decision = json.loads(body)
        allowed = bool(decision["allowed"])
    except (ValueError, TypeError, KeyError):
        print(
            f"sluicegate: {args.endpoint} did not answer a check: {body[:200].decode(errors='replace')}",
            file=sys.stderr,
        )
        return EXIT_ERROR
    print(json.dumps(decision))
    note = _limit_note(decision)
    if note:
        print(f"sluicegate: {note}", file=sys.stderr)
    return EXIT_ALLOWED if allowed else EXIT_DENIED


def _limit_note(decision: dict[str, object]) -> str:
    """Which limit denied the check, or which shadow limit would have ("" when no limit is named)."""
    limit = decision.get("limit")
    if not limit:
        return ""
    if decision.get("allowed"):
        return f"allowed, but the shadow limit {limit!r} would have denied it" if decision.get("would_deny") else ""
    retry = decision.get("retry_after_ms")
    when = "no wait helps" if retry is None else f"retry in {retry / 1000:g} s"  # type: ignore[operator]
    return f"denied by the {limit!r} limit ({when})"


if __name__ == "__main__":
    sys.exit(main())
