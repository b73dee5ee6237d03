"""The partition protocol state without I/O: coalescing, request ids, retries, fallback, stray replies."""

from __future__ import annotations

from sluicegate import codec
from sluicegate.exchange import Exchange, Flight

PARTITION = ("127.0.0.1", 7000)


def reply_to(flight: Flight, remaining: int = 4) -> bytes:
    request_id, items = codec.decode_check_request(flight.data)
    return codec.encode_check_reply(request_id, [(codec.STATUS_ALLOWED, remaining, 0, 5, 5000, b"")] * len(items))


def test_checks_queued_for_a_partition_leave_as_one_datagram_and_are_answered_in_order() -> None:
    exchange = Exchange()
    assert exchange.queue(0, "a", 1, "wa") is True
    assert exchange.queue(0, "b", 2, "wb") is False  # already queued: the caller flushes once
    [flight], failed = exchange.flush(0, PARTITION, now=0.0)
    assert failed == [] and codec.decode_check_request(flight.data)[1] == [(b"a", 1), (b"b", 2)]
    done, answers = exchange.receive(reply_to(flight), PARTITION)
    assert done is flight and [(waiter, d.key, d.remaining) for waiter, d in answers] == [
        ("wa", "a", 4),
        ("wb", "b", 4),
    ]
    assert exchange.inflight == {}


def test_a_large_queue_is_split_to_fit_the_datagram_size() -> None:
    exchange = Exchange(max_datagram=512)
    for i in range(100):
        exchange.queue(1, f"key-{i:04d}", 1, i)
    flights, _ = exchange.flush(1, PARTITION, now=0.0)
    assert len(flights) > 1 and all(len(f.data) <= 512 for f in flights)
    assert sum(len(f.items) for f in flights) == 100 and len({f.request_id for f in flights}) == len(flights)


def test_a_timed_out_flight_is_resent_with_its_id_then_falls_back() -> None:
    exchange = Exchange(attempts=2, timeout_s=0.05, fail_open=False)
    exchange.queue(0, "a", 1, "wa")
    [flight], _ = exchange.flush(0, PARTITION, now=1.0)
    assert exchange.expire(now=1.04) == ([], [])
    resend, answers = exchange.expire(now=1.05)
    assert resend == [flight] and answers == [] and flight.deadline == 1.1  # same data, same id
    resend, answers = exchange.expire(now=1.1)
    assert resend == [] and [(w, d.allowed, d.fallback, d.retry_after_ms) for w, d in answers] == [
        ("wa", False, True, 1000)
    ]
    assert (exchange.timeouts, exchange.fallbacks, exchange.next_deadline()) == (2, 1, None)
    assert exchange.receive(reply_to(flight), PARTITION) == (None, [])  # too late: already answered


def test_replies_from_elsewhere_or_of_the_wrong_shape_are_ignored() -> None:
    exchange = Exchange()
    exchange.queue(0, "a", 1, "wa")
    [flight], _ = exchange.flush(0, PARTITION, now=0.0)
    assert exchange.receive(reply_to(flight), ("127.0.0.1", 7001)) == (None, [])
    assert exchange.receive(b"garbage", PARTITION) == (None, [])
    two = codec.encode_check_reply(flight.request_id, [(codec.STATUS_ALLOWED, 1, 0, 5, 5000, b"")] * 2)
    assert exchange.receive(two, PARTITION) == (None, [])
    assert exchange.receive(reply_to(flight), PARTITION)[0] is flight


def test_a_check_that_cannot_be_encoded_falls_back_instead_of_hanging() -> None:
    exchange = Exchange(fail_open=True)
    exchange.queue(0, "k" * 300, 1, "w")
    flights, failed = exchange.flush(0, PARTITION, now=0.0)
    assert flights == [] and [(w, d.allowed, d.fallback) for w, d in failed] == [("w", True, True)]
