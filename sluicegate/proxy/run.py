"""The ``sluicegate proxy`` process: quota client, upstream pool and server, until SIGINT/SIGTERM.

Example::

    options = ProxyOptions(upstream=Upstream.parse("http://127.0.0.1:9000"), listen=("127.0.0.1", 8081),
                           policy=load_policy(Path("policy.yaml")), endpoints=[("127.0.0.1", 7001)])
    asyncio.run(run_proxy(options, Config.from_env()))
"""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass

from sluicegate.config import Config
from sluicegate.directory import PartitionDirectory
from sluicegate.proxy.admission import Admission
from sluicegate.proxy.policy import Policy
from sluicegate.proxy.server import UPSTREAM_TIMEOUT_S, ProxyServer
from sluicegate.proxy.upstream import Upstream, UpstreamPool
from sluicegate.router.client import PartitionClient

log = logging.getLogger("sluicegate.proxy")
SHUTDOWN_GRACE_S = 5.0  # requests in flight at SIGTERM get this long to finish
RELEASE_GRACE_S = 1.0  # then the leases still being released get this long


@dataclass(frozen=True, slots=True, kw_only=True)
class ProxyOptions:
    """What ``sluicegate proxy`` was asked to do (the command line, checked)."""

    upstream: Upstream
    listen: tuple[str, int]
    policy: Policy
    endpoints: list[tuple[str, int]]  # the partitions' UDP addresses or names, in partition order
    follow_names: bool = False  # resolve the endpoints again every SLUICEGATE_DNS_TTL_S (Cloud Map names)
    upstream_timeout_s: float = UPSTREAM_TIMEOUT_S


async def _follow(directory: PartitionDirectory, client: PartitionClient, stop: asyncio.Event) -> None:
    """Keep the client's partition addresses fresh: after the TTL, and soon after a partition did not answer."""
    loop = asyncio.get_running_loop()
    fallbacks = client.fallbacks
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), 1.0)
        except TimeoutError:
            pass
        if client.fallbacks != fallbacks:
            fallbacks = client.fallbacks
            directory.expire()
        client.addresses[:] = await loop.run_in_executor(None, directory.addresses)


async def run_proxy(options: ProxyOptions, config: Config) -> ProxyServer:
    """Serve until SIGINT/SIGTERM; returns the stopped server (its ``stats``)."""
    directory = PartitionDirectory(options.endpoints, ttl_s=config.dns_ttl_s)
    loop = asyncio.get_running_loop()
    addresses = await loop.run_in_executor(None, directory.addresses)
    client = PartitionClient(
        addresses,
        timeout_s=config.timeout_ms / 1000,
        attempts=config.attempts,
        fail_open=config.fail_open,
        max_datagram=config.max_datagram,
    )
    await client.start()
    stop = asyncio.Event()
    signals = (signal.SIGINT, signal.SIGTERM)
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    admission = Admission(client)
    server = ProxyServer(
        policy=options.policy,
        admission=admission,
        pool=UpstreamPool(options.upstream),
        upstream_timeout_s=options.upstream_timeout_s,
    )
    follower = asyncio.create_task(_follow(directory, client, stop)) if options.follow_names else None
    try:
        answers = await asyncio.gather(*map(client.stats, range(len(addresses))))
        for index in (i for i, stats in enumerate(answers) if not stats):
            log.warning(
                "partition %d (%s:%d) does not answer: checks get the fallback (SLUICEGATE_FALLBACK=%s) until it does",
                index,
                *client.addresses[index],
                config.fallback,
            )
        await server.start(*options.listen)
        host, port = server.address
        upstream = options.upstream
        classes = len(options.policy.classes)
        default = "a default class" if options.policy.default else "no default class (unmatched requests pass)"
        print(
            f"sluicegate proxy: http://{host}:{port} -> http://{upstream.authority}{upstream.base_path} "
            f"({classes} classes, {default}; partitions {', '.join(f'{h}:{p}' for h, p in client.addresses)})",
            flush=True,
        )
        await stop.wait()
    finally:
        stop.set()
        await server.shutdown(SHUTDOWN_GRACE_S)
        await admission.drain(RELEASE_GRACE_S)
        if follower is not None:
            await asyncio.gather(follower, return_exceptions=True)
        client.close()
        for sig in signals:
            loop.remove_signal_handler(sig)
        counts = ", ".join(f"{name} {server.stats[name]}" for name in sorted(server.stats)) or "no requests"
        print(f"sluicegate proxy: stopped ({counts}; {server.pool.opened} upstream connections)", flush=True)
    return server
