"""The ``sluicegate proxy`` subcommand: its options and what it runs.

Example::

    sluicegate proxy --upstream http://127.0.0.1:9000 --listen 127.0.0.1:8081 --policy policy.yaml \\
        --partitions 127.0.0.1:40001,127.0.0.1:40002
    sluicegate proxy --upstream http://app:9000 --listen 0.0.0.0:8081 --policy policy.yaml \\
        --namespace sluicegate.internal --partition-count 4
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import sys
from pathlib import Path

from sluicegate.config import Config, ConfigError
from sluicegate.proxy.policy import load_policy
from sluicegate.proxy.server import UPSTREAM_TIMEOUT_S
from sluicegate.proxy.upstream import Upstream

EXIT_OK, EXIT_ERROR = 0, 2


def add_parser(commands: argparse._SubParsersAction, config: Config) -> None:
    proxy = commands.add_parser(
        "proxy",
        help="a reverse proxy that admits each request through the quota service",
        description="Forward HTTP requests to --upstream, each classified by --policy into a QoS key and "
        "admitted by the partitions (a rate check or a concurrency lease); refused ones get 429 or 503.",
    )
    proxy.add_argument("--upstream", required=True, metavar="URL", help="http://host:port[/base path]")
    proxy.add_argument("--listen", default="127.0.0.1:8081", metavar="HOST:PORT", help="default %(default)s")
    proxy.add_argument("--policy", required=True, type=Path, metavar="FILE", help="the policy (YAML or JSON)")
    proxy.add_argument(
        "--partitions",
        metavar="HOST:PORT,...",
        help="the partitions' UDP addresses in partition order, as `sluicegate local` prints them",
    )
    proxy.add_argument("--namespace", help="find partition i as p<i>.NAMESPACE (Cloud Map), instead of --partitions")
    proxy.add_argument("--partition-count", type=int, default=config.partitions, metavar="N", help="with --namespace")
    proxy.add_argument("--partition-port", type=int, default=config.partition_port, metavar="PORT")
    proxy.add_argument(
        "--upstream-timeout",
        type=float,
        default=UPSTREAM_TIMEOUT_S,
        metavar="S",
        help="seconds the upstream may take to start answering (then 504) (default %(default)g)",
    )


def _address(text: str, what: str) -> tuple[str, int]:
    host, colon, port = text.strip().rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{what}: expected HOST:PORT, got {text.strip()!r}")
    return host.strip("[]"), int(port)


def _endpoints(args: argparse.Namespace, config: Config) -> tuple[list[tuple[str, int]], bool]:
    """The partitions (and whether they are names to follow), from the options or else SLUICEGATE_*."""
    if args.partitions and args.namespace:
        raise ConfigError("give --partitions or --namespace, not both")
    if args.partitions:
        return [_address(item, "--partitions") for item in args.partitions.split(",")], False
    if args.namespace:
        if args.partition_count < 1:
            raise ConfigError("--partition-count must be at least 1")
        if not 1 <= args.partition_port <= 65535:
            raise ConfigError("--partition-port must be 1 to 65535")
        return [(f"p{i}.{args.namespace}", args.partition_port) for i in range(args.partition_count)], True
    try:
        return config.partition_endpoints(), not config.partition_addresses
    except ConfigError as exc:
        raise ConfigError("give --partitions HOST:PORT,... or --namespace NS --partition-count N") from exc


def run(args: argparse.Namespace, config: Config) -> int:
    from sluicegate.proxy.run import ProxyOptions, run_proxy
    from sluicegate.server.__main__ import install_event_loop_policy

    if not (math.isfinite(args.upstream_timeout) and args.upstream_timeout > 0):
        raise ConfigError("--upstream-timeout must be a number of seconds > 0")
    endpoints, follow = _endpoints(args, config)
    options = ProxyOptions(
        upstream=Upstream.parse(args.upstream),
        listen=_address(args.listen, "--listen"),
        policy=load_policy(args.policy),
        endpoints=endpoints,
        follow_names=follow,
        upstream_timeout_s=args.upstream_timeout,
    )
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(levelname)s %(message)s")
    install_event_loop_policy()
    try:
        asyncio.run(run_proxy(options, config))
    except KeyboardInterrupt:
        print("sluicegate: interrupted", file=sys.stderr)
        return 130
    return EXIT_OK
