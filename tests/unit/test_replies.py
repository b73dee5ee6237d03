"""Reply cache: exact window, oldest-first expiry, bounded size."""

from __future__ import annotations

from sluicegate.server.replies import ReplyCache

ADDR = ("127.0.0.1", 5000)


def test_entries_expire_one_by_one_in_arrival_order() -> None:
    cache = ReplyCache(ttl_ns=100)
    for t in range(300):
        cache.put((ADDR, t), b"r%d" % t, now_ns=t)
    # Only the last 100 ns of replies are held: the size is bounded by the arrival rate.
    assert len(cache) == 100
    assert cache.get((ADDR, 199), now_ns=299) is None
    assert cache.get((ADDR, 200), now_ns=299) == b"r200"


def test_same_request_id_from_another_sender_is_a_different_request() -> None:
    cache = ReplyCache(ttl_ns=100)
    cache.put((ADDR, 1), b"mine", now_ns=0)
    assert cache.get((("127.0.0.1", 5001), 1), now_ns=0) is None


def test_expired_entry_is_not_served_even_without_new_puts() -> None:
    cache = ReplyCache(ttl_ns=100)
    cache.put((ADDR, 1), b"old", now_ns=0)
    assert cache.get((ADDR, 1), now_ns=100) is None
    assert len(cache) == 0
