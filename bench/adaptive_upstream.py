#!/usr/bin/env python3
"""Algorithm 1 against a real upstream app behind `sluicegate proxy`: the trace of L and the fixed limits.

``.venv/bin/python bench/adaptive_upstream.py [--seconds 12] [--fixed 15,20,25,30,35,40,50,60]``
(``make bench-adaptive-upstream``; about a minute; processes on 127.0.0.1 only, stopped by PID)

The real-process counterpart of ``bench/adaptive_limit.py`` (a simulation):

* the upstream, ``tests/functional/knee_upstream.py``: 100 ms a request up to
  30 in service at once, then 100 ms x (n / 30)^2, +-10 % jitter; its
  throughput peaks at the knee (30), so does a closed population's response time;
* ``sluicegate local`` (2 partitions) with a key ``knee:<L>`` per fixed limit
  and ``knee:adaptive`` (``{"adaptive": {"min": 15, "kp": 15, "step": 5,
  "samples": 100}}``, the paper's settings), and ``sluicegate proxy`` in front
  of the app: ``mode: acquire`` with ``max_wait_ms``, so requests over the
  limit wait in the partition's FIFO and each release reports its waiting and
  service times;
* a closed population: 100 clients, each on its own keep-alive connection,
  thinking (exponential, mean 100 ms) then sending ``GET /work`` with
  ``X-Limit: <L>|adaptive`` and waiting for the answer. Algorithm 1 balances
  p95 waiting against p95 service, about L = clients / (2 + think / service)
  = 33 here: the population is matched to put that balance at the knee.

L is read from every answer (``RateLimit-Policy: "inflight";q=L``: the limit in
force when the request was admitted). It prints each fixed limit's mean and p95
response time (first second dropped), then the adaptive run's trace: per window
of 0.5 s, the limits seen in the answers completed in it, their number and mean
response time. The test ``tests/functional/test_adaptive_upstream.py`` runs the
same stack with a shorter sweep and asserts where L settles. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # for the test suite's process helpers and an uninstalled sluicegate

from sluicegate.adaptive import percentile95  # noqa: E402
from tests.conftest import child_env, read_until, stop  # noqa: E402
from tests.functional.proxy_stack import Service, request, start_local, start_proxy  # noqa: E402

APP = ROOT / "tests" / "functional" / "knee_upstream.py"
BASE_MS, KNEE = 100.0, 30
CLIENTS, THINK_MS = 100, 100.0
ADAPTIVE = "adaptive"
SETTINGS = {"min": 15, "kp": 15, "step": 5, "samples": 100}  # the paper's L_min, K_p, u, N
MAX_WAIT_MS = 20_000  # far above any wait here: requests over the limit queue, none is refused
_QUOTA = re.compile(rb";q=(\d+)")
_LENGTH = re.compile(rb"\r\ncontent-length:\s*(\d+)", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Answer:
    """One request of the population: sent and answered (s from the run's start), status, L at admission."""

    sent_s: float
    done_s: float
    status: int
    limit: int

    @property
    def response_ms(self) -> float:
        return (self.done_s - self.sent_s) * 1000


@dataclass(frozen=True, slots=True)
class Window:
    """Answers completed in ``[start_s, start_s + width)``: the limits they saw, their number, mean ms."""

    start_s: float
    limits: tuple[int, ...]
    done: int
    mean_ms: float


def rules_yaml(fixed: Sequence[int]) -> str:
    """A key ``knee:<L>`` per fixed limit and ``knee:adaptive``; rates far above what is sent."""
    big = 10**6
    lines = ["rules:"]
    for limit in fixed:
        lines.append(f'  - {{key: "knee:{limit}", capacity: {big}, rate: {big}, ')
        lines.append(f"     limits: [{{name: inflight, concurrency: {limit}}}]}}")
    lines.append(f'  - {{key: "knee:{ADAPTIVE}", capacity: {big}, rate: {big}, ')
    lines.append(f"     limits: [{{name: inflight, adaptive: {json.dumps(SETTINGS)}}}]}}")
    return "\n".join(lines) + "\n"


POLICY = f"""
classes:
  - match: {{path: /work, headers: {{x-limit: "*"}}}}
    key: "knee:{{header:x-limit}}"
    mode: acquire
    max_wait_ms: {MAX_WAIT_MS}
"""


class Stack:
    """The knee app, `sluicegate local` with the rules for ``fixed`` limits, and `sluicegate proxy` in front.

    Example::

        with Stack(Path(tmp), fixed=[15, 30]) as stack:
            answers = asyncio.run(population(stack.proxy.port, "30", seconds=3))
    """

    def __init__(self, tmp: Path, *, fixed: Sequence[int], base_ms: float = BASE_MS, knee: int = KNEE) -> None:
        self.services: list[Service] = []
        try:
            self.upstream = self._started(start_upstream(base_ms=base_ms, knee=knee))
            local, partitions = start_local(tmp, rules_yaml(fixed))
            self._started(local)
            upstream_url = f"http://127.0.0.1:{self.upstream.port}"
            self.proxy = self._started(start_proxy(tmp, upstream_url, POLICY, partitions))
        except BaseException:
            self.close()
            raise

    def _started(self, service: Service) -> Service:
        self.services.append(service)
        return service

    def most_in_service(self) -> int:
        """The most requests the app served at once since the previous call."""
        return json.loads(request(self.upstream.port, "GET", "/stats?reset=1")[2])["most_in_service"]

    def close(self) -> None:
        for service in reversed(self.services):
            service.stop()
        self.services.clear()

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_upstream(*, base_ms: float, knee: int) -> Service:
    command = [sys.executable, str(APP), "--base-ms", str(base_ms), "--knee", str(knee)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env())
    try:
        match, output = read_until(process, r"knee upstream listening on 127\.0\.0\.1:(\d+)")
    except BaseException:
        stop(process)
        raise
    return Service(process, int(match.group(1)), output)


async def population(
    port: int,
    limit: str,
    *,
    seconds: float,
    clients: int = CLIENTS,
    think_ms: float = THINK_MS,
    seed: int = 1,
    drain_s: float = 20.0,
) -> list[Answer]:
    """``clients`` closed-loop clients sending ``X-Limit: limit`` for ``seconds``; every answer, by completion.

    No request is sent after ``seconds``; those in flight then are awaited (at most ``drain_s``), so
    the next run starts on an idle app.
    """
    loop = asyncio.get_running_loop()
    start = loop.time()
    end = start + seconds
    message = f"GET /work HTTP/1.1\r\nHost: knee\r\nX-Limit: {limit}\r\n\r\n".encode()
    answers: list[Answer] = []

    async def client(index: int) -> None:
        rng = random.Random(seed * 100_003 + index)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while True:
                pause = rng.expovariate(1000 / think_ms)
                if loop.time() + pause >= end:
                    return
                await asyncio.sleep(pause)
                sent = loop.time()
                writer.write(message)
                head = await reader.readuntil(b"\r\n\r\n")
                length = _LENGTH.search(head)
                await reader.readexactly(int(length.group(1)) if length else 0)
                quota = _QUOTA.search(head)
                status = int(head[9:12])
                answers.append(Answer(sent - start, loop.time() - start, status, int(quota.group(1)) if quota else 0))
        finally:
            writer.close()

    await asyncio.wait_for(asyncio.gather(*(client(i) for i in range(clients))), seconds + drain_s)
    answers.sort(key=lambda answer: answer.done_s)
    return answers


def run(port: int, limit: str, *, seconds: float, **knobs: float) -> list[Answer]:
    """:func:`population` from synchronous code (a test, the script)."""
    return asyncio.run(population(port, limit, seconds=seconds, **knobs))


def between(answers: Sequence[Answer], start_s: float, end_s: float = float("inf")) -> list[Answer]:
    """The answers completed in ``[start_s, end_s)``."""
    return [answer for answer in answers if start_s <= answer.done_s < end_s]


def mean_ms(answers: Sequence[Answer]) -> float:
    return sum(answer.response_ms for answer in answers) / len(answers)


def p95_ms(answers: Sequence[Answer]) -> float:
    return percentile95([round(answer.response_ms * 1000) for answer in answers]) / 1000


def windows(answers: Sequence[Answer], width_s: float = 0.5) -> list[Window]:
    """The trace of L: per ``width_s`` window of completion time, the limits seen, count and mean ms."""
    rows: dict[int, list[Answer]] = {}
    for answer in answers:
        rows.setdefault(int(answer.done_s // width_s), []).append(answer)
    return [
        Window(slot * width_s, tuple(sorted({a.limit for a in done})), len(done), mean_ms(done))
        for slot, done in sorted(rows.items())
    ]


def changes(answers: Sequence[Answer]) -> list[tuple[float, int]]:
    """``(done_s, L)`` of the first answer carrying each value of L, in order: when each step was first seen.

    Answers complete out of order around a step, so a value seen again later is not listed twice
    (:func:`windows` shows everything seen in each window).
    """
    first: dict[int, float] = {}
    for answer in answers:
        first.setdefault(answer.limit, answer.done_s)
    return [(at, limit) for limit, at in first.items()]


def trace_table(answers: Sequence[Answer], width_s: float = 0.5) -> str:
    """:func:`changes` and :func:`windows` as a compact table (what a failing test prints)."""
    steps = " -> ".join(f"{limit} ({at:.2f} s)" for at, limit in changes(answers))
    lines = [f"L first seen: {steps}", f"{'t s':>6} {'L seen':>12} {'done':>5} {'mean ms':>8}"]
    for row in windows(answers, width_s):
        seen = ",".join(str(limit) for limit in row.limits)
        lines.append(f"{row.start_s:>6.1f} {seen:>12} {row.done:>5} {row.mean_ms:>8.0f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=12.0, help="length of the adaptive run")
    parser.add_argument("--fixed", default="15,20,25,30,35,40,50,60", help="fixed limits to sweep ('' for none)")
    parser.add_argument("--fixed-seconds", type=float, default=3.0, help="length of each fixed run")
    parser.add_argument("--warm-up", type=float, default=1.0, help="seconds dropped from each fixed run")
    args = parser.parse_args()
    fixed = [int(part) for part in args.fixed.split(",") if part.strip()]
    print(
        f"upstream: {BASE_MS:g} ms to {KNEE} in service, then x (n/{KNEE})^2, +-10%; "
        f"{CLIENTS} clients, think {THINK_MS:g} ms (exponential), acquire with max_wait_ms {MAX_WAIT_MS}"
    )
    with tempfile.TemporaryDirectory() as tmp, Stack(Path(tmp), fixed=fixed) as stack:
        port = stack.proxy.port
        if fixed:
            print(f"\nfixed limits ({args.fixed_seconds:g} s each, first {args.warm_up:g} s dropped)")
            print(f"{'L':>4} {'req/s':>6} {'mean ms':>8} {'p95 ms':>7} {'most in service':>16}")
            figures = {}
            for limit in fixed:
                stack.most_in_service()
                answers = run(port, str(limit), seconds=args.fixed_seconds)
                measured = between(answers, args.warm_up, args.fixed_seconds)
                figures[limit] = mean_ms(measured)
                rate = len(measured) / (args.fixed_seconds - args.warm_up)
                print(
                    f"{limit:>4} {rate:>6.0f} {figures[limit]:>8.0f} {p95_ms(measured):>7.0f} "
                    f"{stack.most_in_service():>16}"
                )
            best = min(figures, key=figures.__getitem__)
            print(f"optimum: L = {best}")
        answers = run(port, ADAPTIVE, seconds=args.seconds)
    print(f"\nadaptive {json.dumps(SETTINGS)}, {args.seconds:g} s: L in the answers completed in each 0.5 s")
    print(trace_table(answers))
    last = between(answers, args.seconds / 2)
    print(
        f"\nsecond half: L seen {sorted({a.limit for a in last})}, mean {mean_ms(last):.0f} ms, "
        f"p95 {p95_ms(last):.0f} ms, {len(last) / (answers[-1].done_s - args.seconds / 2):.0f} req/s; "
        f"statuses {sorted({a.status for a in answers})}"
    )


if __name__ == "__main__":
    main()
