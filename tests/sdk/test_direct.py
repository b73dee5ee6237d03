"""The direct UDP clients against the partitions of a real `sluicegate local`, through relays that count and lose."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from sluicegate_sdk import AsyncDirectClient, Client, Decision, DirectClient
from sluicegate_sdk.partitions import partition_endpoints

from sluicegate import codec
from tests.sdk.conftest import CAPACITY, Service
from tests.sdk.relay import Relay


def async_check_many(client: AsyncDirectClient, checks: list) -> list[Decision]:
    return asyncio.run(client.check_many(checks))


@pytest.fixture
def relays(service: Service, request: pytest.FixtureRequest) -> Iterator[list[Relay]]:
    """One relay in front of each partition (options from the test's parameter, if any)."""
    options = getattr(request, "param", {})
    started = [Relay(address, **options) for address in service.partitions]
    yield started
    for relay in started:
        relay.close()


def test_direct_checks_land_on_the_partition_the_router_uses(service: Service, key: str) -> None:
    keys = [f"{key}-{i}" for i in range(40)] + [f"{{{key}}}/a", f"{{{key}}}/b"]
    with Client(service.endpoint) as http, DirectClient(service.partitions) as direct:
        assert all(d.remaining == CAPACITY - 1 for d in http.check_many(keys))
        # Another partition would hold a fresh bucket of these keys (remaining 2, not 1).
        assert [d.remaining for d in direct.check_many(keys)] == [CAPACITY - 2] * len(keys)
        assert [d.remaining for d in async_check_many(AsyncDirectClient(service.partitions), keys)] == [0] * len(keys)
        denied = direct.check(keys[0])
    assert not denied.allowed and 19 < denied.retry_after <= 20  # type: ignore[operator]
    assert (denied.capacity, denied.window, denied.policy, denied.fallback) == (CAPACITY, 60.0, "default", False)


def test_partitions_given_by_name_are_resolved(service: Service, key: str) -> None:
    named = [("localhost", port) for _, port in service.partitions]
    with DirectClient(named) as client:
        assert [d.remaining for d in client.check_many([key, key])] == [2, 1]


def test_async_checks_of_one_loop_iteration_share_one_datagram_per_partition(relays: list[Relay], key: str) -> None:
    keys = [f"{key}-{i}" for i in range(60)]
    client = AsyncDirectClient([relay.address for relay in relays])

    async def scenario() -> list[Decision]:
        return list(await asyncio.gather(*(client.check(k) for k in keys)))

    decisions = asyncio.run(scenario())
    assert [(d.key, d.allowed, d.fallback) for d in decisions] == [(k, True, False) for k in keys]
    assert [relay.items for relay in relays] == [sum(client.partition(k) == i for k in keys) for i in range(3)]
    assert [relay.datagrams for relay in relays] == [1, 1, 1]


def test_checks_from_many_threads_are_coalesced(relays: list[Relay], key: str) -> None:
    client = DirectClient([relay.address for relay in relays])
    threads, per_thread = 12, 20
    start = threading.Barrier(threads)
    decided: list[Decision] = []

    def worker(index: int) -> None:
        start.wait()
        for i in range(per_thread):
            decided.append(client.check(f"{key}-{index}-{i}"))

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    client.close()
    assert len(decided) == threads * per_thread and all(d.allowed and not d.fallback for d in decided)
    assert sum(relay.items for relay in relays) == threads * per_thread
    assert sum(relay.datagrams for relay in relays) < threads * per_thread  # some datagrams carried several checks


@pytest.mark.parametrize(
    "relays", [{"drop_first_request": True}, {"drop_first_reply": True}], indirect=True, ids=["request", "reply"]
)
def test_a_lost_datagram_is_retried_with_its_request_id_and_charged_once(relays: list[Relay], key: str) -> None:
    addresses = [relay.address for relay in relays]
    decisions = [DirectClient(addresses, timeout=0.05).check(key) for _ in range(2)]
    decisions.append(asyncio.run(AsyncDirectClient(addresses, timeout=0.05).check(key)))
    assert [(d.allowed, d.remaining, d.fallback) for d in decisions] == [(True, r, False) for r in (2, 1, 0)]
    copies = [n for relay in relays for n in relay.requests.values()]
    assert copies == [2, 2, 2]  # each request sent twice, with the same id


@pytest.fixture
def silent_partition() -> Iterator[socket.socket]:
    """A UDP socket that receives datagrams and never answers (a partition that is down)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.setblocking(False)
        yield sock


def drain(sock: socket.socket) -> list[int]:
    ids = []
    while True:
        try:
            ids.append(codec.decode_header(sock.recv(65535))[1])
        except BlockingIOError:
            return ids


@pytest.mark.parametrize("on_error", ["allow", "deny"])
@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_partition_down_answers_the_fallback_after_the_retries(
    silent_partition: socket.socket, on_error: str, flavour: str
) -> None:
    options = {"timeout": 0.1, "attempts": 3, "on_error": on_error}
    address = [silent_partition.getsockname()]
    started = time.monotonic()
    if flavour == "sync":
        decision = DirectClient(address, **options).check("alice")  # type: ignore[arg-type]
    else:
        decision = asyncio.run(AsyncDirectClient(address, **options).check("alice"))  # type: ignore[arg-type]
    elapsed = time.monotonic() - started
    assert decision.fallback and decision.key == "alice"
    assert (decision.allowed, decision.retry_after) == ((True, None) if on_error == "allow" else (False, 1.0))
    assert 0.29 <= elapsed < 0.3 + 1.0  # three attempts of 0.1 s, plus scheduling slack
    ids = drain(silent_partition)
    assert len(ids) == 3 and len(set(ids)) == 1


def test_a_namespace_that_does_not_resolve_falls_back_at_once() -> None:
    client = DirectClient(namespace="no-such-namespace.invalid", partition_count=2, timeout=0.5, on_error="deny")
    started = time.monotonic()
    decisions = client.check_many(["a", "b", "c"])
    assert time.monotonic() - started < 0.5 * 3  # no waiting for the retry budget of a name that is not there
    assert all(d.fallback and not d.allowed for d in decisions) and client.fallbacks == 3


def test_partition_endpoints_and_bad_options() -> None:
    assert partition_endpoints(namespace="sg.internal", partition_count=3, port=7100) == [
        ("p0.sg.internal", 7100),
        ("p1.sg.internal", 7100),
        ("p2.sg.internal", 7100),
    ]
    with pytest.raises(ValueError, match="either"):
        DirectClient([("127.0.0.1", 7000)], namespace="x", partition_count=1)
    with pytest.raises(ValueError, match="partition_count"):
        DirectClient(namespace="x")
    with pytest.raises(ValueError, match="timeout"):
        AsyncDirectClient([("127.0.0.1", 7000)], timeout=0)
    with pytest.raises(ValueError, match="on_error"):
        DirectClient([("127.0.0.1", 7000)], on_error="open")


def test_an_async_direct_client_serves_one_event_loop_after_another(service: Service, key: str) -> None:
    client = AsyncDirectClient(service.partitions)
    remaining = [asyncio.run(client.check(key)).remaining for _ in range(3)]
    assert remaining == [2, 1, 0] and client.fallbacks == 0
