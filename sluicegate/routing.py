"""Routing key and partition choice: crc32 (as zlib) + jump consistent hash.

Every component (router, SDK, tests) must use :func:`partition_for` so that a
key always lands on the same partition.

Example:
    >>> partition_for("{acme}/gold", 4) == partition_for("{acme}/bronze", 4)
    True
"""

from __future__ import annotations

import zlib

_MASK64 = (1 << 64) - 1
_JUMP_MULTIPLIER = 2862933555777941757


def routing_key(key: str) -> str:
    """The part of ``key`` inside the first ``{...}`` when non-empty, else ``key``.

    This is the Redis Cluster hash-tag rule: keys sharing a tag share a partition.
    """
    start = key.find("{")
    if start >= 0:
        end = key.find("}", start + 1)
        if end > start + 1:
            return key[start + 1 : end]
    return key


def key_hash(key: str) -> int:
    """crc32 (IEEE, as zlib) of the UTF-8 routing key."""
    return zlib.crc32(routing_key(key).encode("utf-8"))


def jump_hash(key: int, buckets: int) -> int:
    """Jump consistent hash (Lamping & Veach 2014) of a 64-bit key.

    Growing ``buckets`` by one moves about ``1/buckets`` of the keys.
    """
    if buckets <= 0:
        raise ValueError("buckets must be positive")
    b, j = -1, 0
    key &= _MASK64
    while j < buckets:
        b = j
        key = (key * _JUMP_MULTIPLIER + 1) & _MASK64
        j = int((b + 1) * ((1 << 31) / ((key >> 33) + 1)))
    return b


def partition_for(key: str, partitions: int) -> int:
    """The partition (0-based) that owns ``key`` among ``partitions``."""
    return jump_hash(key_hash(key), partitions)
