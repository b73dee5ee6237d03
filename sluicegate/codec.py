"""Binary wire codec between router/SDK and bucket server (UDP). Pure module.

Every datagram starts with a 14-byte header, big-endian::

    magic "SG" (2) | version u8 | op u8 | request_id u64 | count u16

A reply has the request's op with the high bit set, the same request id, and
``count`` items. Ops:

* ``CHECK``: items ``key_len u16 | cost u32 | key``; reply items
  ``status u8 | remaining u32 | retry_after_ms u32 | capacity u32 | window_ms u32 | limit 16s``.
  ``limit`` names (UTF-8, zero-padded) the limit that denied the check, or
  that would have denied it when ``FLAG_WOULD_DENY`` is set (a shadow limit);
  empty otherwise. ``"rate"`` is a rule's main bucket.
* ``STATS``: no items; reply ``count`` u64 counters in :data:`STAT_NAMES` order.
* ``INVALIDATE``: items ``key_len u16 | key``; the server reloads those keys'
  rules. Reply: header only, ``count`` = keys it held.
* ``ACQUIRE`` (one item): ``key_len u16 | cost u32 | ttl_ms u32 | max_wait_ms u32 | key``;
  reply: a CHECK reply item then ``lease u64`` (0 when denied).
* ``RELEASE``: items ``key_len u16 | lease u64 | wait_ms u32 | service_ms u32 | key``; reply
  items ``status u8 | limit u32`` (released or unknown lease; the key's concurrency limit now).
* ``CHECK_WAIT`` (one item): ``key_len u16 | cost u32 | max_wait_ms u32 | key``; reply as CHECK.
  The server may hold the request up to ``max_wait_ms`` before it answers.

Op codes 7-127 are free for later ops. A reply is never
larger than the datagram that caused it (no amplification): encoders pad a
request with zero bytes up to the size of its reply, and decoders reject a
request too short to pay for its reply.

Example:
    >>> data = encode_check_request(7, [(b"alice", 1)])
    >>> decode_check_request(data)
    (7, [(b'alice', 1)])
    >>> reply = encode_check_reply(7, [(STATUS_ALLOWED, 9, 0, 10, 1000, b"")])
    >>> len(reply) <= len(data)
    True
    >>> decode_check_reply(reply)[1][0].allowed
    True
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any, NamedTuple

from sluicegate.rules import MAX_KEY_BYTES

MAGIC = b"SG"
VERSION = 2  # 2: reply items name the deciding limit
OP_CHECK = 1
OP_STATS = 2
OP_INVALIDATE = 3
OP_ACQUIRE = 4
OP_RELEASE = 5
OP_CHECK_WAIT = 6
REPLY_BIT = 0x80
KNOWN_OPS = frozenset({OP_CHECK, OP_STATS, OP_INVALIDATE, OP_ACQUIRE, OP_RELEASE, OP_CHECK_WAIT})

STATUS_ALLOWED = 0
STATUS_DENIED = 1
STATUS_INVALID = 2  # the key is not valid UTF-8
RELEASED = 0
UNKNOWN_LEASE = 1  # never granted, released before, or reclaimed after its ttl
STATUS_MASK = 0x0F
FLAG_DEFAULT_RULE = 0x80  # set in the status byte when the default rule decided
FLAG_WOULD_DENY = 0x40  # admitted, but a shadow limit (named in the item) would have denied it
MAX_LIMIT_NAME = 16  # bytes of a limit's name on the wire

MAX_COST = 2**32 - 1
MAX_ITEMS = 2048
STAT_NAMES = (
    "checks",
    "allowed",
    "denied",
    "malformed",
    "duplicates",
    "keys",
    "charged",
    "rule_loads",
    "datagrams",
    "expired",
    "store_errors",
    "send_errors",
    "would_deny",
    "reclaimed",
    "waited",
)

HEADER = struct.Struct("!2sBBQH")
CHECK_ITEM = struct.Struct("!HI")
KEY_LEN = struct.Struct("!H")
RESULT_ITEM = struct.Struct("!BIIII16s")
COUNTER = struct.Struct("!Q")
HEADER_SIZE = HEADER.size


class MalformedDatagram(ValueError):
    """A datagram that does not parse; the server drops and counts it."""


class ItemResult(NamedTuple):
    status: int
    remaining: int
    retry_after_ms: int
    capacity: int
    window_ms: int
    limit: bytes = b""  # the padding stripped

    @property
    def allowed(self) -> bool:
        return self.status & STATUS_MASK == STATUS_ALLOWED

    @property
    def default_rule(self) -> bool:
        return bool(self.status & FLAG_DEFAULT_RULE)

    @property
    def would_deny(self) -> bool:
        return bool(self.status & FLAG_WOULD_DENY)

    @property
    def limit_name(self) -> str | None:
        """The deciding limit's name, or None."""
        return self.limit.decode("utf-8", "replace") if self.limit else None


def check_reply_size(count: int) -> int:
    return HEADER_SIZE + RESULT_ITEM.size * count


def stats_reply_size() -> int:
    return HEADER_SIZE + COUNTER.size * len(STAT_NAMES)


def pad(data: bytes, size: int) -> bytes:
    return data + bytes(size - len(data)) if len(data) < size else data


def check_key_size(key: bytes) -> None:
    if not 1 <= len(key) <= MAX_KEY_BYTES:
        raise ValueError(f"key must be 1 to {MAX_KEY_BYTES} bytes")


def key_end(data: bytes, offset: int, key_len: int) -> int:
    """Where a key of ``key_len`` bytes at ``offset`` ends; malformed if it cannot be there."""
    end = offset + key_len
    if not 1 <= key_len <= MAX_KEY_BYTES or end > len(data):
        raise MalformedDatagram("bad key length")
    return end


def check_padding(data: bytes, end: int) -> None:
    # count() scans in place: no slice is allocated on the hot path.
    if end < len(data) and data.count(0, end) != len(data) - end:
        raise MalformedDatagram("trailing bytes that are not padding")


def decode_header(data: bytes) -> tuple[int, int, int]:
    """Return ``(op, request_id, count)``; raise :class:`MalformedDatagram` if invalid."""
    if len(data) < HEADER_SIZE:
        raise MalformedDatagram("shorter than a header")
    magic, version, op, request_id, count = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise MalformedDatagram("bad magic")
    if version != VERSION:
        raise MalformedDatagram(f"unsupported version {version}")
    if op & ~REPLY_BIT not in KNOWN_OPS:
        raise MalformedDatagram(f"unknown op {op}")
    return op, request_id, count


def decode_request_header(data: bytes, expected_op: int) -> tuple[int, int]:
    op, request_id, count = decode_header(data)
    if op != expected_op:
        raise MalformedDatagram(f"expected op {expected_op}, got {op}")
    return request_id, count


def encode_check_request(request_id: int, checks: Sequence[tuple[bytes, int]]) -> bytes:
    """One datagram asking for ``checks`` (key bytes, cost), padded to its reply's size."""
    if not 1 <= len(checks) <= MAX_ITEMS:
        raise ValueError(f"a check datagram carries 1 to {MAX_ITEMS} checks")
    parts = [HEADER.pack(MAGIC, VERSION, OP_CHECK, request_id, len(checks))]
    for key, cost in checks:
        check_key_size(key)
        if not 1 <= cost <= MAX_COST:
            raise ValueError(f"cost must be 1 to {MAX_COST}")
        parts.append(CHECK_ITEM.pack(len(key), cost))
        parts.append(key)
    return pad(b"".join(parts), check_reply_size(len(checks)))


def decode_check_request(data: bytes) -> tuple[int, list[tuple[bytes, int]]]:
    """Return ``(request_id, [(key, cost), ...])`` of a CHECK datagram."""
    request_id, count = decode_request_header(data, OP_CHECK)
    return request_id, decode_check_items(data, count)


def decode_check_items(data: bytes, count: int) -> list[tuple[bytes, int]]:
    """The ``(key, cost)`` items of a CHECK datagram whose header says ``count``."""
    if not 1 <= count <= MAX_ITEMS:
        raise MalformedDatagram("item count out of range")
    if len(data) < check_reply_size(count):
        raise MalformedDatagram("request smaller than its reply (not padded)")
    checks = []
    offset = HEADER_SIZE
    size = len(data)
    for _ in range(count):
        if offset + 6 > size:
            raise MalformedDatagram("truncated item")
        key_len, cost = CHECK_ITEM.unpack_from(data, offset)
        offset += 6
        end = key_end(data, offset, key_len)
        if cost == 0:
            raise MalformedDatagram("cost must be positive")
        checks.append((data[offset:end], cost))
        offset = end
    check_padding(data, offset)
    return checks


SINGLE_CHECK = struct.Struct("!2sBBQHHI")  # header + the first item's key_len and cost
SINGLE_REPLY = struct.Struct("!2sBBQHBIIII16s")
_SINGLE_PREFIX = MAGIC + bytes([VERSION, OP_CHECK])
_SINGLE_MIN = check_reply_size(1)


def decode_single_check(data: bytes) -> tuple[int, bytes, int] | None:
    """Fast path: ``(request_id, key, cost)`` of a one-check CHECK datagram, else None.

    None means "not a one-check datagram": use :func:`decode_check_request`.
    Raises :class:`MalformedDatagram` exactly where that function would.
    """
    if len(data) < _SINGLE_MIN or data[:4] != _SINGLE_PREFIX:
        return None
    _, _, _, request_id, count, key_len, cost = SINGLE_CHECK.unpack_from(data)
    if count != 1:
        return None
    end = key_end(data, SINGLE_CHECK.size, key_len)
    if cost == 0:
        raise MalformedDatagram("cost must be positive")
    check_padding(data, end)
    return request_id, data[SINGLE_CHECK.size : end], cost


def encode_single_reply(
    request_id: int, status: int, remaining: int, retry_ms: int, capacity: int, window_ms: int, limit: bytes
) -> bytes:
    """The reply to a one-check datagram; equal to ``encode_check_reply`` with one result."""
    return SINGLE_REPLY.pack(
        MAGIC, VERSION, OP_CHECK | REPLY_BIT, request_id, 1, status, remaining, retry_ms, capacity, window_ms, limit
    )


def encode_check_reply(request_id: int, results: Sequence[tuple[int, int, int, int, int, bytes]]) -> bytes:
    """A CHECK reply; each result is ``(status, remaining, retry_after_ms, capacity, window_ms, limit)``.

    ``limit`` is the deciding limit's UTF-8 name (at most :data:`MAX_LIMIT_NAME` bytes) or ``b""``.
    """
    pack = RESULT_ITEM.pack
    return HEADER.pack(MAGIC, VERSION, OP_CHECK | REPLY_BIT, request_id, len(results)) + b"".join(
        pack(*result) for result in results
    )


def decode_check_reply(data: bytes) -> tuple[int, list[ItemResult]]:
    """Return ``(request_id, [ItemResult, ...])`` of a CHECK reply."""
    request_id, count = decode_request_header(data, OP_CHECK | REPLY_BIT)
    if len(data) != check_reply_size(count):
        raise MalformedDatagram("reply size does not match its item count")
    unpack = RESULT_ITEM.unpack_from
    size = RESULT_ITEM.size
    results = []
    for i in range(count):
        status, remaining, retry, capacity, window, limit = unpack(data, HEADER_SIZE + i * size)
        results.append(ItemResult(status, remaining, retry, capacity, window, limit.rstrip(b"\0")))
    return request_id, results


def encode_stats_request(request_id: int) -> bytes:
    return pad(HEADER.pack(MAGIC, VERSION, OP_STATS, request_id, 0), stats_reply_size())


def decode_stats_request(data: bytes) -> int:
    """Return the request id of a STATS datagram."""
    request_id, _ = decode_request_header(data, OP_STATS)
    if len(data) < stats_reply_size():
        raise MalformedDatagram("stats request smaller than its reply (not padded)")
    check_padding(data, HEADER_SIZE)
    return request_id


def encode_stats_reply(request_id: int, counters: dict[str, int]) -> bytes:
    values = [COUNTER.pack(counters.get(name, 0)) for name in STAT_NAMES]
    return HEADER.pack(MAGIC, VERSION, OP_STATS | REPLY_BIT, request_id, len(values)) + b"".join(values)


def decode_stats_reply(data: bytes) -> tuple[int, dict[str, int]]:
    request_id, count = decode_request_header(data, OP_STATS | REPLY_BIT)
    if len(data) != HEADER_SIZE + COUNTER.size * count:
        raise MalformedDatagram("stats reply size does not match its count")
    # A newer server may send more counters than this client knows: keep the known ones.
    values = [COUNTER.unpack_from(data, HEADER_SIZE + i * COUNTER.size)[0] for i in range(count)]
    return request_id, dict(zip(STAT_NAMES, values, strict=False))


def encode_invalidate_request(request_id: int, keys: Sequence[bytes]) -> bytes:
    if not 1 <= len(keys) <= MAX_ITEMS:
        raise ValueError(f"an invalidate datagram carries 1 to {MAX_ITEMS} keys")
    parts = [HEADER.pack(MAGIC, VERSION, OP_INVALIDATE, request_id, len(keys))]
    for key in keys:
        check_key_size(key)
        parts.append(KEY_LEN.pack(len(key)))
        parts.append(key)
    return b"".join(parts)


def decode_keyed_items(data: bytes, count: int, item: struct.Struct) -> list[tuple[Any, ...]]:
    """``count`` items of ``item`` (its first field the key's length), each followed by its key.

    Returns ``(key, *the item's other fields)`` per item; the rest of ``data`` must be padding.
    """
    if not 1 <= count <= MAX_ITEMS:
        raise MalformedDatagram("item count out of range")
    items = []
    offset = HEADER_SIZE
    for _ in range(count):
        if offset + item.size > len(data):
            raise MalformedDatagram("truncated item")
        key_len, *fields = item.unpack_from(data, offset)
        offset += item.size
        end = key_end(data, offset, key_len)
        items.append((data[offset:end], *fields))
        offset = end
    check_padding(data, offset)
    return items


def decode_invalidate_request(data: bytes) -> tuple[int, list[bytes]]:
    request_id, count = decode_request_header(data, OP_INVALIDATE)
    return request_id, [key for (key,) in decode_keyed_items(data, count, KEY_LEN)]


def encode_invalidate_reply(request_id: int, held: int) -> bytes:
    return HEADER.pack(MAGIC, VERSION, OP_INVALIDATE | REPLY_BIT, request_id, held)


def decode_invalidate_reply(data: bytes) -> tuple[int, int]:
    request_id, held = decode_request_header(data, OP_INVALIDATE | REPLY_BIT)
    if len(data) != HEADER_SIZE:
        raise MalformedDatagram("invalidate reply has a body")
    return request_id, held
