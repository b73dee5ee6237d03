"""Our partition server over UDP: the C tools, closed and open loops, the generator's ceiling and floor, memory."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

from context import BATCH, BENCH, BUILD, CONNS, HOST, KEYS, Context
from procs import Measured, Proc, cpu_pct, free_port, rss_kb, run_bounded, running

from sluicegate import codec

UDPLOAD = BUILD / "udpload"
UDPECHO = BUILD / "udpecho"

# --------------------------------------------------------------------------- wire protocol (stats)


def partition_stats(port: int) -> dict[str, int]:
    """STATS op over UDP: the server's own counters (to verify it really decided)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(1.0)
        for _attempt in range(5):
            request_id = int.from_bytes(os.urandom(8), "big")
            s.sendto(codec.encode_stats_request(request_id), (HOST, port))
            try:
                reply = s.recv(4096)
            except TimeoutError:
                continue
            rid, counters = codec.decode_stats_reply(reply)
            if rid == request_id:
                return counters
    raise RuntimeError(f"no STATS reply from 127.0.0.1:{port}")


def one_check(port: int, key: bytes) -> None:
    """A single CHECK (used to let the server's reply cache expire)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(2.0)
        s.sendto(codec.encode_check_request(int.from_bytes(os.urandom(8), "big"), [(key, 1)]), (HOST, port))
        try:
            s.recv(4096)
        except TimeoutError:
            pass


# --------------------------------------------------------------------------- the C tools


def build() -> None:
    """Compile the load generator and the reflector into bench/build/."""
    BUILD.mkdir(exist_ok=True)
    for tool in (UDPLOAD, UDPECHO):
        cmd = ["gcc", "-O2", "-Wall", "-o", str(tool), str(BENCH / f"{tool.name}.c")]
        subprocess.run(cmd, check=True)


def udpload(ctx: Context, port: int, *flags: str, limit: float | None = None, **options: object) -> dict:
    """Run udpload; ``options`` become ``--name value`` (``timeout_ms``: ``--timeout-ms``)."""
    args = [str(token) for name, value in options.items() for token in (f"--{name.replace('_', '-')}", value)]
    cmd = ctx.load_cmd([str(UDPLOAD), "--host", HOST, "--port", str(port), *flags, *args])
    rc, out, cpu, wall = run_bounded(cmd, limit or ctx.load_limit)
    for line in out.splitlines():
        if line.startswith("{"):
            result = json.loads(line)
            result["gen_cpu_pct"] = cpu_pct(cpu, wall)
            return result
    raise RuntimeError(f"udpload failed (rc {rc}): {out[-2000:]}")


def closed_loop(ctx: Context, port: int, server_pid: int, batch: int, duration: float, warmup: float) -> dict:
    """CONNS closed-loop clients, ``batch`` checks per datagram, with the server's CPU measured meanwhile."""
    with Measured(server_pid) as m:
        r = udpload(ctx, port, mode="closed", conns=CONNS, batch=batch, keys=KEYS, duration=duration, warmup=warmup)
    return m.fill(r)


def open_loop(ctx: Context, port: int, server_pid: int, rate: float) -> dict:
    """Scenario (4)'s paced loop at ``rate`` datagrams/s, 1 check each, with the server's CPU measured meanwhile."""
    with Measured(server_pid) as m:
        r = udpload(
            ctx, port, mode="open", rate=round(rate), conns=CONNS, batch=1, keys=KEYS, duration=ctx.dur, warmup=1
        )
    return m.fill(r)


@contextmanager
def partition(ctx: Context, name: str) -> Iterator[tuple[Proc, int]]:
    """One partition server (``python -m sluicegate.server``) on a free UDP port, with its own database."""
    port = free_port(socket.SOCK_DGRAM)
    db = ctx.tmp / f"{name}.db"
    cmd = ctx.server_cmd([ctx.python, "-m", "sluicegate.server", "--listen", f"{HOST}:{port}", "--db", str(db)])
    with running(name, cmd, ready="listening on udp", timeout=30, env=ctx.env, cwd=str(ctx.tmp)) as proc:
        yield proc, port


@contextmanager
def reflector(ctx: Context) -> Iterator[tuple[Proc, int]]:
    """The C reflector (``udpecho``), which answers every CHECK and does no work, on a free UDP port."""
    port = free_port(socket.SOCK_DGRAM)
    with running("udpecho", ctx.server_cmd([str(UDPECHO), str(port)]), ready="ready", timeout=10) as proc:
        yield proc, port


# --------------------------------------------------------------------------- scenarios


def scenarios(ctx: Context) -> None:
    """(1) and (2): closed loops at 1 and BATCH checks per datagram; (4): the open loop; then its floor."""
    with partition(ctx, "partition") as (server, port):
        t0 = time.monotonic()
        warm = udpload(ctx, port, mode="fill", keys=KEYS, batch=64, conns=8, timeout_ms=2000, duration=60)
        stats = partition_stats(port)
        ctx.log(
            f"warm-up: sent each of the {KEYS:,} keys once ({warm['items']:,} checks, "
            f"{time.monotonic() - t0:.1f}s); server holds {stats['keys']:,} keys, "
            f"rule_loads {stats['rule_loads']:,}"
        )
        for label, batch in (("single", 1), ("batched", BATCH)):
            before = partition_stats(port)
            r = closed_loop(ctx, port, server.pid, batch, ctx.dur, warmup=1)
            after = partition_stats(port)
            r["server_checks"] = after["checks"] - before["checks"]
            r["server_malformed"] = after["malformed"] - before["malformed"]
            r["server_denied"] = after["denied"] - before["denied"]
            ctx.results[f"udp_{label}"] = r
            ctx.log(
                f"ours UDP {batch:>2} check/dgram: {r['decisions_per_s']:>10,.0f} decisions/s "
                f"({r['dgrams_per_s']:,.0f} dgrams/s), p50 {r['lat_p50_us']:.0f} us, p99 {r['lat_p99_us']:.0f} us, "
                f"lost {r['lost']}, server CPU {r['server_cpu_pct']:.0f}%, generator CPU {r['gen_cpu_pct']:.0f}%; "
                f"server counted {r['server_checks']:,} checks, malformed {r['server_malformed']}"
            )
        # 4. open loop at half of the peak of (1)
        rate = 0.5 * ctx.results["udp_single"]["dgrams_per_s"]
        r = open_loop(ctx, port, server.pid, rate)
        ctx.results["udp_open"] = r
        ctx.log(
            f"ours UDP open loop at {rate:,.0f}/s (50% of peak): p50 {r['lat_p50_us']:.0f} us, "
            f"p99 {r['lat_p99_us']:.0f} us, p99.9 {r['lat_p999_us']:.0f} us (from scheduled send; "
            f"from actual send p99 {r['lat_send_p99_us']:.0f} us), lost {r['lost']}, "
            f"server CPU {r['server_cpu_pct']:.0f}%"
        )
        ctx.results["udp_final_stats"] = partition_stats(port)
    latency_floor(ctx, rate)


def latency_floor(ctx: Context, rate: float) -> None:
    """The open loop of (4), same rate and duration, against the C reflector: what the machine adds."""
    with reflector(ctx) as (echo, port):
        r = open_loop(ctx, port, echo.pid, rate)
        ctx.results["echo_open"] = r
        ctx.log(
            f"latency floor (same open loop vs C reflector at {rate:,.0f}/s): p50 {r['lat_p50_us']:.0f} us, "
            f"p99 {r['lat_p99_us']:.0f} us, p99.9 {r['lat_p999_us']:.0f} us"
        )


def echo_ceiling(ctx: Context) -> None:
    """6. The generator's own ceiling, against a C reflector doing no work."""
    with reflector(ctx) as (echo, port):
        for label, batch in (("single", 1), ("batched", BATCH)):
            r = closed_loop(ctx, port, echo.pid, batch, ctx.ceiling_dur, warmup=0.5)
            ctx.results[f"echo_{label}"] = r
            ctx.log(
                f"generator ceiling vs C reflector, {batch:>2} check/dgram: {r['dgrams_per_s']:,.0f} dgrams/s "
                f"= {r['decisions_per_s']:,.0f} checks/s, p50 {r['lat_p50_us']:.0f} us, "
                f"generator CPU {r['gen_cpu_pct']:.0f}%, reflector CPU {r['server_cpu_pct']:.0f}%"
            )


def memory(ctx: Context) -> None:
    """5. RSS of one partition holding mem_keys distinct keys."""
    with partition(ctx, "partition-mem") as (server, port):
        time.sleep(0.3)
        start = rss_kb(server.pid)
        t0 = time.monotonic()
        r = udpload(
            ctx,
            port,
            "--uuid",
            mode="fill",
            keys=ctx.mem_keys,
            batch=64,
            conns=8,
            timeout_ms=5000,
            duration=120,
            limit=150,
        )
        fill_s = time.monotonic() - t0
        stats = partition_stats(port)
        full = rss_kb(server.pid)
        # The reply cache keeps the last ~2-4 s of replies (about 1.1 KB per
        # 64-check datagram); let two cache generations rotate out, then look again.
        for _ in range(2):
            time.sleep(2.2)
            one_check(port, b"rotate-reply-cache")
        settled = rss_kb(server.pid)
        ctx.results["memory"] = {
            "keys": stats["keys"],
            "lost": r["lost"],
            "fill_s": fill_s,
            "rss_start_kb": start["VmRSS"],
            "rss_full_kb": full["VmRSS"],
            "rss_settled_kb": settled["VmRSS"],
            "hwm_kb": settled["VmHWM"],
        }
        ctx.log(
            f"memory: {stats['keys']:,} keys (36-char UUID-shaped) loaded in {fill_s:.1f}s; RSS at start "
            f"{start['VmRSS'] / 1024:.0f} MB, right after loading {full['VmRSS'] / 1024:.0f} MB, after the "
            f"reply cache expired {settled['VmRSS'] / 1024:.0f} MB (peak {settled['VmHWM'] / 1024:.0f} MB)"
        )
