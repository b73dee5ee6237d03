"""Routing key and partition choice, pinned by the shared reference vectors."""

from __future__ import annotations

import datetime
import json
import random
import statistics
import uuid
from pathlib import Path

import pytest

from sluicegate.routing import jump_hash, key_hash, partition_for, routing_key

VECTORS = json.loads((Path(__file__).parent / "partition_vectors.json").read_text())["vectors"]
WORDS = Path("/usr/share/dict/american-english-insane")  # Debian wamerican-insane; `make test` installs it
KEYS_PER_KIND = 500_000


@pytest.mark.parametrize("vector", VECTORS, ids=lambda v: v["key"][:24])
def test_reference_vectors(vector: dict) -> None:
    assert routing_key(vector["key"]) == vector["routing_key"]
    assert key_hash(vector["key"]) == vector["crc32"]
    for partitions, expected in vector["partition"].items():
        assert partition_for(vector["key"], int(partitions)) == expected


@pytest.mark.parametrize(
    ("key", "expected"),
    [("{acme}/gold", "acme"), ("x{}y", "x{}y"), ("{a}{b}", "a"), ("no-tag}", "no-tag}"), ("open{only", "open{only")],
)
def test_routing_key_uses_first_non_empty_hash_tag(key: str, expected: str) -> None:
    assert routing_key(key) == expected


def test_keys_sharing_a_hash_tag_share_a_partition() -> None:
    assert {partition_for(f"{{tenant-7}}/user-{i}", 32) for i in range(100)} == {partition_for("tenant-7", 32)}


def test_jump_hash_rejects_no_buckets() -> None:
    with pytest.raises(ValueError):
        jump_hash(1, 0)


def _key_kinds() -> dict[str, list[str]]:
    rng = random.Random(20261121)
    start = datetime.datetime(2018, 3, 4)
    words = WORDS.read_text(encoding="utf-8").splitlines()[:KEYS_PER_KIND]
    return {
        "uuid": [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(KEYS_PER_KIND)],
        "timestamp": [
            (start + datetime.timedelta(seconds=i)).strftime("%Y-%m-%d-%H-%M-%S") for i in range(KEYS_PER_KIND)
        ],
        "words": words,
        "sequential": [str(150_000_001 + i) for i in range(KEYS_PER_KIND)],
    }


def test_key_pressure_spread_and_growth() -> None:
    """Janus Fig. 6: 500k keys of each kind over 20 partitions spread evenly; 20 -> 21 moves ~1/21."""
    assert WORDS.exists(), "install the Debian word list: apt-get install wamerican-insane (make test does)"
    for kind, keys in _key_kinds().items():
        assert len(keys) == KEYS_PER_KIND, kind
        counts = [0] * 20
        moved = 0
        for key in keys:
            home = partition_for(key, 20)
            counts[home] += 1
            moved += partition_for(key, 21) != home
        shares = [100 * count / len(keys) for count in counts]
        assert 4.88 <= min(shares) and max(shares) <= 5.12, (kind, min(shares), max(shares))
        assert statistics.stdev(shares) <= 0.045, (kind, statistics.stdev(shares))
        assert moved / len(keys) < 0.06, (kind, moved / len(keys))
        # Growing by one may only move keys *to* the new partition (no reshuffle among old ones).
        assert all(partition_for(k, 21) in (partition_for(k, 20), 20) for k in keys[:2000])
