"""(7) The Python SDK's paths end to end: direct UDP (sync and async, one caller and many) and HTTP.

The SDK runs in its own process (``bench/sdkload.py``, pinned to CPU 1) against
``sluicegate local --partitions 2`` (pinned to CPU 0), so a figure is what one
Python application process gets from the SDK, its own overhead included.
"""

from __future__ import annotations

import json
import re

from context import BENCH, HOST, Context
from front import local_command
from procs import Measured, cpu_pct, free_port, run_bounded, running
from udp import partition_stats

SDK_KEYS = 20_000
CONCURRENCY = 32
# (result name, sdkload mode, label in the table)
RUNS = (
    ("sdk_direct_sync", "direct-sync", "direct UDP, sync, 1 thread"),
    ("sdk_direct_threads", "direct-threads", f"direct UDP, sync, {CONCURRENCY} threads (coalesced)"),
    ("sdk_direct_async", "direct-async", "direct UDP, async, 1 coroutine"),
    ("sdk_direct_async_many", "direct-async-many", f"direct UDP, async, {CONCURRENCY} coroutines (coalesced)"),
    ("sdk_http_sync", "http-sync", "HTTP Client, 1 thread (kept-alive)"),
    ("sdk_http_async", "http-async", f"HTTP AsyncClient, {CONCURRENCY} coroutines"),
)


def scenarios(ctx: Context) -> None:
    """Each SDK path for ctx.dur / 2 seconds against one ``sluicegate local`` (warmed with every key once)."""
    base = local_command(ctx)
    if base is None:
        ctx.skip("SDK paths skipped: sluicegate.cli not importable")
        return
    port = free_port()
    db = ctx.tmp / "sdk.db"
    cmd = ctx.server_cmd([*base, "local", "--host", HOST, "--port", str(port), "--partitions", "2", "--db", str(db)])
    with running("sluicegate local (SDK)", cmd, ready="http://", timeout=60, env=ctx.env, cwd=str(ctx.tmp)) as local:
        line = local.wait_for("http://", 1)
        partitions = re.findall(r"(\d+\.\d+\.\d+\.\d+:\d+)", line.split("udp", 1)[1])
        common = ["--http", f"http://{HOST}:{port}", "--partitions", ",".join(partitions), "--keys", str(SDK_KEYS)]
        warm(ctx, common)
        ports = [int(address.rsplit(":", 1)[1]) for address in partitions]
        for name, mode, label in RUNS:
            before = [partition_stats(p) for p in ports]
            r = sdkload(ctx, mode, common, local.pid)
            after = [partition_stats(p) for p in ports]
            checks = sum(a["checks"] - b["checks"] for a, b in zip(after, before, strict=True))
            # Each STATS request is a datagram too: leave out the one per partition that read `after`.
            datagrams = sum(a["datagrams"] - b["datagrams"] - 1 for a, b in zip(after, before, strict=True))
            r["checks_per_datagram"] = checks / datagrams if datagrams > 0 else None
            r["label"] = label
            ctx.results[name] = r
            per_dgram = r["checks_per_datagram"]
            packing = f"{per_dgram:.1f} checks/datagram at the partitions" if per_dgram else "no datagrams counted"
            ctx.log(
                f"SDK {label}: {r['rate']:>8,.0f} checks/s, p50 {r['p50_us']:.0f} us, p99 {r['p99_us']:.0f} us, "
                f"fallbacks {r['fallbacks']}, denied {r['denied']}, {packing}, "
                f"client CPU {r['gen_cpu_pct']:.0f}%, server CPU (all processes) {r['server_cpu_pct']:.0f}%"
            )


def warm(ctx: Context, common: list[str]) -> None:
    """Every key once, so no measured check waits for a rule load."""
    code = (
        "import sys; from sluicegate_sdk import DirectClient; "
        "parts=[(h, int(p)) for h, p in (a.rsplit(':', 1) for a in sys.argv[1].split(','))]; "
        "c=DirectClient(parts, timeout=2.0); "
        f"[c.check_many([f'k{{i}}' for i in range(s, min(s + 500, {SDK_KEYS}))]) for s in range(0, {SDK_KEYS}, 500)]"
    )
    rc, out, _, wall = run_bounded(ctx.load_cmd([ctx.python, "-c", code, common[3]]), 120)
    if rc != 0:
        raise RuntimeError(f"SDK warm-up failed (rc {rc}): {out[-2000:]}")
    ctx.log(f"SDK warm-up: {SDK_KEYS:,} keys via DirectClient.check_many in {wall:.1f}s")


def sdkload(ctx: Context, mode: str, common: list[str], server_pid: int) -> dict:
    duration = ctx.dur / 2
    cmd = [ctx.python, str(BENCH / "sdkload.py"), mode, *common]
    cmd += ["--duration", str(duration), "--warmup", "1", "--concurrency", str(CONCURRENCY)]
    with Measured(server_pid) as m:
        rc, out, cpu, wall = run_bounded(ctx.load_cmd(cmd), ctx.load_limit)
    for line in out.splitlines():
        if line.startswith("{"):
            return m.fill(json.loads(line) | {"gen_cpu_pct": cpu_pct(cpu, wall)})
    raise RuntimeError(f"sdkload {mode} failed (rc {rc}): {out[-2000:]}")


def report_lines(ctx: Context) -> list[str]:
    """The SDK section of results.md, with the Redis baseline of the same run for scale."""
    rows = [(name, label) for name, _, label in RUNS if isinstance(ctx.results.get(name), dict)]
    if not rows:
        return []
    redis = ctx.results.get("redis_single")
    redis_rps = redis.get("rps") if isinstance(redis, dict) else None
    lines = [
        "",
        "## The Python SDK end to end (7)",
        "",
        f"`bench/sdkload.py` (the SDK in one Python process on CPU 1) against `sluicegate local --partitions 2` "
        f"(CPU 0), closed loop, random keys among {SDK_KEYS:,} (each sent once before timing), "
        f"{ctx.dur / 2:g} s per run after 1 s of warm-up. Latency is per check as the application sees it. "
        "Redis baseline of the same run: "
        + (
            f"{redis_rps:,.0f} decisions/s (Lua token bucket by EVALSHA, redis-benchmark -c 50, a C client)."
            if redis_rps
            else "not measured in this run."
        ),
        "",
        "| SDK path | checks/s | p50 | p99 | checks per datagram | vs Redis | SDK process CPU | server CPU "
        "| other processes |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    notes = []
    for name, label in rows:
        r = ctx.results[name]
        per = r.get("checks_per_datagram")
        cells = [
            label,
            f"{r['rate']:,.0f}",
            _us(r["p50_us"]),
            _us(r["p99_us"]),
            f"{per:.1f}" if per else "-",
            f"{r['rate'] / redis_rps:.2f}x" if redis_rps else "n/a",
            f"{r['gen_cpu_pct']:.0f}%",
            f"{r['server_cpu_pct']:.0f}%",
            f"{r.get('other_pct', 0):.0f}%",
        ]
        lines.append("| " + " | ".join(cells) + " |")
        if r.get("fallbacks") or r.get("denied"):
            notes.append(f"- {label}: {r['fallbacks']} fallbacks, {r['denied']} denied (expected 0 and 0).")
    lines += [
        "",
        "Checks per datagram are counted by the partitions (STATS): for the HTTP paths they show the router's "
        "coalescing, for the direct paths the SDK's. Server CPU is the whole `sluicegate local` process tree; "
        "other processes is everything else on the machine meanwhile (high: a shared machine, noisy figures).",
        *notes,
    ]
    return lines


def _us(value: float) -> str:
    return f"{value / 1000:.2f} ms" if value >= 1000 else f"{value:.0f} us"
