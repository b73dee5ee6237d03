"""``Client``: checks over Sluicegate's HTTP API, with a pool of kept-alive connections.

Thread-safe; one client per process is enough (a forked worker opens its own
connections). When the service is down, slow or answers garbage, a check
gets the ``on_error`` fallback (``fallback=True``) within ``timeout``.
"""

from __future__ import annotations

import http.client
import os
import ssl
import threading
import time
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from types import TracebackType

from sluicegate.decision import Decision
from sluicegate_sdk.checks import normalize_checks, validate_check
from sluicegate_sdk.httpapi import (
    ClientOptions,
    Unavailable,
    acquire_body,
    batch_body,
    batches,
    decisions,
    release_body,
    released,
)
from sluicegate_sdk.leases import DEFAULT_TTL_S, Lease, LostReleases, held_lease, hold, reported_ms, ttl_ms, wait_ms

# A kept-alive connection the server has closed meanwhile fails like this on reuse: try once more on a new one.
_STALE = (ConnectionResetError, BrokenPipeError)


class Client:
    """Checks over HTTP: ``check(key, cost=1) -> Decision`` and ``check_many([...])``;
    concurrency leases: ``acquire``, ``release`` and ``with client.lease(key) as decision:``.

    ``timeout`` bounds each HTTP request (connect, send and answer), in
    seconds; ``on_error`` is the answer when the service cannot be reached:
    ``"allow"`` (fail open) or ``"deny"`` (fail closed). ``pool_size`` idle
    connections are kept for reuse. ``headers`` are sent with every request.

    Example::

        with Client("http://127.0.0.1:8080", timeout=0.5) as client:
            decision = client.check("alice", cost=2)
            if not decision.allowed:
                print("wait", decision.retry_after, "s")
            with client.lease("db", max_wait=0.25) as seat:  # released at the end of the block
                if seat.allowed:
                    run_query()
    """

    def __init__(
        self,
        endpoint: str = "http://127.0.0.1:8080",
        *,
        timeout: float = 1.0,
        on_error: str = "allow",
        pool_size: int = 8,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        options = ClientOptions.parse(
            endpoint, timeout=timeout, on_error=on_error, pool_size=pool_size, headers=headers
        )
        self.endpoint = options.endpoint
        self.timeout = timeout
        self.on_error = options.on_error
        self.pool_size = pool_size
        self._headers = options.headers
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._closed = False
        self.lost_releases = LostReleases()

    @property
    def fallbacks(self) -> int:
        """Checks (and acquires) answered with the ``on_error`` fallback so far."""
        return self.on_error.count

    def check(self, key: str, cost: int = 1, *, max_wait: float = 0) -> Decision:
        """Spend ``cost`` credits of ``key`` if it has them; raises :class:`CheckError` for a bad key or cost.

        With ``max_wait`` (seconds, up to 60) the service may hold the check until the credit is there
        (first come, first served per key); it answers "denied" at once when the wait would be longer.
        """
        key, cost = validate_check(key, cost)
        waiting = wait_ms(max_wait)
        try:
            status, body = self._request("GET", self.endpoint.check_target(key, cost, waiting), None, waiting)
            return decisions(status, body, 1)[0]
        except Unavailable as exc:
            return self.on_error.decide(key, f"{self.endpoint.host_header}: {exc}")

    def acquire(self, key: str, cost: int = 1, *, ttl: float = DEFAULT_TTL_S, max_wait: float = 0) -> Decision:
        """Take a lease of ``cost`` on the key's concurrency limit (``decision.lease``), held at most ``ttl`` s.

        Give it back with :meth:`release`. ``max_wait`` as for :meth:`check`. A key without a
        concurrency limit is decided like a check (``lease`` None); so is a fallback.
        """
        key, cost = validate_check(key, cost)
        waiting = wait_ms(max_wait)
        body = acquire_body(key, cost, ttl_ms(ttl), waiting)
        try:
            status, data = self._request("POST", self.endpoint.acquire_target, body, waiting)
            return decisions(status, data, 1)[0]
        except Unavailable as exc:
            return self.on_error.decide(key, f"{self.endpoint.host_header}: {exc}")

    def release(self, held: Decision | Lease, *, wait: float = 0, service: float = 0) -> bool:
        """Give back the lease of an acquire's decision (or a ``Lease``); ``wait``/``service``: seconds it
        waited and was served. False when there was nothing to give back or the service did not confirm it
        (the lease then ends at its ttl)."""
        found = held_lease(held)
        if found is None:
            return False
        key, lease = found
        body = release_body(key, lease, reported_ms("wait", wait), reported_ms("service", service))
        try:
            return released(*self._request("POST", self.endpoint.release_target, body))
        except Unavailable as exc:
            self.lost_releases.note(key, f"{self.endpoint.host_header}: {exc}")
            return False

    def lease(
        self, key: str, cost: int = 1, *, ttl: float = DEFAULT_TTL_S, max_wait: float = 0
    ) -> AbstractContextManager[Decision]:
        """``with client.lease(key) as decision:``: acquire, run the block (check ``decision.allowed``),
        then release with the measured waiting and service times."""
        return hold(self.acquire, self.release, key, cost, ttl=ttl, max_wait=max_wait)

    def check_many(self, checks: Iterable[str | tuple[str, int]]) -> list[Decision]:
        """Several checks (keys, or ``(key, cost)`` pairs), decided in order; 100 per request."""
        decided: list[Decision] = []
        for chunk in batches(normalize_checks(checks)):
            try:
                status, body = self._request("POST", self.endpoint.batch_target, batch_body(chunk))
                decided += decisions(status, body, len(chunk))
            except Unavailable as exc:
                decided += [self.on_error.decide(key, f"{self.endpoint.host_header}: {exc}") for key, _ in chunk]
        return decided

    def close(self) -> None:
        """Close the idle connections; checks after this raise RuntimeError."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _request(self, method: str, target: str, body: bytes | None, held_ms: int = 0) -> tuple[int, bytes]:
        """One request; the service may hold it ``held_ms`` longer than ``timeout``."""
        deadline = time.monotonic() + self.timeout + held_ms / 1000
        headers = self._headers if body is None else {**self._headers, "Content-Type": "application/json"}
        conn, reused = self._take()
        while True:
            try:
                status, data, keep = _round_trip(conn, method, target, body, headers, deadline)
            except _STALE as exc:
                conn.close()
                if not reused:
                    raise Unavailable(f"{type(exc).__name__}: {exc}") from exc
                conn, reused = self._connection(), False
                continue
            except (OSError, http.client.HTTPException) as exc:  # refused, timed out, garbled
                conn.close()
                raise Unavailable(f"{type(exc).__name__}: {exc}") from exc
            self._give_back(conn, keep)
            return status, data

    def _take(self) -> tuple[http.client.HTTPConnection, bool]:
        """An idle connection (reused=True) or a new one."""
        with self._lock:
            if self._closed:
                raise RuntimeError("this Client is closed")
            if self._pid != os.getpid():
                # Forked: the parent's connections are not ours to use (their answers could go to either process).
                self._pid, self._idle = os.getpid(), []
            if self._idle:
                return self._idle.pop(), True
        return self._connection(), False

    def _connection(self) -> http.client.HTTPConnection:
        endpoint = self.endpoint
        if endpoint.scheme == "https":
            return http.client.HTTPSConnection(
                endpoint.host, endpoint.port, timeout=self.timeout, context=ssl.create_default_context()
            )
        return http.client.HTTPConnection(endpoint.host, endpoint.port, timeout=self.timeout)

    def _give_back(self, conn: http.client.HTTPConnection, keep: bool) -> None:
        with self._lock:
            if keep and not self._closed and self._pid == os.getpid() and len(self._idle) < self.pool_size:
                self._idle.append(conn)
                return
        conn.close()


def _round_trip(
    conn: http.client.HTTPConnection,
    method: str,
    target: str,
    body: bytes | None,
    headers: Mapping[str, str],
    deadline: float,
) -> tuple[int, bytes, bool]:
    """One request and its answer, all of it before ``deadline``: ``(status, body, keep the connection)``."""
    conn.timeout = _left(deadline)
    if conn.sock is None:
        conn.connect()
    else:
        conn.sock.settimeout(conn.timeout)
    conn.request(method, target, body, dict(headers))
    conn.sock.settimeout(_left(deadline))  # type: ignore[union-attr]
    response = conn.getresponse()
    data = response.read()
    return response.status, data, not response.will_close


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out")
    return left
