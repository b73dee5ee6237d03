"""Wire codec: round trips, padding (no amplification), malformed input rejected."""

from __future__ import annotations

import random

import pytest

from sluicegate import codec
from sluicegate.codec import MalformedDatagram


def test_check_round_trip_many_items() -> None:
    checks = [(f"key-{i}".encode(), i + 1) for i in range(50)] + [("ключ".encode(), 7)]
    data = codec.encode_check_request(2**64 - 1, checks)
    assert codec.decode_check_request(data) == (2**64 - 1, checks)
    results = [(codec.STATUS_DENIED | codec.FLAG_DEFAULT_RULE, 3, 250, 10, 1000, b"rate")] * len(checks)
    request_id, decoded = codec.decode_check_reply(codec.encode_check_reply(5, results))
    assert request_id == 5
    assert decoded[0] == codec.ItemResult(*results[0])
    assert not decoded[0].allowed and decoded[0].default_rule


@pytest.mark.parametrize("count", [1, 2, 16, 100])
def test_requests_are_padded_so_replies_are_never_larger(count: int) -> None:
    data = codec.encode_check_request(1, [(b"k", 1)] * count)
    reply = codec.encode_check_reply(1, [(0, 0, 0, 0, 0, b"")] * count)
    assert len(reply) <= len(data)
    assert len(codec.encode_stats_reply(1, {})) <= len(codec.encode_stats_request(1))
    assert len(codec.encode_invalidate_reply(1, 1)) <= len(codec.encode_invalidate_request(1, [b"k"]))


def test_unpadded_request_is_malformed() -> None:
    data = codec.encode_check_request(1, [(b"k", 1)])
    unpadded = data[: codec.HEADER_SIZE + 6 + 1]
    with pytest.raises(MalformedDatagram):
        codec.decode_check_request(unpadded)


def test_stats_and_invalidate_round_trip() -> None:
    counters = {name: i * 1000 for i, name in enumerate(codec.STAT_NAMES)}
    assert codec.decode_stats_reply(codec.encode_stats_reply(9, counters)) == (9, counters)
    assert codec.decode_stats_request(codec.encode_stats_request(9)) == 9
    keys = [b"a", b"b" * 256]
    assert codec.decode_invalidate_request(codec.encode_invalidate_request(4, keys)) == (4, keys)
    assert codec.decode_invalidate_reply(codec.encode_invalidate_reply(4, 2)) == (4, 2)


@pytest.mark.parametrize(
    "checks",
    [[], [(b"", 1)], [(b"x" * 257, 1)], [(b"k", 0)], [(b"k", 2**32)]],
    ids=["empty", "empty-key", "long-key", "zero-cost", "huge-cost"],
)
def test_encoder_refuses_what_the_decoder_would_reject(checks: list[tuple[bytes, int]]) -> None:
    with pytest.raises(ValueError):
        codec.encode_check_request(1, checks)


def _valid() -> bytes:
    return codec.encode_check_request(77, [(b"alice", 2), (b"bob", 3)])


def _malformed_variants() -> dict[str, bytes]:
    good = bytearray(_valid())
    variants = {
        "empty": b"",
        "short-header": bytes(good[:10]),
        "bad-magic": b"XX" + bytes(good[2:]),
        "bad-version": bytes(good[:2]) + b"\x09" + bytes(good[3:]),
        "unknown-op": bytes(good[:3]) + b"\x7f" + bytes(good[4:]),
        "reply-op": bytes(good[:3]) + b"\x81" + bytes(good[4:]),
        "zero-count": bytes(good[:12]) + b"\x00\x00" + bytes(good[14:]),
        "count-too-big": bytes(good[:12]) + b"\xff\xff" + bytes(good[14:]),
        "truncated-item": bytes(good[: codec.HEADER_SIZE + 3]),
        "key-past-end": bytes(good[:14]) + b"\x03\xe8" + bytes(good[16:]),
        "zero-key-len": bytes(good[:14]) + b"\x00\x00" + bytes(good[16:]),
        "zero-cost": bytes(good[:16]) + b"\x00\x00\x00\x00" + bytes(good[20:]),
        "garbage-after-items": bytes(good) + b"\x01",
    }
    return variants


@pytest.mark.parametrize("name", list(_malformed_variants()))
def test_malformed_check_requests_are_rejected(name: str) -> None:
    with pytest.raises(MalformedDatagram):
        codec.decode_check_request(_malformed_variants()[name])


def test_random_bytes_never_decode_as_a_request() -> None:
    rng = random.Random(1)
    for _ in range(20_000):
        blob = rng.randbytes(rng.randrange(0, 200))
        with pytest.raises(MalformedDatagram):
            codec.decode_check_request(blob)
