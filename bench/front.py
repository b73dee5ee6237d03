"""Our HTTP front end to end (``sluicegate local``): warm-up over POST, then the same wrk run as nginx gets."""

from __future__ import annotations

import http.client
import json
import queue
import shutil
import subprocess
import threading
import time
from pathlib import Path

from baselines import wrk
from context import HOST, KEYS, Context
from procs import free_port, running


def local_command(ctx: Context) -> list[str] | None:
    """How to run the ``sluicegate`` command with ctx.python: the module if importable, else the installed script."""
    probe = subprocess.run([ctx.python, "-c", "import sluicegate.cli"], env=ctx.env, capture_output=True, timeout=30)
    if probe.returncode == 0:
        return [ctx.python, "-m", "sluicegate.cli"]
    script = Path(ctx.python).parent / "sluicegate"
    return [str(script)] if script.exists() else None


def http_front(ctx: Context) -> None:
    """(3) for us: ``sluicegate local`` (front + 2 partitions), warmed up, then driven by wrk."""
    if not shutil.which("wrk"):
        return
    base = local_command(ctx)
    if base is None:
        ctx.skip("HTTP front skipped: sluicegate.cli not importable")
        return
    port = free_port()
    db = ctx.tmp / "b.db"
    cmd = ctx.server_cmd([*base, "local", "--host", HOST, "--port", str(port), "--partitions", "2", "--db", str(db)])
    with running("sluicegate local", cmd, ready="http://", timeout=60, env=ctx.env, cwd=str(ctx.tmp)) as front:
        warm_s, warm_errors = warm_http(port)
        ctx.log(
            f"HTTP warm-up: {KEYS:,} keys via POST /v1/check batches of 100 in {warm_s:.1f}s ({warm_errors} errors)"
        )
        r = wrk(ctx, port, front.pid)
        ctx.results["front"] = r
        ctx.log(
            f"sluicegate local (front + 2 partitions): {r['rps']:>10,.0f} req/s, p50 {r.get('p50')}, "
            f"p99 {r.get('p99')}, non-2xx {r.get('non2xx', 0)}, server CPU (all processes) "
            f"{r['server_cpu_pct']:.0f}%, wrk CPU {r['gen_cpu_pct']:.0f}%"
        )


def warm_http(port: int) -> tuple[float, int]:
    """Send each of the 100,000 keys once (POST batches) so rules are loaded before timing."""
    t0 = time.monotonic()
    deadline = t0 + 60
    batches: queue.Queue[list[int]] = queue.Queue()
    for start in range(1, KEYS + 1, 100):
        batches.put(list(range(start, min(start + 100, KEYS + 1))))
    errors = [0]

    def worker() -> None:
        conn = http.client.HTTPConnection(HOST, port, timeout=10)
        try:
            while time.monotonic() < deadline:
                try:
                    keys = batches.get_nowait()
                except queue.Empty:
                    return
                body = json.dumps({"checks": [{"key": f"k{k}", "cost": 1} for k in keys]})
                try:
                    conn.request("POST", "/v1/check", body, {"Content-Type": "application/json"})
                    resp = conn.getresponse()
                    resp.read()
                    if resp.status != 200:
                        errors[0] += 1
                except (OSError, http.client.HTTPException):
                    errors[0] += 1
                    conn.close()
                    conn = http.client.HTTPConnection(HOST, port, timeout=10)
        finally:
            conn.close()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.monotonic() - t0, errors[0]
