"""Concurrency leases and waiting through every SDK client against a real `sluicegate local`."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sluicegate_sdk import AsyncClient, AsyncDirectClient, CheckError, Client, Decision, DirectClient, Lease

from tests.sdk.conftest import Service

BIG = 10**6  # a rate that never denies: only the concurrency limit decides
FLAVOURS = ["http", "http-async", "direct", "direct-async"]


class Blocking:
    """An async client driven from plain test code: its coroutines run on a loop in a thread of its own,
    so several threads can call it at once, as they would call a sync client."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def _run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(30)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self.client, name)
        return lambda *args, **options: self._run(method(*args, **options))

    @contextmanager
    def lease(self, key: str, **options: Any) -> Iterator[Decision]:
        manager = self.client.lease(key, **options)
        decision = self._run(manager.__aenter__())
        try:
            yield decision
        finally:
            self._run(manager.__aexit__(None, None, None))

    def close(self) -> None:
        self._run(self.client.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


def make_client(flavour: str, service: Service, **options: Any) -> Any:
    if flavour == "http":
        return Client(service.endpoint, **options)
    if flavour == "http-async":
        return Blocking(AsyncClient(service.endpoint, **options))
    if flavour == "direct":
        return DirectClient(service.partitions, **options)
    return Blocking(AsyncDirectClient(service.partitions, **options))


@pytest.fixture(params=FLAVOURS)
def client(request: pytest.FixtureRequest, service: Service) -> Iterator[Any]:
    made = make_client(request.param, service)
    yield made
    made.close()


def concurrency_rule(service: Service, key: str, limit: int) -> None:
    limits = [{"name": "inflight", "concurrency": limit}]
    service._call("PUT", f"/v1/rules/{key}", {"capacity": BIG, "rate": BIG, "limits": limits})


def test_acquire_takes_leases_up_to_the_limit_and_release_gives_them_back(
    client: Any, service: Service, key: str
) -> None:
    concurrency_rule(service, key, 2)
    first, second, third = (client.acquire(key, ttl=10) for _ in range(3))
    assert first.allowed and second.allowed and first.lease and second.lease and first.lease != second.lease
    assert (second.remaining, second.capacity, second.limit) == (0, 2, None)
    assert not third.allowed and third.lease is None and third.limit == "inflight" and not third.fallback
    assert client.release(first, wait=0, service=0.01) is True
    assert client.release(first) is False  # given back already
    again = client.acquire(key)
    assert again.allowed and again.lease
    assert client.release(Lease(key, second.lease)) is True  # a lease kept as (key, id)
    assert client.release(again) is True
    assert client.release(third) is False  # a denial holds nothing: nothing is sent


def spy_on_releases(client: Any, reported: list[dict[str, float]]) -> None:
    """Record the times each release of ``client`` reports (the lease block calls the client's own)."""
    inner = client.client if isinstance(client, Blocking) else client
    real = inner.release
    if asyncio.iscoroutinefunction(real):

        async def spy(held: Any, **times: float) -> bool:
            reported.append(times)
            return await real(held, **times)

    else:

        def spy(held: Any, **times: float) -> bool:  # type: ignore[misc]
            reported.append(times)
            return real(held, **times)

    inner.release = spy


def test_a_lease_block_releases_at_its_end_with_the_measured_times(client: Any, service: Service, key: str) -> None:
    concurrency_rule(service, key, 1)
    reported: list[dict[str, float]] = []
    spy_on_releases(client, reported)
    with client.lease(key, ttl=10) as seat:
        assert seat.allowed and seat.lease
        assert not client.acquire(key).allowed  # the block holds the only seat
        time.sleep(0.2)
    taken = client.acquire(key)
    assert taken.allowed  # given back at the end of the block
    client.release(taken)
    assert len(reported) == 2 and reported[0]["service"] >= 0.2 and 0 <= reported[0]["wait"] < 0.2
    with client.lease("no-such-limit-" + key) as plain:  # no concurrency limit: no lease, nothing released
        assert plain.allowed and plain.lease is None
    assert len(reported) == 2


def test_a_waiting_acquire_gets_the_lease_released_meanwhile(client: Any, service: Service, key: str) -> None:
    concurrency_rule(service, key, 1)
    holder = client.acquire(key)
    answers: list[tuple[Decision, float]] = []

    def wait_for_it() -> None:
        decision = client.acquire(key, max_wait=5)
        answers.append((decision, time.monotonic()))

    waiter = threading.Thread(target=wait_for_it)
    waiter.start()
    time.sleep(0.3)
    assert answers == []  # held by the partition
    released_at = time.monotonic()
    assert client.release(holder, service=0.3)
    waiter.join(10)
    (decision, answered_at), *_ = answers
    assert decision.allowed and decision.lease and answered_at >= released_at
    assert client.release(decision)


def test_a_check_may_wait_for_credit(client: Any, service: Service, key: str) -> None:
    service.put_rule(key, 5, 20)  # empty, it has 5 credits again after 250 ms
    assert client.check(key, 5).allowed
    assert not client.check(key, 5).allowed  # no max_wait: denied at once, not queued
    asked = time.monotonic()
    decision = client.check(key, 5, max_wait=2)
    assert decision.allowed and decision.remaining == 0 and time.monotonic() - asked >= 0.1
    assert not client.check(key, 5, max_wait=0.02).allowed  # needs ~250 ms: denied at once


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def free_tcp_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("on_error", ["allow", "deny"])
def test_when_the_service_is_down_acquire_falls_back_and_release_says_false(flavour: str, on_error: str) -> None:
    down = Service(free_tcp_port(), [("127.0.0.1", free_udp_port())])
    options: dict[str, Any] = {"on_error": on_error, "timeout": 0.05 if flavour.startswith("http") else 0.02}
    client = make_client(flavour, down, **options)
    try:
        decision = client.acquire("db", max_wait=0.05)
        assert decision.fallback and decision.lease is None and decision.allowed is (on_error == "allow")
        assert client.release(decision) is False  # nothing to give back
        assert client.release(Lease("db", 42)) is False  # not confirmed: it ends at its ttl
        inner = client.client if isinstance(client, Blocking) else client
        assert inner.lost_releases.count == 1 and inner.fallbacks == 1
    finally:
        client.close()


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda c: c.acquire("db", max_wait=61), "max_wait must be from 0 to 60"),
        (lambda c: c.acquire("db", max_wait=-1), "max_wait must be from 0 to 60"),
        (lambda c: c.check("db", max_wait="1"), "max_wait must be a number of seconds"),
        (lambda c: c.acquire("db", ttl=0), "ttl must be above 0"),
        (lambda c: c.acquire("db", ttl=3601), "ttl must be from 0 to 3600"),
        (lambda c: c.acquire("", ttl=1), "key"),
        (lambda c: c.release("db"), "release takes the Decision of an acquire or a Lease"),
        (lambda c: c.release(Lease("db", 0)), "a lease id is a whole number"),
        (lambda c: c.release(Lease("db", 1), service=-1), "service must be a number of seconds >= 0"),
    ],
)
def test_bad_arguments_raise_check_error_before_anything_is_sent(
    client: Any, call: Callable[[Any], object], message: str
) -> None:
    with pytest.raises(CheckError, match=message):
        call(client)
