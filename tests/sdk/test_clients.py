"""The HTTP clients (Client, AsyncClient) against a real `sluicegate local`, and when the service is down."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from sluicegate_sdk import AsyncClient, CheckError, Client, Decision

from tests.sdk.conftest import CAPACITY, Service


def run_async(method: str, endpoint: str, *args: object, **options: object) -> object:
    """``AsyncClient(endpoint, **options).<method>(*args)`` on a fresh event loop."""

    async def call() -> object:
        async with AsyncClient(endpoint, **options) as client:  # type: ignore[arg-type]
            return await getattr(client, method)(*args)

    return asyncio.run(call())


Check = Callable[[str], Decision]


@pytest.fixture(params=["sync", "async"])
def check_with(request: pytest.FixtureRequest, service: Service) -> Iterator[Callable[..., Check]]:
    """Factory: a one-argument check function over Client or AsyncClient with the given options."""
    clients: list[Client] = []

    def make(endpoint: str = service.endpoint, **options: object) -> Check:
        if request.param == "sync":
            client = Client(endpoint, **options)  # type: ignore[arg-type]
            clients.append(client)
            return client.check
        return lambda key: run_async("check", endpoint, key, **options)  # type: ignore[return-value]

    yield make
    for client in clients:
        client.close()


def test_check_spends_credit_then_denies_with_retry_after(check_with: Callable[..., Check], key: str) -> None:
    check = check_with()
    decisions = [check(key) for _ in range(CAPACITY + 1)]
    assert [d.allowed for d in decisions] == [True] * CAPACITY + [False]
    assert [d.remaining for d in decisions] == [2, 1, 0, 0]
    denied = decisions[-1]
    assert 19 < denied.retry_after <= 20  # one credit at 0.05/s  # type: ignore[operator]
    assert (denied.capacity, denied.window, denied.policy, denied.fallback) == (3, 60.0, "default", False)


def test_a_key_with_its_own_rule_reports_policy_key(service: Service, key: str) -> None:
    service.put_rule(key, 10, 2)
    with Client(service.endpoint) as client:
        decision = client.check(key, cost=4)
    assert (decision.allowed, decision.remaining, decision.capacity, decision.window, decision.policy) == (
        True,
        6,
        10,
        5.0,
        "key",
    )


def test_keys_with_reserved_characters_reach_the_service_unchanged(service: Service, key: str) -> None:
    odd = f"{key} /?#%&+é{{t}}"
    with Client(service.endpoint) as client:
        first, second = client.check(odd), client.check(odd)
    assert first.key == odd and (first.remaining, second.remaining) == (2, 1)


def test_check_many_keeps_order_and_splits_into_requests_of_100(service: Service, key: str) -> None:
    checks: list[str | tuple[str, int]] = [f"{key}-{i}" for i in range(120)]
    checks[50:50] = [(key, 2), key, key]  # the same key, charged in order
    checks.append((f"{key}-big", CAPACITY + 1))  # more than the capacity: no wait helps
    with Client(service.endpoint) as client:
        decisions = client.check_many(checks)
    async_decisions = run_async("check_many", service.endpoint, [f"{key}-{i}" for i in range(120)])
    assert [d.key for d in decisions] == [c if isinstance(c, str) else c[0] for c in checks]
    assert [(d.allowed, d.remaining) for d in decisions[50:53]] == [(True, 1), (True, 0), (False, 0)]
    assert all(d.allowed and d.remaining == 2 for d in decisions[:50] + decisions[53:-1])
    assert not decisions[-1].allowed and decisions[-1].retry_after is None
    assert [d.remaining for d in async_decisions] == [1] * 120  # type: ignore[union-attr]


def test_concurrent_async_checks_of_one_key_admit_exactly_its_capacity(service: Service, key: str) -> None:
    async def scenario() -> list[Decision]:
        async with AsyncClient(service.endpoint, pool_size=4) as client:
            return list(await asyncio.gather(*(client.check(key) for _ in range(12))))

    decisions = asyncio.run(scenario())
    assert sum(d.allowed for d in decisions) == CAPACITY and not any(d.fallback for d in decisions)


@pytest.mark.parametrize(
    ("key", "cost", "message"),
    [
        ("", 1, "must not be empty"),
        ("k" * 257, 1, "longer than 256"),
        ("a\x00b", 1, "NUL"),
        ("a", 0, "from 1 to"),
        ("a", 2**32, "from 1 to"),
        ("a", 1.5, "whole number"),
        ("a", True, "whole number"),
        (7, 1, "must be a string"),
    ],
)
def test_bad_checks_raise_check_error_before_anything_is_sent(key: object, cost: object, message: str) -> None:
    with Client("http://127.0.0.1:9", on_error="allow") as client:
        with pytest.raises(CheckError, match=message):
            client.check(key, cost)  # type: ignore[arg-type]
        with pytest.raises(CheckError, match=message):
            client.check_many([(key, cost)])  # type: ignore[list-item]
        assert client.fallbacks == 0
    with pytest.raises(CheckError, match=message):
        run_async("check", "http://127.0.0.1:9", key, cost)


class _ClosingHandler(BaseHTTPRequestHandler):
    """Answers a check, then closes the connection without saying so (as an idle timeout would)."""

    protocol_version = "HTTP/1.1"
    status = 200

    def do_GET(self) -> None:
        key = self.path.rsplit("/", 1)[1]
        body = f'{{"key":"{key}","allowed":true,"remaining":1,"retry_after_ms":0,"fallback":false}}'.encode()
        self.send_response(self.status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def log_message(self, *args: object) -> None:
        pass


class _UnavailableHandler(_ClosingHandler):
    status = 503


@pytest.fixture
def tiny_server(request: pytest.FixtureRequest) -> Iterator[str]:
    handler = getattr(request, "param", _ClosingHandler)
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_kept_alive_connection_the_server_closed_is_retried_on_a_new_one(
    check_with: Callable[..., Check], tiny_server: str
) -> None:
    check = check_with(tiny_server, on_error="deny")
    decisions = [check(f"k{i}") for i in range(4)]
    assert [(d.key, d.allowed, d.fallback) for d in decisions] == [(f"k{i}", True, False) for i in range(4)]


@pytest.mark.parametrize("tiny_server", [_UnavailableHandler], indirect=True)
def test_a_5xx_answer_falls_back(check_with: Callable[..., Check], tiny_server: str) -> None:
    decision = check_with(tiny_server, on_error="deny")("k")
    assert (decision.allowed, decision.fallback, decision.retry_after) == (False, True, 1.0)


@pytest.fixture
def refused() -> str:
    """An endpoint where nothing listens."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture
def black_hole() -> Iterator[str]:
    """An endpoint that accepts connections (the kernel does) and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.mark.parametrize("on_error", ["allow", "deny"])
@pytest.mark.parametrize("down", ["refused", "black_hole"])
def test_service_down_answers_the_fallback_within_the_timeout(
    check_with: Callable[..., Check], on_error: str, down: str, request: pytest.FixtureRequest
) -> None:
    endpoint = request.getfixturevalue(down)
    check = check_with(endpoint, timeout=0.3, on_error=on_error)
    started = time.monotonic()
    decision = check("alice")
    elapsed = time.monotonic() - started
    assert decision.fallback and decision.key == "alice"
    if on_error == "allow":
        assert (decision.allowed, decision.remaining, decision.retry_after) == (True, None, None)
    else:
        assert (decision.allowed, decision.remaining, decision.retry_after) == (False, 0, 1.0)
    assert elapsed < 0.3 + 1.0  # the timeout, plus scheduling slack on a busy machine
    if down == "black_hole":
        assert elapsed >= 0.25  # it did wait for an answer that never came


def test_check_many_falls_back_for_every_check_counts_them_and_logs_once(
    black_hole: str, refused: str, caplog: pytest.LogCaptureFixture
) -> None:
    with Client(black_hole, timeout=0.2, on_error="deny") as client:
        decisions = client.check_many(["a", ("b", 2), "c"])
        assert [(d.key, d.allowed, d.fallback) for d in decisions] == [(k, False, True) for k in "abc"]
        assert client.fallbacks == 3
    with Client(refused, on_error="allow") as client:
        for _ in range(5):
            client.check("a")
    warnings = [r.getMessage() for r in caplog.records if r.name == "sluicegate_sdk"]
    assert len(warnings) == 2  # one per client in the minute, not one per check
    assert "denying checks (fallbacks so far: 1)" in warnings[0] and "TimeoutError" in warnings[0]
    assert "allowing checks (fallbacks so far: 1)" in warnings[1] and "ConnectionRefusedError" in warnings[1]


def test_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match="on_error"):
        Client(on_error="maybe")
    with pytest.raises(ValueError, match="http"):
        Client("ftp://example.com")
    with pytest.raises(ValueError, match="timeout"):
        AsyncClient(timeout=0)


def test_an_async_client_serves_one_event_loop_after_another(service: Service, key: str) -> None:
    client = AsyncClient(service.endpoint)  # e.g. a test client that runs each request on a new loop
    remaining = [asyncio.run(client.check(key)).remaining for _ in range(3)]
    assert remaining == [2, 1, 0] and client.fallbacks == 0
