#!/usr/bin/env python3
"""Per-request overhead of ``sluicegate proxy`` (``make bench-proxy``; about a minute).

``.venv/bin/python bench/proxy_overhead.py [--seconds 5] [--connections 50]``

An nginx worker answering ``return 200 "ok"`` is the upstream. wrk drives it
directly, then through the proxy in three policies: ``pass`` (forwarded
without a check: the HTTP relay alone), ``check`` (a rate check per request
through one partition of ``sluicegate local``, on a rule with room for every
request) and ``acquire`` (a concurrency lease per request, released when the
response ends). Each target gets two wrk runs of ``--seconds``: one
connection (latency: p50/p99, and the difference to direct per request) and
``--connections`` connections (throughput: req/s, and the proxy's CPU per
request). Servers are pinned to CPU 0 and wrk to CPU 1 as in ``make bench``.
Every process is started here, on 127.0.0.1, and stopped by its PID; every
load run is bounded in time. It prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from contextlib import nullcontext

from context import HOST, Context
from procs import Measured, free_port, run_bounded, running, stop_all, wait_tcp

BIG = 10**9
RULES = f"""rules:
  - {{key: "bench:check", capacity: {BIG}, rate: {BIG}}}
  - {{key: "bench:acquire", capacity: {BIG}, rate: {BIG}, limits: [{{name: inflight, concurrency: 10000}}]}}
"""
POLICIES = {
    "pass": "classes:\n  - {match: {path: '/*'}, mode: pass}\n",
    "check": "default: {key: 'bench:check'}\n",
    "acquire": "default: {key: 'bench:acquire', mode: acquire}\n",
}
NGINX_CONF = """daemon off;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    keepalive_requests 1000000;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    server {{
        listen {host}:{port};
        location / {{ return 200 "ok"; }}
    }}
}}
"""
_UNITS = {"us": 1.0, "ms": 1000.0, "s": 1_000_000.0}


def _micros(text: str) -> float:
    """A wrk latency (``812.00us``, ``1.20ms``, ``2.00s``) in microseconds."""
    for unit in ("us", "ms", "s"):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * _UNITS[unit]
    raise ValueError(f"unexpected wrk latency {text!r}")


def wrk(ctx: Context, port: int, connections: int, seconds: float, server_pid: int | None) -> dict:
    """``wrk -t1 -c<connections>`` on ``GET /``: req/s, p50/p99 in µs, non-2xx, and the server tree's CPU."""
    cmd = ctx.load_cmd(["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "--latency", f"http://{HOST}:{port}/"])
    with Measured(server_pid) if server_pid else nullcontext() as measured:
        rc, out, _, _ = run_bounded(cmd, seconds * 3 + 30)
    result: dict = {"non2xx": 0}
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("Requests/sec:"):
            result["rps"] = float(line.split()[1])
        elif line.startswith("50%"):
            result["p50"] = _micros(line.split()[1])
        elif line.startswith("99%"):
            result["p99"] = _micros(line.split()[1])
        elif line.startswith("Non-2xx"):
            result["non2xx"] = int(line.split()[-1])
        elif "requests in" in line:
            result["requests"] = int(line.split()[0])
    if rc != 0 or "rps" not in result:
        raise RuntimeError(f"wrk failed (rc {rc}): {out[-2000:]}")
    if measured and result.get("requests"):
        result["cpu_us_per_request"] = measured.cpu * 1e6 / result["requests"]
    return result


def measure(ctx: Context, name: str, port: int, args: argparse.Namespace, pid: int | None) -> dict:
    one = wrk(ctx, port, 1, args.seconds, pid)
    many = wrk(ctx, port, args.connections, args.seconds, pid)
    row = {"name": name, "p50": one["p50"], "p99": one["p99"], "rps1": one["rps"], "rps": many["rps"]}
    row["non2xx"] = one["non2xx"] + many["non2xx"]
    row["cpu"] = many.get("cpu_us_per_request")
    ctx.log(
        f"{name:>16}: 1 connection p50 {row['p50']:7.0f} µs, p99 {row['p99']:7.0f} µs, {row['rps1']:8,.0f} req/s; "
        f"{args.connections} connections {row['rps']:8,.0f} req/s"
        + (f", server CPU {row['cpu']:.0f} µs/request" if row["cpu"] else "")
        + (f"  ({row['non2xx']} non-2xx!)" if row["non2xx"] else "")
    )
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="each wrk run (default %(default)g)")
    parser.add_argument("--connections", type=int, default=50, help="the throughput run's (default %(default)d)")
    args = parser.parse_args()
    if not (shutil.which("nginx") and shutil.which("wrk")):
        print("bench-proxy needs nginx and wrk: make bench-deps", file=sys.stderr)
        return 2
    ctx = Context(quick=True, python=sys.executable)
    env = {**ctx.env, "SLUICEGATE_DEFAULT_CAPACITY": str(BIG), "SLUICEGATE_DEFAULT_RATE": str(BIG)}
    rows = []
    try:
        ndir = ctx.tmp / "nginx"
        ndir.mkdir()
        nginx_port = free_port()
        (ndir / "nginx.conf").write_text(NGINX_CONF.format(dir=ndir, host=HOST, port=nginx_port))
        nginx_cmd = ["nginx", "-p", str(ndir), "-e", str(ndir / "error.log"), "-c", str(ndir / "nginx.conf")]
        rules = ctx.tmp / "rules.yaml"
        rules.write_text(RULES)
        local_cmd = [ctx.python, "-m", "sluicegate.cli", "local", "--partitions", "1", "--port", "0"]
        local_cmd += ["--db", str(ctx.tmp / "quota.db"), "--rules", str(rules)]
        with (
            running("nginx", ctx.server_cmd(nginx_cmd)) as nginx,
            running("local", ctx.server_cmd(local_cmd), ready="sluicegate local:", timeout=30, env=env) as local,
        ):
            wait_tcp(nginx_port, 10)
            line = local.wait_for("sluicegate local:", 30)
            partitions = line.split("(udp ", 1)[1].split(")", 1)[0].replace(" ", "")
            rows.append(measure(ctx, "direct (nginx)", nginx_port, args, nginx.pid))
            for mode, policy_text in POLICIES.items():
                policy = ctx.tmp / f"{mode}.yaml"
                policy.write_text(policy_text)
                port = free_port()
                proxy_cmd = [ctx.python, "-m", "sluicegate.cli", "proxy", "--upstream", f"http://{HOST}:{nginx_port}"]
                proxy_cmd += ["--listen", f"{HOST}:{port}", "--policy", str(policy), "--partitions", partitions]
                with running(f"proxy {mode}", ctx.server_cmd(proxy_cmd), ready="sluicegate proxy:", env=env) as proxy:
                    rows.append(measure(ctx, f"proxy, {mode}", port, args, proxy.pid))
    finally:
        stop_all()
        shutil.rmtree(ctx.tmp, ignore_errors=True)
    direct = rows[0]
    print(
        "\n| target | p50 (1 conn) | p99 (1 conn) | added p50 per request | req/s (1 conn) "
        f"| req/s ({args.connections} conns) | proxy CPU per request |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        added = "" if row is direct else f"{row['p50'] - direct['p50']:+.0f} µs"
        cpu = f"{row['cpu']:.0f} µs" if row["cpu"] and row is not direct else ""
        print(
            f"| {row['name']} | {row['p50']:.0f} µs | {row['p99']:.0f} µs | {added} | {row['rps1']:,.0f} "
            f"| {row['rps']:,.0f} | {cpu} |"
        )
    if any(row["non2xx"] for row in rows):
        print("\nsome answers were not 2xx: the figures above are not comparable", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
