"""An adaptive concurrency limit: OpenStack's Algorithm 1. Pure: time is an argument.

The limit L is steered by the completed requests' waiting time (in the
admission queue) against their service time. From each batch of N
completions it takes the 95th percentiles S_w (waiting) and S_r (service)::

    error = (S_w - S_r) / (S_w + S_r)                 # in [-1, 1]
    dL    = floor(|error| * K_p) - (floor(|error| * K_p) mod u)
    L     = L + dL            if error >= 0
            max(L - dL, L_min) otherwise

and then holds (ignores completions) for 2 * min(S_w, S_r), so that the next
batch sees the new limit. Requests queueing longer than they are served means
the backend has room for more at once; served longer than queued means it is
past its knee. With K_p = 15 and u = 5, L moves only when one percentile is at
least twice the other (|error| >= 1/3), in steps of 5 to 15: a dead band that
keeps it still near the balance S_w ~ S_r.

The 95th percentile of a batch is its nearest-rank one: the ceil(0.95 N)-th
smallest (the 95th of 100).

Example:
    >>> limit = AdaptiveLimit(samples=4)
    >>> [limit.record(wait_ns=300, service_ns=100, now_ns=t) for t in range(4)]  # error 0.5: +5
    [False, False, False, True]
    >>> limit.limit, limit.trace
    (20, [(3, 20)])
    >>> limit.record(0, 100, now_ns=202)  # within the hold of 2 * min(300, 100) after the step
    False
"""

from __future__ import annotations

import math


def percentile95(values: list[int]) -> int:
    """The nearest-rank 95th percentile of ``values`` (not empty).

    Example:
        >>> percentile95(list(range(1, 101)))
        95
    """
    ordered = sorted(values)
    return ordered[(95 * len(ordered) + 99) // 100 - 1]  # integer ceil: no float rounding at the rank


def _whole(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


class AdaptiveLimit:
    """A concurrency limit L tuned by Algorithm 1 from completed requests' waiting and service times.

    ``minimum`` is L_min, ``kp`` K_p, ``step`` u and ``samples`` N; L starts at
    ``initial`` (L_min by default) and never leaves ``[minimum, maximum]``.
    ``trace`` lists ``(now_ns, L)`` at every change.

    Example:
        >>> limit = AdaptiveLimit(minimum=15, samples=100, initial=50)
        >>> for i in range(100):  # served 400 ms, queued 10 ms: past the knee, back off
        ...     changed = limit.record(10_000_000, 400_000_000, now_ns=i)
        >>> changed, limit.limit  # error -0.95: dL = 14 - 4
        (True, 40)
    """

    __slots__ = (
        "_hold_until_ns",
        "_services",
        "_waits",
        "kp",
        "limit",
        "maximum",
        "minimum",
        "samples",
        "step",
        "trace",
    )

    def __init__(
        self,
        *,
        minimum: int = 15,
        kp: float = 15.0,
        step: int = 5,
        samples: int = 100,
        maximum: int = 100_000,
        initial: int | None = None,
    ) -> None:
        self.minimum = _whole("minimum", minimum, 1)
        self.step = _whole("step", step, 1)
        self.samples = _whole("samples", samples, 1)
        self.maximum = _whole("maximum", maximum, minimum)
        if isinstance(kp, bool) or not isinstance(kp, (int, float)) or not (math.isfinite(kp) and kp > 0):
            raise ValueError(f"kp must be a finite number > 0, got {kp!r}")
        self.kp = float(kp)
        start = minimum if initial is None else _whole("initial", initial, minimum)
        if start > maximum:
            raise ValueError(f"initial must be at most maximum ({maximum}), got {start}")
        self.limit = start
        self.trace: list[tuple[int, int]] = []
        self._waits: list[int] = []
        self._services: list[int] = []
        self._hold_until_ns: int | None = None

    def __repr__(self) -> str:
        return f"AdaptiveLimit(limit={self.limit}, batch={len(self._waits)}/{self.samples})"

    def record(self, wait_ns: int, service_ns: int, now_ns: int) -> bool:
        """Count one completed request (ignored during a hold); True when this completion changed L."""
        if wait_ns < 0 or service_ns < 0:
            raise ValueError(f"waiting and service times must be >= 0, got {wait_ns} and {service_ns}")
        if self._hold_until_ns is not None:
            if now_ns < self._hold_until_ns:
                return False
            self._hold_until_ns = None
        self._waits.append(wait_ns)
        self._services.append(service_ns)
        if len(self._waits) < self.samples:
            return False
        waiting, service = percentile95(self._waits), percentile95(self._services)
        self._waits.clear()
        self._services.clear()
        self._hold_until_ns = now_ns + 2 * min(waiting, service)
        if waiting + service == 0:
            return False
        error = (waiting - service) / (waiting + service)
        scaled = math.floor(abs(error) * self.kp)
        delta = scaled - scaled % self.step
        new = self.limit + delta if error >= 0 else max(self.limit - delta, self.minimum)
        new = min(new, self.maximum)
        if new == self.limit:
            return False
        self.limit = new
        self.trace.append((now_ns, new))
        return True
