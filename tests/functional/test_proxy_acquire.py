"""`sluicegate proxy` with ``mode: acquire``: a concurrency lease held while the upstream serves the request,
released with its waiting and service times; ``max_wait_ms`` waits for room instead of refusing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.functional.proxy_stack import (
    Service,
    quota,
    request,
    start_local,
    start_proxy,
    start_upstream,
    upstream_stats,
)

BIG = 10**6
RULES = f"""
rules:
  - {{key: "jobs:now", capacity: {BIG}, rate: {BIG}, limits: [{{name: inflight, concurrency: 2}}]}}
  - {{key: "jobs:wait", capacity: {BIG}, rate: {BIG}, limits: [{{name: inflight, concurrency: 2}}]}}
  - {{key: "jobs:adaptive", capacity: {BIG}, rate: {BIG},
      limits: [{{name: inflight, adaptive: {{min: 1, kp: 15, step: 1, samples: 5}}}}]}}
  - {{key: "bucket", capacity: 1, rate: 5}}
"""
POLICY = """
classes:
  - match: {path: /slow, headers: {x-mode: now}}
    key: "jobs:now"
    mode: acquire
    ttl_ms: 20000
  - match: {path: /slow, headers: {x-mode: wait}}
    key: "jobs:{header:x-mode}"
    mode: acquire
    ttl_ms: 20000
    max_wait_ms: 10000
  - match: {path: /slow, headers: {x-mode: adaptive}}
    key: "jobs:adaptive"
    mode: acquire
    max_wait_ms: 10000
  - match: {path: /paced}
    key: bucket
    max_wait_ms: 2000
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Service, Service]]:
    """(upstream, proxy): requests without a class pass unchecked."""
    tmp = tmp_path_factory.mktemp("acquire")
    upstream = start_upstream()
    local, partitions = start_local(tmp, RULES)
    proxy = start_proxy(tmp, f"http://127.0.0.1:{upstream.port}", POLICY, partitions)
    yield upstream, proxy
    for service in (proxy, local, upstream):
        service.stop()


def _together(proxy: Service, count: int, mode: str, ms: int) -> list[tuple[int, dict[str, str], bytes]]:
    """``count`` requests to ``/slow?ms=`` at once, each on its own connection."""
    with ThreadPoolExecutor(count) as pool:
        futures = [
            pool.submit(request, proxy.port, "GET", f"/slow?ms={ms}", headers={"x-mode": mode}) for _ in range(count)
        ]
        return [future.result() for future in futures]


def test_a_lease_is_held_while_the_upstream_serves_and_given_back_after(stack: tuple[Service, Service]) -> None:
    upstream, proxy = stack
    answers = _together(proxy, 5, "now", 1000)
    statuses = sorted(status for status, _, _ in answers)
    assert statuses == [200, 200, 429, 429, 429]  # two leases, the others refused at once
    refused = next(answer for answer in answers if answer[0] == 429)
    assert json.loads(refused[2])["error"] == "too many requests"
    assert quota(refused[1]) == 2
    # Both leases came back when their responses ended (their 20 s ttl has not run out):
    assert sorted(status for status, _, _ in _together(proxy, 2, "now", 50)) == [200, 200]
    assert upstream_stats(upstream.port)["max_slow"] <= 2


def test_with_max_wait_requests_wait_for_a_lease_instead_of_being_refused(stack: tuple[Service, Service]) -> None:
    upstream, proxy = stack
    answers = _together(proxy, 6, "wait", 150)
    assert [status for status, _, _ in answers] == [200] * 6
    assert upstream_stats(upstream.port)["max_slow"] <= 2  # never more than the limit at the upstream


def test_reported_waiting_times_raise_an_adaptive_limit(stack: tuple[Service, Service]) -> None:
    _, proxy = stack
    status, headers, _ = request(proxy.port, "GET", "/slow?ms=1", headers={"x-mode": "adaptive"})
    assert (status, quota(headers)) == (200, 1)  # L starts at L_min
    # One at a time, 6 requests of 100 ms queue behind each other: they wait far longer than they are
    # served, so Algorithm 1 raises L once it has N = 5 samples (were the waits not reported, it could not).
    answers = _together(proxy, 6, "adaptive", 100)
    assert [status for status, _, _ in answers] == [200] * 6
    status, headers, _ = request(proxy.port, "GET", "/slow?ms=1", headers={"x-mode": "adaptive"})
    assert status == 200 and quota(headers) > 1


def test_a_check_with_max_wait_is_admitted_when_credit_is_back(stack: tuple[Service, Service]) -> None:
    _, proxy = stack
    # bucket: 1 credit, 5 a second; the second request waits ~200 ms for its credit instead of a 429.
    assert [request(proxy.port, "GET", "/paced")[0] for _ in range(3)] == [200, 200, 200]
