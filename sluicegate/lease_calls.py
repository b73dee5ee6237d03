"""A client's side of ACQUIRE, CHECK_WAIT and RELEASE, without I/O: answers and how long to ask. Pure.

The partition may hold an acquire or a waiting check up to ``max_wait_ms``
before it answers, so a client keeps sending the *same* datagram (same
request id: the partition queues it once, and an answer lost on the way
comes back from its reply cache) every attempt timeout, until the wait plus
the usual retry budget has passed (:func:`give_up_after_s`). The router's
:class:`sluicegate.router.client.PartitionClient` and the SDK's direct
clients drive these with their own sockets, so all three read replies alike.

Example:
    >>> from sluicegate import codec_leases as wire
    >>> give_up_after_s(250, timeout_s=0.05, attempts=3)
    0.4
    >>> acquire_decision("db", wire.encode_acquire_reply(7, (0, 9, 0, 10, 0, b""), lease=77)).lease
    77
    >>> release_outcome(wire.encode_release_reply(8, [(1, 10)]))  # an unknown lease; the limit is 10
    Released(released=False, concurrency=10)
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

from sluicegate import codec
from sluicegate import codec_leases as wire
from sluicegate.decision import Decision, from_item


class Released(NamedTuple):
    """A partition's answer to one release: was the lease live, and the key's concurrency limit now.

    ``concurrency`` is 0 for a key that holds no concurrency state (nothing was ever acquired).
    """

    released: bool
    concurrency: int


def give_up_after_s(max_wait_ms: int, *, timeout_s: float, attempts: int) -> float:
    """Seconds after which a request that may be held ``max_wait_ms`` gets no answer any more."""
    return max_wait_ms / 1000 + timeout_s * attempts


def request_id_of(data: bytes) -> int:
    """The request id of a datagram (raises :class:`sluicegate.codec.MalformedDatagram`)."""
    return codec.decode_header(data)[1]


def acquire_request(request_id: int, key: str, cost: int, *, ttl_ms: int, max_wait_ms: int) -> bytes:
    return wire.encode_acquire_request(request_id, key.encode("utf-8"), cost, ttl_ms, max_wait_ms)


def check_wait_request(request_id: int, key: str, cost: int, *, max_wait_ms: int) -> bytes:
    return wire.encode_check_wait_request(request_id, key.encode("utf-8"), cost, max_wait_ms)


def release_request(request_id: int, key: str, lease: int, *, wait_ms: int, service_ms: int) -> bytes:
    return wire.encode_release_request(request_id, [(key.encode("utf-8"), lease, wait_ms, service_ms)])


def acquire_decision(key: str, reply: bytes) -> Decision:
    """The decision an ACQUIRE reply carries; ``lease`` is None when denied or when the key has no concurrency limit."""
    _, item, lease = wire.decode_acquire_reply(reply)
    return replace(from_item(key, item), lease=lease or None)


def check_decision(key: str, reply: bytes) -> Decision:
    """The decision of a one-check reply (the answer to CHECK_WAIT)."""
    return from_item(key, codec.decode_check_reply(reply)[1][0])


def release_outcome(reply: bytes) -> Released:
    """The answer to a one-lease RELEASE."""
    results = wire.decode_release_reply(reply)[1]
    if len(results) != 1:
        raise codec.MalformedDatagram("a one-lease release got another number of results")
    status, concurrency = results[0]
    return Released(status == codec.RELEASED, concurrency)
