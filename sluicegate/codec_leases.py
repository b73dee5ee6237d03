"""Wire codec of the concurrency and waiting ops: ACQUIRE, RELEASE, CHECK_WAIT. Pure module.

The header, statuses and the CHECK reply item are :mod:`sluicegate.codec`'s
(see its docstring for the layouts). ACQUIRE and CHECK_WAIT carry exactly one
item: the server may hold such a request until it can admit it, so it is
answered alone. Requests are padded to their reply's size, as everywhere.

Example:
    >>> data = encode_acquire_request(9, b"db", cost=1, ttl_ms=30_000, max_wait_ms=250)
    >>> decode_acquire_request(data)
    (9, b'db', 1, 30000, 250)
    >>> reply = encode_acquire_reply(9, (0, 9, 0, 10, 0, b""), lease=77)  # allowed, 9 of 10 left
    >>> decode_acquire_reply(reply)[2], len(reply) <= len(data)
    (77, True)
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from sluicegate.codec import (
    HEADER,
    HEADER_SIZE,
    MAGIC,
    MAX_ITEMS,
    OP_ACQUIRE,
    OP_CHECK_WAIT,
    OP_RELEASE,
    REPLY_BIT,
    VERSION,
    ItemResult,
    MalformedDatagram,
    check_key_size,
    check_padding,
    check_reply_size,
    decode_keyed_items,
    decode_request_header,
    key_end,
    pad,
)

ACQUIRE_ITEM = struct.Struct("!HIII")  # key_len, cost, ttl_ms, max_wait_ms
ACQUIRE_RESULT = struct.Struct("!BIIII16sQ")
WAIT_ITEM = struct.Struct("!HII")  # key_len, cost, max_wait_ms
RELEASE_ITEM = struct.Struct("!HQII")  # key_len, lease, wait_ms, service_ms
RELEASE_RESULT = struct.Struct("!BI")
MAX_U32 = 2**32 - 1


def _one_keyed_item(data: bytes, op: int, item: struct.Struct, reply_size: int) -> tuple[int, tuple[int, ...], bytes]:
    """``(request_id, the item's numbers after key_len, key)`` of a one-item request of ``op``."""
    request_id, count = decode_request_header(data, op)
    if count != 1:
        raise MalformedDatagram("this op carries exactly one item")
    if len(data) < reply_size:
        raise MalformedDatagram("request smaller than its reply (not padded)")
    if len(data) < HEADER_SIZE + item.size:
        raise MalformedDatagram("truncated item")
    key_len, *numbers = item.unpack_from(data, HEADER_SIZE)
    start = HEADER_SIZE + item.size
    end = key_end(data, start, key_len)
    check_padding(data, end)
    return request_id, tuple(numbers), data[start:end]


def _check_u32(name: str, value: int, low: int = 0) -> None:
    if not low <= value <= MAX_U32:
        raise ValueError(f"{name} must be {low} to {MAX_U32}")


def encode_acquire_request(request_id: int, key: bytes, cost: int, ttl_ms: int, max_wait_ms: int = 0) -> bytes:
    """Ask for a lease of ``cost`` on ``key``'s concurrency limit, held at most ``ttl_ms``."""
    check_key_size(key)
    _check_u32("cost", cost, 1)
    _check_u32("ttl_ms", ttl_ms, 1)
    _check_u32("max_wait_ms", max_wait_ms)
    data = HEADER.pack(MAGIC, VERSION, OP_ACQUIRE, request_id, 1) + ACQUIRE_ITEM.pack(
        len(key), cost, ttl_ms, max_wait_ms
    )
    return pad(data + key, HEADER_SIZE + ACQUIRE_RESULT.size)


def decode_acquire_request(data: bytes) -> tuple[int, bytes, int, int, int]:
    """``(request_id, key, cost, ttl_ms, max_wait_ms)`` of an ACQUIRE datagram."""
    request_id, (cost, ttl_ms, max_wait_ms), key = _one_keyed_item(
        data, OP_ACQUIRE, ACQUIRE_ITEM, HEADER_SIZE + ACQUIRE_RESULT.size
    )
    if cost == 0 or ttl_ms == 0:
        raise MalformedDatagram("cost and ttl must be positive")
    return request_id, key, cost, ttl_ms, max_wait_ms


def encode_acquire_reply(request_id: int, result: tuple[int, int, int, int, int, bytes], lease: int) -> bytes:
    return HEADER.pack(MAGIC, VERSION, OP_ACQUIRE | REPLY_BIT, request_id, 1) + ACQUIRE_RESULT.pack(*result, lease)


def decode_acquire_reply(data: bytes) -> tuple[int, ItemResult, int]:
    """``(request_id, the decision's item, lease)``; the lease is 0 when denied."""
    request_id, count = decode_request_header(data, OP_ACQUIRE | REPLY_BIT)
    if count != 1 or len(data) != HEADER_SIZE + ACQUIRE_RESULT.size:
        raise MalformedDatagram("acquire reply size does not match")
    status, remaining, retry, capacity, window, limit, lease = ACQUIRE_RESULT.unpack_from(data, HEADER_SIZE)
    return request_id, ItemResult(status, remaining, retry, capacity, window, limit.rstrip(b"\0")), lease


def encode_check_wait_request(request_id: int, key: bytes, cost: int, max_wait_ms: int) -> bytes:
    """A check that may wait up to ``max_wait_ms`` for room; answered with a CHECK reply."""
    check_key_size(key)
    _check_u32("cost", cost, 1)
    _check_u32("max_wait_ms", max_wait_ms)
    data = HEADER.pack(MAGIC, VERSION, OP_CHECK_WAIT, request_id, 1) + WAIT_ITEM.pack(len(key), cost, max_wait_ms)
    return pad(data + key, check_reply_size(1))


def decode_check_wait_request(data: bytes) -> tuple[int, bytes, int, int]:
    """``(request_id, key, cost, max_wait_ms)`` of a CHECK_WAIT datagram."""
    request_id, (cost, max_wait_ms), key = _one_keyed_item(data, OP_CHECK_WAIT, WAIT_ITEM, check_reply_size(1))
    if cost == 0:
        raise MalformedDatagram("cost must be positive")
    return request_id, key, cost, max_wait_ms


def encode_release_request(request_id: int, releases: Sequence[tuple[bytes, int, int, int]]) -> bytes:
    """Give leases back: ``(key, lease, wait_ms, service_ms)`` each (times for adaptive limits)."""
    if not 1 <= len(releases) <= MAX_ITEMS:
        raise ValueError(f"a release datagram carries 1 to {MAX_ITEMS} leases")
    parts = [HEADER.pack(MAGIC, VERSION, OP_RELEASE, request_id, len(releases))]
    for key, lease, wait_ms, service_ms in releases:
        check_key_size(key)
        _check_u32("wait_ms", wait_ms)
        _check_u32("service_ms", service_ms)
        parts.append(RELEASE_ITEM.pack(len(key), lease, wait_ms, service_ms))
        parts.append(key)
    return pad(b"".join(parts), HEADER_SIZE + RELEASE_RESULT.size * len(releases))


def decode_release_request(data: bytes) -> tuple[int, list[tuple[bytes, int, int, int]]]:
    """``(request_id, [(key, lease, wait_ms, service_ms), ...])`` of a RELEASE datagram."""
    request_id, count = decode_request_header(data, OP_RELEASE)
    releases: list[Any] = decode_keyed_items(data, count, RELEASE_ITEM)
    if len(data) < HEADER_SIZE + RELEASE_RESULT.size * count:
        raise MalformedDatagram("request smaller than its reply (not padded)")
    return request_id, releases


def encode_release_reply(request_id: int, results: Sequence[tuple[int, int]]) -> bytes:
    """``(status, limit)`` per lease: RELEASED or UNKNOWN_LEASE, and the key's concurrency limit now."""
    header = HEADER.pack(MAGIC, VERSION, OP_RELEASE | REPLY_BIT, request_id, len(results))
    return header + b"".join(RELEASE_RESULT.pack(status, limit) for status, limit in results)


def decode_release_reply(data: bytes) -> tuple[int, list[tuple[int, int]]]:
    request_id, count = decode_request_header(data, OP_RELEASE | REPLY_BIT)
    if len(data) != HEADER_SIZE + RELEASE_RESULT.size * count:
        raise MalformedDatagram("release reply size does not match its count")
    size = RELEASE_RESULT.size
    return request_id, [RELEASE_RESULT.unpack_from(data, HEADER_SIZE + i * size) for i in range(count)]
