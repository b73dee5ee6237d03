"""The baselines measured in the same run: Redis with the Lua token bucket, nginx, and wrk (which also drives ours)."""

from __future__ import annotations

import shutil
import subprocess

from context import BATCH, BENCH, CAPACITY, CONNS, HOST, KEYS, RATE, Context
from procs import Measured, cpu_pct, free_port, run_bounded, running, wait_tcp

# --------------------------------------------------------------------------- Redis


def redis(ctx: Context) -> None:
    """(1) and (2) for Redis: ``token_bucket.lua`` by EVALSHA, unpipelined and pipelined BATCH deep."""
    if not (shutil.which("redis-server") and shutil.which("redis-benchmark") and shutil.which("redis-cli")):
        ctx.skip("Redis baseline skipped: redis-server / redis-benchmark / redis-cli not installed")
        return
    port = free_port()
    rdir = ctx.tmp / "redis"
    rdir.mkdir()
    cmd = ctx.server_cmd(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            HOST,
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--dir",
            str(rdir),
            "--protected-mode",
            "yes",
        ]
    )
    with running("redis-server", cmd, ready="Ready to accept connections", timeout=15) as server:
        script = (BENCH / "token_bucket.lua").read_text()
        sha = subprocess.run(
            ["redis-cli", "-h", HOST, "-p", str(port), "SCRIPT", "LOAD", script],
            check=True,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        command = ["EVALSHA", sha, "1", "bucket:__rand_int__", str(CAPACITY), str(RATE), "1"]
        for label, pipeline, calib_n in (("single", 1, 20_000), ("batched", BATCH, 100_000)):
            # redis-benchmark has no duration flag: a short calibration run
            # (which also creates the keys) sets -n for ~dur seconds.
            calib = redis_benchmark(ctx, port, command, pipeline, calib_n, server.pid)
            n = max(10_000, int(calib["rps"] * ctx.dur))
            r = redis_benchmark(ctx, port, command, pipeline, n, server.pid)
            ctx.results[f"redis_{label}"] = r
            ctx.log(
                f"Redis EVALSHA token bucket, -c {CONNS} -P {pipeline}: {r['rps']:>10,.0f} decisions/s in "
                f"{r['wall_s']:.1f}s, p50 {r['p50_ms'] * 1000:.0f} us, p99 {r['p99_ms'] * 1000:.0f} us, "
                f"redis-server CPU {r['server_cpu_pct']:.0f}%, redis-benchmark CPU {r['gen_cpu_pct']:.0f}%"
            )


def redis_benchmark(ctx: Context, port: int, command: list[str], pipeline: int, n: int, server_pid: int) -> dict:
    """One ``redis-benchmark`` run of ``n`` commands, its CSV summary parsed, the server's CPU measured meanwhile."""
    cmd = ctx.load_cmd(
        [
            "redis-benchmark",
            "-h",
            HOST,
            "-p",
            str(port),
            "-c",
            str(CONNS),
            "-n",
            str(n),
            "-r",
            str(KEYS),
            "-P",
            str(pipeline),
            "--csv",
            *command,
        ]
    )
    with Measured(server_pid) as m:
        rc, out, cpu, wall = run_bounded(cmd, ctx.load_limit)
    rows = [line for line in out.splitlines() if line.startswith('"EVALSHA')]
    if rc != 0 or not rows:
        raise RuntimeError(f"redis-benchmark failed (rc {rc}): {out[-2000:]}")
    cells = [c.strip('"') for c in rows[-1].split('","')]
    return {
        "rps": float(cells[1]),
        "avg_ms": float(cells[2]),
        "p50_ms": float(cells[4]),
        "p99_ms": float(cells[6]),
        "n": n,
        "wall_s": wall,
        "gen_cpu_pct": cpu_pct(cpu, wall),
    } | m.fill({})


# --------------------------------------------------------------------------- HTTP: wrk and nginx


def wrk(ctx: Context, port: int, server_pid: int) -> dict:
    """``wrk -t1 -c50`` for ctx.dur seconds, ``GET /v1/check/k<random key>``, the server's CPU measured meanwhile."""
    script = ctx.tmp / "check.lua"
    script.write_text(
        "math.randomseed(os.time())\n"
        "request = function()\n"
        f'  return wrk.format("GET", "/v1/check/k" .. math.random(1, {KEYS}))\n'
        "end\n"
    )
    cmd = ctx.load_cmd(
        [
            "wrk",
            "-t1",
            f"-c{CONNS}",
            f"-d{ctx.dur:.0f}s",
            "--latency",
            "-s",
            str(script),
            f"http://{HOST}:{port}/",
        ]
    )
    with Measured(server_pid) as m:
        rc, out, cpu, wall = run_bounded(cmd, ctx.load_limit)
    result: dict = m.fill({"gen_cpu_pct": cpu_pct(cpu, wall), "raw": out})
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("Requests/sec:"):
            result["rps"] = float(line.split()[1])
        elif line.startswith("50%"):
            result["p50"] = line.split()[1]
        elif line.startswith("99%"):
            result["p99"] = line.split()[1]
        elif line.startswith("Non-2xx"):
            result["non2xx"] = int(line.split()[-1])
        elif line.startswith("Socket errors"):
            result["socket_errors"] = line
    if rc != 0 or "rps" not in result:
        raise RuntimeError(f"wrk failed (rc {rc}): {out[-2000:]}")
    return result


def nginx(ctx: Context) -> None:
    """(3) for nginx: one worker answering ``return 200``, driven by the same wrk as our HTTP front."""
    if not (shutil.which("nginx") and shutil.which("wrk")):
        ctx.skip("nginx baseline skipped: nginx or wrk not installed")
        return
    port = free_port()
    ndir = ctx.tmp / "nginx"
    ndir.mkdir()
    conf = ndir / "nginx.conf"
    conf.write_text(f"""daemon off;
worker_processes 1;
pid {ndir}/nginx.pid;
error_log {ndir}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {ndir}/body;
    proxy_temp_path {ndir}/proxy;
    fastcgi_temp_path {ndir}/fastcgi;
    uwsgi_temp_path {ndir}/uwsgi;
    scgi_temp_path {ndir}/scgi;
    server {{
        listen {HOST}:{port};
        location / {{ return 200 "ok"; }}
    }}
}}
""")
    cmd = ctx.server_cmd(["nginx", "-p", str(ndir), "-e", str(ndir / "error.log"), "-c", str(conf)])
    with running("nginx", cmd) as server:
        wait_tcp(port, 10)
        r = wrk(ctx, port, server.pid)
        ctx.results["nginx"] = r
        ctx.log(
            f"nginx return 200 (1 worker): {r['rps']:>10,.0f} req/s, p50 {r.get('p50')}, p99 {r.get('p99')}, "
            f"nginx CPU {r['server_cpu_pct']:.0f}%, wrk CPU {r['gen_cpu_pct']:.0f}%"
        )
