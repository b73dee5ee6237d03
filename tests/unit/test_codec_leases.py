"""Wire codec of ACQUIRE, RELEASE and CHECK_WAIT: round trips, padding, malformed input."""

from __future__ import annotations

import pytest

from sluicegate import codec
from sluicegate import codec_leases as wire


def test_acquire_round_trip_and_reply_never_larger_than_request() -> None:
    data = wire.encode_acquire_request(5, b"db:writes", 2, 30_000, 250)
    assert wire.decode_acquire_request(data) == (5, b"db:writes", 2, 30_000, 250)
    reply = wire.encode_acquire_reply(5, (codec.STATUS_ALLOWED, 8, 0, 10, 0, b""), 2**64 - 1)
    assert len(reply) <= len(data)
    request_id, item, lease = wire.decode_acquire_reply(reply)
    assert (request_id, item.allowed, item.remaining, lease) == (5, True, 8, 2**64 - 1)
    denied = wire.encode_acquire_reply(5, (codec.STATUS_DENIED, 0, 90, 10, 0, b"inflight"), 0)
    assert wire.decode_acquire_reply(denied)[1].limit_name == "inflight"


def test_check_wait_round_trip_answered_with_a_check_reply() -> None:
    data = wire.encode_check_wait_request(6, b"k", 3, 1000)
    assert wire.decode_check_wait_request(data) == (6, b"k", 3, 1000)
    assert len(codec.encode_check_reply(6, [(0, 1, 0, 5, 5000, b"")])) <= len(data)


def test_release_round_trip_many_leases() -> None:
    releases = [(b"a", 1, 10, 200), (b"b" * 256, 2**63, 0, 2**32 - 1)]
    data = wire.encode_release_request(7, releases)
    assert wire.decode_release_request(data) == (7, releases)
    reply = wire.encode_release_reply(7, [(codec.RELEASED, 10), (codec.UNKNOWN_LEASE, 10)])
    assert len(reply) <= len(data)
    assert wire.decode_release_reply(reply) == (7, [(codec.RELEASED, 10), (codec.UNKNOWN_LEASE, 10)])


@pytest.mark.parametrize(
    "data",
    [
        wire.encode_acquire_request(1, b"k", 1, 10)[:-20],  # not padded
        codec.HEADER.pack(codec.MAGIC, codec.VERSION, codec.OP_ACQUIRE, 1, 2) + bytes(120),  # two items
        wire.encode_acquire_request(1, b"k", 1, 10)[:-1] + b"x",  # trailing junk
        wire.encode_check_wait_request(1, b"k", 1, 10).replace(b"\x00\x00\x00\x01\x00\x00\x00\x0a", bytes(8), 1),
    ],
)
def test_malformed_requests_are_refused(data: bytes) -> None:
    with pytest.raises(codec.MalformedDatagram):
        op = codec.decode_header(data)[0]
        if op == codec.OP_ACQUIRE:
            wire.decode_acquire_request(data)
        else:
            wire.decode_check_wait_request(data)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: wire.encode_acquire_request(1, b"", 1, 10), "key"),
        (lambda: wire.encode_acquire_request(1, b"k", 0, 10), "cost"),
        (lambda: wire.encode_acquire_request(1, b"k", 1, 0), "ttl_ms"),
        (lambda: wire.encode_check_wait_request(1, b"k", 1, 2**32), "max_wait_ms"),
        (lambda: wire.encode_release_request(1, []), "1 to"),
    ],
)
def test_encoders_refuse_values_the_wire_cannot_carry(call, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        call()
