"""Concurrency leases (limit, ids, ttl reclaim, expected wait) and the wait queue (FIFO, deadlines)."""

from __future__ import annotations

import heapq
import random

import pytest

from sluicegate.concurrency import NEVER_NS, ConcurrencyState, Lease, Waiter, WaitQueue

MS = 1_000_000


# -- leases -----------------------------------------------------------------------------------


def test_leases_never_exceed_the_limit_under_random_acquire_release_reclaim() -> None:
    """Random operations, a moving limit and a clock, against a model of the live leases."""
    rng = random.Random(7)
    state = ConcurrencyState(10, first_lease_id=1)
    live: dict[int, Lease] = {}
    seen_ids: set[int] = set()
    now = 0
    grants = denials = model_reclaimed = 0
    for _ in range(20_000):
        now += rng.randrange(0, 3 * MS)
        expired = sorted((lease for lease in live.values() if lease.expires_ns <= now), key=lambda x: x.expires_ns)
        for lease in expired:
            del live[lease.lease_id]
        model_reclaimed += len(expired)
        op = rng.random()
        if op < 0.5:
            cost = rng.randint(1, 4)
            lease = state.try_acquire(cost, rng.randint(1, 60) * MS, now)
            room = state.limit - sum(lease.cost for lease in live.values())
            if lease is None:
                assert cost > room
                denials += 1
            else:
                assert cost <= room
                assert lease.lease_id not in seen_ids
                assert lease.acquired_ns == now and lease.cost == cost
                seen_ids.add(lease.lease_id)
                live[lease.lease_id] = lease
                grants += 1
        elif op < 0.8 and seen_ids:
            lease_id = rng.choice(sorted(seen_ids))
            assert state.release(lease_id, now) == live.pop(lease_id, None)  # None: released or expired
        elif op < 0.9:
            assert [lease.lease_id for lease in state.reclaim(now)] == [lease.lease_id for lease in expired]
        else:
            state.limit = rng.randint(0, 15)
        state.reclaim(now)
        assert state.in_flight == sum(lease.cost for lease in live.values())
        assert len(state) == len(live)
    assert grants > 3000 and denials > 1000 and model_reclaimed > 100  # every branch was exercised
    assert state.reclaimed == model_reclaimed


def test_the_limit_holds_at_every_moment_with_unit_leases() -> None:
    state = ConcurrencyState(3, first_lease_id=0)
    leases = [state.try_acquire(1, 100, now_ns=0) for _ in range(5)]
    assert [lease is not None for lease in leases] == [True, True, True, False, False]
    assert state.in_flight == 3 and len(state) == 3


def test_ids_count_up_from_first_lease_id_and_are_never_reused() -> None:
    state = ConcurrencyState(1, first_lease_id=2**40)
    ids = []
    for t in range(100):
        lease = state.try_acquire(1, 10, now_ns=t * 20)
        assert lease is not None
        ids.append(lease.lease_id)
        if t % 2:
            state.release(lease.lease_id, t * 20 + 1)  # the other half are reclaimed instead
    assert ids == list(range(2**40, 2**40 + 100))
    assert state.try_acquire(2, 10, now_ns=10_000) is None  # a denial consumes no id
    assert state.try_acquire(1, 10, now_ns=10_000).lease_id == 2**40 + 100


def test_a_lease_not_released_is_reclaimed_at_its_expiry() -> None:
    state = ConcurrencyState(2, first_lease_id=1)
    crashed = state.try_acquire(2, ttl_ns=500 * MS, now_ns=0)
    assert state.next_expiry_ns() == 500 * MS
    assert state.try_acquire(1, 500 * MS, 100 * MS) is None
    assert state.reclaim(500 * MS - 1) == []
    assert state.reclaim(500 * MS) == [crashed]
    assert state.in_flight == 0 and state.reclaimed == 1 and state.next_expiry_ns() is None
    assert state.release(crashed.lease_id, 600 * MS) is None  # its client comes back too late
    assert state.try_acquire(2, 500 * MS, 600 * MS) is not None


def test_expired_leases_free_room_without_a_reclaim_timer() -> None:
    state = ConcurrencyState(1, first_lease_id=1)
    first = state.try_acquire(1, ttl_ns=10, now_ns=0)
    second = state.try_acquire(1, ttl_ns=10, now_ns=10)  # the first expired at 10: its room is free
    assert second is not None and first not in state.reclaim(10)
    assert state.reclaimed == 1
    assert state.release(second.lease_id, 20) is None  # released at its expiry: already too late
    assert state.in_flight == 0 and state.reclaimed == 2


def test_release_returns_the_lease_once_and_ignores_unknown_ids() -> None:
    state = ConcurrencyState(5, first_lease_id=1)
    lease = state.try_acquire(3, 1_000, now_ns=0)
    assert lease.lease_id in state
    assert state.release(lease.lease_id, 5) == lease
    assert state.release(lease.lease_id, 6) is None
    assert state.release(12345, 6) is None
    assert state.in_flight == 0 and lease.lease_id not in state


def test_lowering_the_limit_revokes_nothing_and_stops_new_leases_until_below_it() -> None:
    state = ConcurrencyState(4, first_lease_id=1)
    leases = [state.try_acquire(1, 1_000, 0) for _ in range(4)]
    state.limit = 2
    assert len(state) == 4 and state.in_flight == 4
    assert state.try_acquire(1, 1_000, 1) is None
    state.release(leases[0].lease_id, 2)
    state.release(leases[1].lease_id, 2)
    assert state.try_acquire(1, 1_000, 3) is None  # 2 in flight, limit 2
    state.release(leases[2].lease_id, 4)
    assert state.try_acquire(1, 1_000, 5) is not None
    state.limit = 0
    assert state.try_acquire(1, 1_000, 6) is None


def test_released_leases_do_not_pile_up_in_the_expiry_timer() -> None:
    state = ConcurrencyState(1, first_lease_id=1)
    for t in range(10_000):
        lease = state.try_acquire(1, ttl_ns=10**12, now_ns=t)
        state.release(lease.lease_id, t)
    assert len(state._expiries) < 200
    assert state.next_expiry_ns() is None


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: ConcurrencyState(-1, first_lease_id=1), "limit must be an integer >= 0"),
        (lambda: ConcurrencyState(1.5, first_lease_id=1), "limit must be an integer >= 0"),
        (lambda: ConcurrencyState(True, first_lease_id=1), "limit must be an integer >= 0"),
        (lambda: ConcurrencyState(1, first_lease_id=-3), "first_lease_id must be an integer >= 0"),
        (lambda: ConcurrencyState(1, first_lease_id=1).try_acquire(0, 10, 0), "cost must be an integer >= 1"),
        (lambda: ConcurrencyState(1, first_lease_id=1).try_acquire(1, 0, 0), "ttl_ns must be an integer >= 1"),
        (lambda: ConcurrencyState(1, first_lease_id=1).record_service(-1), "service_ns must be an integer >= 0"),
        (lambda: ConcurrencyState(1, first_lease_id=1).expected_wait_ns(-1, 1), "queued_cost_ahead must be"),
        (lambda: setattr(ConcurrencyState(1, first_lease_id=1), "limit", "10"), "limit must be an integer >= 0"),
        (lambda: WaitQueue().push(Waiter("a", 0, 10, 0)), "cost must be an integer >= 1"),
    ],
)
def test_bad_input_is_refused_with_a_clear_message(call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


# -- service time and expected wait ------------------------------------------------------------


def test_mean_service_comes_from_hold_times_until_clients_report_their_own() -> None:
    state = ConcurrencyState(10, first_lease_id=1)
    assert state.mean_service_ns is None
    lease = state.try_acquire(1, 10**9, 0)
    state.release(lease.lease_id, 80 * MS)
    assert state.mean_service_ns == 80 * MS  # the first sample seeds the estimate
    lease = state.try_acquire(1, 10**9, 100 * MS)
    state.release(lease.lease_id, 260 * MS)
    assert state.mean_service_ns == 80 * MS + 80 * MS // 8  # smoothed: 1/8 of the 160 ms sample's surprise
    state.record_service(10 * MS)
    lease = state.try_acquire(1, 10**9, 300 * MS)
    state.release(lease.lease_id, 900 * MS)  # a 600 ms hold: ignored now that clients report
    assert state.mean_service_ns == round(90 * MS + (10 * MS - 90 * MS) / 8)


def test_the_smoothed_service_time_converges_to_a_steady_one() -> None:
    state = ConcurrencyState(1, first_lease_id=1, mean_service_ns=500 * MS)
    for _ in range(100):
        state.record_service(20 * MS)
    assert state.mean_service_ns == pytest.approx(20 * MS, rel=0.01)


def test_expected_wait_is_zero_with_room_and_nobody_ahead() -> None:
    state = ConcurrencyState(3, first_lease_id=1, mean_service_ns=100 * MS)
    state.try_acquire(1, 10**9, 0)
    assert state.expected_wait_ns(0, 2, now_ns=0) == 0
    assert state.expected_wait_ns(1, 1, now_ns=0) == 0  # room for the one ahead and this one
    assert state.expected_wait_ns(0, 3, now_ns=0) == 100 * MS


def test_expected_wait_in_line_behind_a_limit_of_one_quorum_case() -> None:
    """Limit 1, service 100 ms, max_wait 250 ms: the second in line may wait, the fifth may not."""
    state = ConcurrencyState(1, first_lease_id=1, mean_service_ns=100 * MS)
    state.try_acquire(1, 10**9, now_ns=0)
    waits = [state.expected_wait_ns(ahead, 1, now_ns=0) for ahead in range(4)]  # 2nd to 5th in line
    assert waits == [100 * MS, 200 * MS, 300 * MS, 400 * MS]
    assert waits[0] <= 250 * MS < waits[3]
    assert state.expected_wait_ns(0, 1, now_ns=30 * MS) == 70 * MS  # the lease is 30 ms old
    assert state.expected_wait_ns(0, 1, now_ns=150 * MS) == 0  # overdue: expected to end any moment
    assert state.expected_wait_ns(0, 1) == 100 * MS  # default time: the latest passed in (0)


def test_expected_wait_counts_ends_nearest_first_and_expiries_before_means() -> None:
    state = ConcurrencyState(4, first_lease_id=1, mean_service_ns=100 * MS)
    state.try_acquire(2, 10**9, now_ns=0)  # expected end 100 ms
    state.try_acquire(1, 30 * MS, now_ns=20 * MS)  # expires at 50 ms, before its expected end (120 ms)
    state.try_acquire(1, 10**9, now_ns=40 * MS)  # expected end 140 ms
    now = 40 * MS
    assert state.expected_wait_ns(0, 1, now) == 10 * MS  # the short lease's expiry
    assert state.expected_wait_ns(0, 3, now) == 60 * MS  # + the cost-2 lease's end
    assert state.expected_wait_ns(0, 4, now) == 100 * MS  # all of it: the last lease's end
    # 5 in all: the first to take freed room (at 10 ms) frees it again S later, and with the last end that is 2.
    assert state.expected_wait_ns(3, 2, now) == 10 * MS + 100 * MS


def test_expected_wait_after_a_limit_cut_waits_for_the_excess_first() -> None:
    state = ConcurrencyState(3, first_lease_id=1, mean_service_ns=100 * MS)
    for t in (0, 10, 20):
        state.try_acquire(1, 10**9, now_ns=t * MS)
    state.limit = 1
    assert state.expected_wait_ns(0, 1, now_ns=20 * MS) == 100 * MS  # 3 in flight: the third to end makes room


def test_expected_wait_for_a_cost_that_never_fits_or_an_unknown_service_time() -> None:
    state = ConcurrencyState(2, first_lease_id=1)
    state.try_acquire(2, 10**9, 0)
    assert state.expected_wait_ns(0, 3) == NEVER_NS
    assert state.expected_wait_ns(5, 1) == 0  # no estimate yet: the deadline alone decides


def exact_wait(acquired: list[int], limit: int, ahead: int, cost: int, service: int, now: int) -> int:
    """Unit leases held exactly ``service``, ``ahead`` unit requests in line: when ``cost`` units are free."""
    ends = [max(now, t + service) for t in acquired]
    free = limit - len(acquired)
    heapq.heapify(ends)
    t = now
    while True:
        while ahead and free:
            ahead -= 1
            free -= 1
            heapq.heappush(ends, t + service)
        if not ahead and free >= cost:
            return t - now
        t = heapq.heappop(ends)
        free += 1
        while ends and ends[0] == t:
            heapq.heappop(ends)
            free += 1


def test_expected_wait_is_exact_for_unit_costs_and_fixed_service_times() -> None:
    rng = random.Random(11)
    service = 100 * MS
    for _ in range(300):
        limit = rng.randint(1, 12)
        now = 10**9
        acquired = sorted(now - rng.randrange(0, service) for _ in range(rng.randint(0, limit)))
        state = ConcurrencyState(limit, first_lease_id=1, mean_service_ns=service)
        for t in acquired:
            assert state.try_acquire(1, 10**10, t) is not None
        ahead, cost = rng.randint(0, 3 * limit), rng.randint(1, limit)
        expected = exact_wait(acquired, limit, ahead, cost, service, now)
        assert state.expected_wait_ns(ahead, cost, now) == expected, (limit, acquired, ahead, cost)


# -- the wait queue ----------------------------------------------------------------------------


def test_waiters_leave_in_the_order_they_came() -> None:
    queue = WaitQueue()
    assert queue.peek() is None and len(queue) == 0 and queue.next_deadline_ns() is None
    for i in range(5):
        queue.push(Waiter(f"r{i}", i + 1, deadline_ns=1_000 - i, enqueued_ns=i, data={"n": i}))
    assert len(queue) == 5 and queue.queued_cost == 15
    assert [w.ident for w in queue] == ["r0", "r1", "r2", "r3", "r4"]
    assert queue.peek().ident == "r0" and len(queue) == 5
    assert [queue.pop().ident for _ in range(5)] == ["r0", "r1", "r2", "r3", "r4"]
    assert queue.queued_cost == 0
    with pytest.raises(IndexError):
        queue.pop()


def test_expire_takes_the_passed_deadlines_from_anywhere_in_line_in_line_order() -> None:
    queue = WaitQueue()
    deadlines = {"a": 300, "b": 100, "c": 500, "d": 200, "e": 100}
    for i, (ident, deadline) in enumerate(deadlines.items()):
        queue.push(Waiter(ident, 2, deadline_ns=deadline, enqueued_ns=i, ttl_ns=50))
    assert queue.next_deadline_ns() == 100
    assert queue.expire(99) == []
    assert [w.ident for w in queue.expire(200)] == ["b", "d", "e"]  # line order, not deadline order
    assert [w.ident for w in queue] == ["a", "c"] and queue.queued_cost == 4
    assert queue.next_deadline_ns() == 300
    assert [w.ident for w in queue.expire(10**9)] == ["a", "c"]
    assert len(queue) == 0 and queue.next_deadline_ns() is None


def test_a_request_waits_once_and_a_removed_one_may_come_back_with_a_new_deadline() -> None:
    queue = WaitQueue()
    queue.push(Waiter(("client", 7), 1, deadline_ns=100, enqueued_ns=0))
    assert ("client", 7) in queue
    with pytest.raises(ValueError, match="already waiting"):
        queue.push(Waiter(("client", 7), 1, deadline_ns=900, enqueued_ns=5))
    queue.push(Waiter("other", 1, deadline_ns=150, enqueued_ns=1))
    removed = queue.remove(("client", 7))
    assert removed.deadline_ns == 100 and queue.remove(("client", 7)) is None
    queue.push(Waiter(("client", 7), 1, deadline_ns=900, enqueued_ns=5))
    assert queue.next_deadline_ns() == 150  # the old deadline of 100 no longer counts
    assert [w.ident for w in queue.expire(200)] == ["other"]
    assert [w.ident for w in queue] == [("client", 7)] and queue.queued_cost == 1


def test_the_queue_matches_a_list_model_under_random_operations() -> None:
    rng = random.Random(3)
    queue = WaitQueue()
    model: list[Waiter] = []
    now, next_ident = 0, 0
    for _ in range(20_000):
        now += rng.randrange(0, 5)
        op = rng.random()
        if op < 0.45:
            waiter = Waiter(next_ident, rng.randint(1, 5), deadline_ns=now + rng.randint(0, 200), enqueued_ns=now)
            next_ident += 1
            queue.push(waiter)
            model.append(waiter)
        elif op < 0.65 and model:
            assert queue.pop() is model.pop(0)
        elif op < 0.8 and model:
            victim = rng.choice(model)
            model.remove(victim)
            assert queue.remove(victim.ident) is victim
        else:
            expected = [w for w in model if w.deadline_ns <= now]
            model = [w for w in model if w.deadline_ns > now]
            assert queue.expire(now) == expected
        assert list(queue) == model
        assert queue.peek() is (model[0] if model else None)
        assert queue.queued_cost == sum(w.cost for w in model)
        assert queue.next_deadline_ns() == min((w.deadline_ns for w in model), default=None)
    assert len(queue._deadlines) <= 2 * len(queue) + 64 + 1
