"""The results: the summary tables and notes printed at the end of a run and written to bench/results.md."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
import time
from pathlib import Path

import sdk_paths
from context import BATCH, BENCH, CAPACITY, CONNS, KEYS, RATE, Context

RESULTS = BENCH / "results.md"


def machine_info(ctx: Context) -> dict[str, str]:
    """What the figures were measured on: date, CPU, kernel, versions, pinning, mode, background activity."""
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass

    def version(cmd: list[str]) -> str:
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
            return (out.stdout or out.stderr).strip().splitlines()[0]
        except (OSError, IndexError, subprocess.SubprocessError):
            return "n/a"

    py = version(
        [
            ctx.python,
            "-c",
            "import sys, importlib.util as u; print(sys.version.split()[0], "
            "'uvloop' if u.find_spec('uvloop') else 'no uvloop')",
        ]
    )
    return {
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": str(os.cpu_count()),
        "cpu": model,
        "kernel": platform.release(),
        "server python": py,
        "redis": version(["redis-server", "--version"]),
        "nginx": version(["nginx", "-v"]),
        "wrk": version(["wrk", "-v"]),
        "pinning": "servers on CPU 0, load generators on CPU 1 (taskset)" if ctx.pin else "none",
        "mode": "quick (smoke run: short durations)" if ctx.quick else "full",
        "activity before the bench": f"{ctx.background:.0f}% of one core (user+system, 1 s sample)",
    }


def report(ctx: Context, started: float) -> str:
    """results.md: the scenario table, the CPU table, the server's counters and notes (``started``: monotonic)."""
    R = ctx.results
    rows: list[tuple[str, str, str, str, str, str]] = []

    def ratio(a: float | None, b: float | None) -> str:
        return f"{a / b:.2f}x" if a and b else "n/a"

    def get(name: str, field: str) -> float | None:
        value = R.get(name)
        return value.get(field) if isinstance(value, dict) else None  # type: ignore[union-attr]

    s1, r1 = get("udp_single", "decisions_per_s"), get("redis_single", "rps")
    rows.append(
        (
            "1. UDP, 1 check/datagram, 50 clients: decisions/s",
            _n(s1),
            _n(r1) + " (Redis EVALSHA)",
            ratio(s1, r1),
            "info",
            "-",
        )
    )
    p50, rp50 = get("udp_single", "lat_p50_us"), get("redis_single", "p50_ms")
    p99, rp99 = get("udp_single", "lat_p99_us"), get("redis_single", "p99_ms")
    rows.append(
        (
            "1. latency p50 / p99 (closed loop, at peak)",
            f"{_us(p50)} / {_us(p99)}",
            f"{_us(rp50 and rp50 * 1000)} / {_us(rp99 and rp99 * 1000)}",
            "-",
            "info",
            "-",
        )
    )
    s2, r2 = get("udp_batched", "decisions_per_s"), get("redis_batched", "rps")
    rows.append(
        (
            f"2. UDP, {BATCH} checks/datagram: decisions/s",
            _n(s2),
            _n(r2) + f" (Redis -P {BATCH})",
            ratio(s2, r2),
            "info",
            "-",
        )
    )
    f3, n3 = get("front", "rps"), get("nginx", "rps")
    ok3 = (f3 / n3 >= 0.25) if f3 and n3 else None
    rows.append(
        (
            "3. HTTP GET /v1/check/{key}, wrk -t1 -c50: req/s",
            _n(f3),
            _n(n3) + " (nginx return 200)",
            ratio(f3, n3),
            ">= 0.25x nginx",
            _pf(ok3),
        )
    )
    o = R.get("udp_open") or {}
    floor = R.get("echo_open") or {}
    ok4 = (o["lat_p99_us"] <= 500) if o else None
    rows.append(
        (
            f"4. open loop at 50% of peak ({_n(o.get('target_rate'))}/s): p50 / p99 / p99.9",
            f"{_us(o.get('lat_p50_us'))} / {_us(o.get('lat_p99_us'))} / {_us(o.get('lat_p999_us'))}",
            f"{_us(floor.get('lat_p50_us'))} / {_us(floor.get('lat_p99_us'))} / "
            f"{_us(floor.get('lat_p999_us'))} (C reflector: floor)",
            "-",
            "p99 <= 500 us",
            _pf(ok4),
        )
    )
    mem = R.get("memory") or {}
    if mem:
        settled = mem["rss_settled_kb"] / 1024
        full = mem["rss_full_kb"] / 1024
        ok5 = max(settled, full) <= 300 if mem["keys"] >= 1_000_000 else None
        rows.append(
            (
                f"5. RSS of one partition with {mem['keys']:,} keys",
                f"{full:.0f} MB (after cache expiry {settled:.0f} MB)",
                f"{mem['rss_start_kb'] / 1024:.0f} MB at start",
                "-",
                "<= 300 MB",
                _pf(ok5) if mem["keys"] >= 1_000_000 else "n/a (quick: fewer keys)",
            )
        )

    cpu_rows = []
    for name, label, gen in (
        ("udp_single", "1. ours, UDP 1/dgram", "udpload"),
        ("redis_single", "1. Redis -P 1", "redis-benchmark"),
        ("udp_batched", f"2. ours, UDP {BATCH}/dgram", "udpload"),
        ("redis_batched", f"2. Redis -P {BATCH}", "redis-benchmark"),
        ("front", "3. sluicegate local (3 processes)", "wrk"),
        ("nginx", "3. nginx (1 worker)", "wrk"),
        ("udp_open", "4. ours, open loop", "udpload"),
        ("echo_open", "4. C reflector, same open loop (floor)", "udpload"),
        ("echo_single", "6. C reflector, 1/dgram", "udpload"),
        ("echo_batched", f"6. C reflector, {BATCH}/dgram", "udpload"),
    ):
        v = R.get(name)
        if isinstance(v, dict):
            rate = v.get("dgrams_per_s") or v.get("rps")
            cpu_rows.append(
                (
                    label,
                    _n(rate),
                    f"{v['server_cpu_pct']:.0f}%",
                    f"{gen} {v['gen_cpu_pct']:.0f}%",
                    f"{v.get('core0_pct', 0):.0f}% / {v.get('core1_pct', 0):.0f}%",
                    f"{v.get('other_pct', 0):.0f}%",
                )
            )

    machine = machine_info(ctx)
    lines = ["# Sluicegate benchmark results", ""]
    lines += [f"- **{k}**: {v}" for k, v in machine.items()]
    lines += [
        f"- **rule**: every key capacity {CAPACITY}, rate {RATE}/s (for us via SLUICEGATE_DEFAULT_*, for Redis as "
        "EVALSHA arguments); random keys among 100,000, so in practice every check is allowed",
        "- **keys**: `bucket:` + 12 digits for UDP (same shape as redis-benchmark's `__rand_int__`), "
        "`k<1..100000>` for HTTP, 36-char UUID-shaped strings for the memory figure",
        "- **warm-up**: before timing, each of the 100,000 keys is sent once so its rule is loaded from SQLite "
        "(UDP: 64 checks per datagram; HTTP: POST /v1/check batches of 100); "
        "each UDP run also drops its first second",
        "",
        "| scenario | ours | baseline | ratio | target | result |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    lines += [
        "",
        "Pass/fail is information only; the bench never fails on a timing.",
        "",
        "## CPU (share of one core over each run) and the load generator",
        "",
        "Server CPU and generator CPU are user+system time of the processes (server: the whole process tree) "
        "as % of one core. Core busy is from /proc/stat and also counts the kernel's softirq work for loopback "
        "traffic, which is charged to the core, not to a process; CPU 0 runs the server, CPU 1 the load generator, "
        "so anything on a core beyond those two processes is the kernel or other activity on the machine. "
        "Other processes is the user+system time of everything else that ran meanwhile (from /proc/stat): "
        "if it is high, the machine was shared and the figures of that run are noisy.",
        "",
        "| run | rate (dgrams or requests/s) | server CPU | load generator CPU | core busy CPU 0 / CPU 1 "
        "| other processes |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in cpu_rows]
    es, s = R.get("echo_single"), R.get("udp_single")
    eb, b = R.get("echo_batched"), R.get("udp_batched")
    if isinstance(es, dict) and isinstance(s, dict):
        lines += [
            "",
            f"The load generator is not the bottleneck: against a C reflector that does no work, the same "
            f"generator with the same settings reaches {_n(es['dgrams_per_s'])} datagrams/s at 1 check/datagram "
            f"({es['dgrams_per_s'] / max(s['dgrams_per_s'], 1):.1f}x the partition server's "
            f"{_n(s['dgrams_per_s'])})"
            + (
                f" and {_n(eb['dgrams_per_s'])} datagrams/s at {BATCH} checks/datagram "
                f"({eb['dgrams_per_s'] / max(b['dgrams_per_s'], 1):.1f}x the server's {_n(b['dgrams_per_s'])})"
                if isinstance(eb, dict) and isinstance(b, dict)
                else ""
            )
            + "; it runs on its own core and, while driving the partition server at 1 check/datagram, the "
            f"generator process used {s['gen_cpu_pct']:.0f}% of its core (core busy {s.get('core1_pct', 0):.0f}%) "
            f"whereas the server used {s['server_cpu_pct']:.0f}% of its core (core busy "
            f"{s.get('core0_pct', 0):.0f}%).",
        ]
    fin = R.get("udp_final_stats")
    if isinstance(fin, dict):
        lines += [
            "",
            f"Partition server counters after the UDP runs: checks {fin['checks']:,}, allowed {fin['allowed']:,}, "
            f"denied {fin['denied']:,}, malformed {fin['malformed']}, duplicates {fin['duplicates']}, keys "
            f"{fin['keys']:,}, rule_loads {fin['rule_loads']:,}.",
        ]
    lines += [
        "",
        f"Total bench time {time.monotonic() - started:.0f} s.",
        "",
        "Notes:",
        "",
        "- Latency of our UDP runs is measured by the generator per datagram (CLOCK_MONOTONIC); in the open loop "
        "from the *scheduled* send time (no coordinated omission). Redis latency is redis-benchmark's own.",
        "- The latency floor row runs the identical open loop against a C reflector that does no work: "
        "it is what this machine's loopback, scheduler and the generator add on their own.",
        '- nginx runs with `worker_processes 1` (one core, like the pinned front) and `return 200 "ok"`; '
        "`sluicegate local` runs its front and its 2 partitions all on CPU 0.",
        f"- Redis runs `bench/token_bucket.lua` by EVALSHA, `redis-benchmark -c {CONNS} -r {KEYS}`; "
        "-n is set from a short calibration run (which also creates the keys) "
        "so a run lasts about as long as ours.",
    ]
    lines += [f"- {note}" for note in ctx.notes]
    lines += saturation_notes(ctx)
    lines += sdk_paths.report_lines(ctx)
    return "\n".join(lines) + "\n"


def saturation_notes(ctx: Context) -> list[str]:
    """Say where a load generator's core was saturated: that figure is then a lower bound."""
    R = ctx.results
    notes = []
    for name, what, gen in (
        ("udp_single", "our UDP server (1 check/datagram)", "udpload"),
        ("udp_batched", f"our UDP server ({BATCH} checks/datagram)", "udpload"),
        ("redis_single", "Redis (-P 1)", "redis-benchmark"),
        ("redis_batched", f"Redis (-P {BATCH})", "redis-benchmark"),
        ("front", "sluicegate local", "wrk"),
        ("nginx", "nginx", "wrk"),
    ):
        v = R.get(name)
        if not isinstance(v, dict) or not ctx.pin:
            continue
        gen_core, server_core = v.get("core1_pct", 0.0), v.get("core0_pct", 0.0)
        if gen_core >= 95:
            notes.append(
                f"- {gen} kept its core {gen_core:.0f}% busy while driving {what} "
                f"(server core {server_core:.0f}%): "
                f"that figure is limited by the load generator, so it is a lower bound of what {what} can do"
                + ("; the front/nginx ratio is then an upper bound." if name == "nginx" else ".")
            )
        elif server_core < 90:
            notes.append(
                f"- Neither core was saturated while driving {what} (server core {server_core:.0f}%, "
                f"{gen} core {gen_core:.0f}%): with {CONNS} closed-loop clients the run is bound by round-trip "
                "latency (server and generator alternate in bursts), not by either side's CPU."
            )
    o = R.get("udp_open")
    if isinstance(o, dict):
        notes.append(
            f"- Open loop (4): measured from the actual send instead of the scheduled one, p50 "
            f"{_us(o['lat_send_p50_us'])}, p99 {_us(o['lat_send_p99_us'])}, p99.9 {_us(o['lat_send_p999_us'])}; "
            f"the scheduled-time figures are higher when a server stall leaves all {CONNS} sockets waiting "
            f"(the generator fell behind its schedule by at most {o['backlog_max']:,} requests)."
        )
    return notes


def _n(value: float | None) -> str:
    return f"{value:,.0f}" if value else "n/a"


def _us(value: float | None) -> str:
    if not value:
        return "n/a"
    return f"{value / 1000:.2f} ms" if value >= 1000 else f"{value:.0f} us"


def _pf(ok: bool | None) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "FAIL")


def write(ctx: Context, started: float) -> None:
    """Print the report and write it to bench/results.md."""
    text = report(ctx, started)
    RESULTS.write_text(text)
    print()
    print(text)
    print(f"written: {RESULTS}")
