#!/usr/bin/env python3
"""Sluicegate benchmark: ours against Redis and nginx, measured in the same run.

``python3 bench/run.py [--quick] [--python PATH]`` (``make bench``). Standard
library only. It measures and prints; it asserts nothing about timings and
exits 0 unless something crashed. Results go to stdout and bench/results.md.

Scenarios (all traffic to 127.0.0.1, every load loop bounded in time):

1. partition server over UDP, 1 check per datagram, 50 closed-loop clients,
   random keys among 100,000  vs  Redis + Lua token bucket (EVALSHA) driven by
   ``redis-benchmark -c 50 -r 100000``;
2. the same with 16 checks per datagram  vs  Redis pipelined 16 deep (-P 16);
3. HTTP front end to end (``sluicegate local``)  vs  nginx ``return 200``,
   both driven by ``wrk -t1 -c50`` with random keys;
4. decision latency at half of the peak of (1), open loop (paced);
5. resident memory of one partition holding 1,000,000 keys;
6. CPU% of every server and load generator, and the ceiling of our UDP load
   generator against a trivial C reflector.

Every process started here is stopped by its PID in a ``finally``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import http.client
import json
import os
import platform
import queue
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
BUILD = BENCH / "build"
HOST = "127.0.0.1"
KEYS = 100_000
CONNS = 50
BATCH = 16
# The rule every key gets, for us and for Redis alike: realistic, and with
# 100,000 keys at these rates every check is allowed (a denial costs the same).
CAPACITY, RATE = 100, 10
CLK_TCK = os.sysconf("SC_CLK_TCK")

# --------------------------------------------------------------------------- processes

_started: list[Proc] = []


class Proc:
    """A child process whose output is drained by a thread (lines kept)."""

    def __init__(self, name: str, cmd: list[str], *, env: dict[str, str] | None = None, cwd: str | None = None):
        self.name = name
        self.cmd = cmd
        self.lines: list[str] = []
        self._seen = threading.Condition()
        self.popen = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            text=True,
            errors="replace",
        )
        self.pid = self.popen.pid
        _started.append(self)
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            with self._seen:
                self.lines.append(line.rstrip("\n"))
                self._seen.notify_all()
        with self._seen:
            self._seen.notify_all()

    def wait_for(self, needle: str, timeout: float) -> str:
        """Return the first output line containing ``needle``; raise if the process dies or times out."""
        deadline = time.monotonic() + timeout
        with self._seen:
            while True:
                for line in self.lines:
                    if needle in line:
                        return line
                if self.popen.poll() is not None:
                    raise RuntimeError(f"{self.name} exited ({self.popen.returncode}): " + " | ".join(self.lines[-10:]))
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"{self.name} not ready after {timeout}s: " + " | ".join(self.lines[-10:]))
                self._seen.wait(min(left, 0.2))

    def stop(self) -> None:
        """SIGTERM by PID (SIGKILL after 10 s); then the same for any of its children left behind."""
        children = descendants(self.pid)
        if self.popen.poll() is None:
            try:
                os.kill(self.pid, signal.SIGTERM)
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.popen.wait(timeout=10)
            except ProcessLookupError:
                pass
        for pid, start in children:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                if _start_time(pid) != start:  # gone (or the PID was reused by someone else)
                    break
                os.kill(pid, sig)
                for _ in range(50):
                    if _start_time(pid) != start:
                        break
                    time.sleep(0.1)
        if self in _started:
            _started.remove(self)


def _start_time(pid: int) -> int | None:
    """Start time of a living process (to tell a PID's process from a later one); None if gone or a zombie."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = data[data.rindex(")") + 2 :].split()
    return None if fields[0] == "Z" else int(fields[19])


def descendants(root: int) -> list[tuple[int, int]]:
    """``(pid, start time)`` of the living descendants of ``root``."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                data = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = data[data.rindex(")") + 2 :].split()
            parents[int(entry)] = (int(fields[1]), int(fields[19]))
    found, todo = [], [root]
    while todo:
        parent = todo.pop()
        for pid, (ppid, start) in parents.items():
            if ppid == parent:
                found.append((pid, start))
                todo.append(pid)
    return found


def stop_all() -> None:
    for proc in reversed(list(_started)):
        try:
            proc.stop()
        except Exception as exc:  # keep stopping the others
            print(f"warning: could not stop {proc.name} (pid {proc.pid}): {exc}", file=sys.stderr)


def run_bounded(cmd: list[str], limit_s: float) -> tuple[int, str, float, float]:
    """Run a load generator to completion (killed by PID after ``limit_s``).

    Returns ``(exit code, stdout+stderr, its CPU seconds (user+sys, from
    wait4), wall seconds)``.
    """
    with tempfile.TemporaryFile(mode="w+") as out:
        start = time.monotonic()
        popen = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = start + limit_s
        killed = False
        while True:
            pid, status, usage = os.wait4(popen.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline and not killed:
                os.kill(popen.pid, signal.SIGKILL)
                killed = True
            time.sleep(0.02)
        wall = time.monotonic() - start
        popen.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read()
    if killed:
        text += f"\n[killed after {limit_s:.0f}s]"
    return popen.returncode, text, usage.ru_utime + usage.ru_stime, wall


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    """A port free for both TCP and UDP on 127.0.0.1 (best effort)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, kind) as s:
            s.bind((HOST, 0))
            port = s.getsockname()[1]
        other = socket.SOCK_DGRAM if kind == socket.SOCK_STREAM else socket.SOCK_STREAM
        try:
            with socket.socket(socket.AF_INET, other) as s:
                s.bind((HOST, port))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port")


def wait_tcp(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((HOST, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listening on {HOST}:{port} after {timeout}s")


# --------------------------------------------------------------------------- CPU accounting


def _proc_stat(pid: int) -> tuple[int, float] | None:
    """``(ppid, cpu seconds)`` of one process from /proc/<pid>/stat (all its threads)."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = data[data.rindex(")") + 2 :].split()
    # fields[0] is state (field 3); ppid is field 4, utime 14, stime 15.
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / CLK_TCK


def tree_cpu(root: int) -> float:
    """CPU seconds of ``root`` and all its living descendants."""
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _proc_stat(int(entry))
            if st:
                stats[int(entry)] = st
    total, todo, seen = 0.0, [root], set()
    while todo:
        pid = todo.pop()
        if pid in seen or pid not in stats:
            continue
        seen.add(pid)
        total += stats[pid][1]
        todo.extend(p for p, (ppid, _) in stats.items() if ppid == pid)
    return total


def rss_kb(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            out[name] = int(value.split()[0])
    return out


def machine_user_sys() -> float:
    """CPU seconds of user+nice+system time of all processes on the machine (from /proc/stat)."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("cpu "):
            v = [int(x) for x in line.split()[1:4]]
            return sum(v) / CLK_TCK
    return 0.0


def core_ticks() -> dict[str, tuple[int, int]]:
    """``{"cpu0": (busy, total), ...}`` jiffies from /proc/stat (busy includes irq and softirq)."""
    out = {}
    for line in Path("/proc/stat").read_text().splitlines():
        name, *values = line.split()
        if name.startswith("cpu") and name != "cpu":
            v = [int(x) for x in values[:8]]
            idle = v[3] + v[4]
            out[name] = (sum(v) - idle, sum(v))
    return out


class Measured:
    """Server CPU (process tree) and per-core busy share over the run of one load generator.

    A process's utime+stime leaves out the kernel's softirq work for loopback
    traffic, which is charged to the core, not to the process; with the server
    pinned to CPU 0 and the generator to CPU 1, ``core_pct`` shows how busy
    each core really was.
    """

    def __init__(self, server_pid: int):
        self.server_pid = server_pid

    def __enter__(self) -> Measured:
        self.cpu0 = tree_cpu(self.server_pid)
        self.cores0 = core_ticks()
        self.machine0 = machine_user_sys()
        self.t0 = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.monotonic() - self.t0
        self.cpu = tree_cpu(self.server_pid) - self.cpu0
        self.machine = machine_user_sys() - self.machine0
        cores1 = core_ticks()
        self.core_pct = {}
        for name, (busy, total) in cores1.items():
            b0, t0 = self.cores0.get(name, (0, 0))
            self.core_pct[name] = 100.0 * (busy - b0) / (total - t0) if total > t0 else 0.0

    @property
    def pct(self) -> float:
        return 100.0 * self.cpu / self.wall if self.wall else 0.0

    def fill(self, result: dict) -> dict:
        result["server_cpu_pct"] = self.pct
        result["core0_pct"] = self.core_pct.get("cpu0", 0.0)
        result["core1_pct"] = self.core_pct.get("cpu1", 0.0)
        # Everything else that ran meanwhile (other users of the machine), as % of one core.
        machine_pct = 100.0 * self.machine / self.wall if self.wall else 0.0
        result["other_pct"] = max(0.0, machine_pct - self.pct - result.get("gen_cpu_pct", 0.0))
        return result


# --------------------------------------------------------------------------- wire protocol (stats)

HEADER = struct.Struct("!2sBBQH")
STAT_NAMES = ("checks", "allowed", "denied", "malformed", "duplicates", "keys", "charged", "rule_loads")


def partition_stats(port: int) -> dict[str, int]:
    """STATS op over UDP: the server's own counters (to verify it really decided)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(1.0)
        for _attempt in range(5):
            request_id = int.from_bytes(os.urandom(8), "big")
            data = HEADER.pack(b"SG", 1, 2, request_id, 0)
            s.sendto(data + bytes(HEADER.size + 8 * len(STAT_NAMES) - len(data)), (HOST, port))
            try:
                reply = s.recv(4096)
            except TimeoutError:
                continue
            _, _, op, rid, count = HEADER.unpack_from(reply)
            if op == 0x82 and rid == request_id:
                values = struct.unpack_from(f"!{count}Q", reply, HEADER.size)
                return dict(zip(STAT_NAMES, values, strict=False))
    raise RuntimeError(f"no STATS reply from 127.0.0.1:{port}")


def one_check(port: int, key: bytes) -> None:
    """A single CHECK (used to rotate the server's reply cache)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(2.0)
        request_id = int.from_bytes(os.urandom(8), "big")
        data = HEADER.pack(b"SG", 1, 1, request_id, 1) + struct.pack("!HI", len(key), 1) + key
        s.sendto(data + bytes(max(0, HEADER.size + 17 - len(data))), (HOST, port))
        try:
            s.recv(4096)
        except TimeoutError:
            pass


# --------------------------------------------------------------------------- the bench


class Bench:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.quick = args.quick
        self.dur = 2.0 if args.quick else 10.0  # each measured load run
        self.ceiling_dur = 2.0 if args.quick else 4.0
        self.mem_keys = 100_000 if args.quick else 1_000_000
        self.tmp = Path(tempfile.mkdtemp(prefix="sluicegate-bench-"))
        self.python = args.python
        self.pin = shutil.which("taskset") is not None and (os.cpu_count() or 1) >= 2
        self.results: dict[str, object] = {}
        self.notes: list[str] = []
        self.background = 0.0
        self.env = dict(os.environ)
        self.env["SLUICEGATE_DEFAULT_CAPACITY"] = str(CAPACITY)
        self.env["SLUICEGATE_DEFAULT_RATE"] = str(RATE)
        self.env["PYTHONPATH"] = str(REPO) + (os.pathsep + self.env["PYTHONPATH"] if self.env.get("PYTHONPATH") else "")

    # pinning: servers on CPU 0, load generators on CPU 1
    def server_cmd(self, cmd: list[str]) -> list[str]:
        return ["taskset", "-c", "0", *cmd] if self.pin else cmd

    def load_cmd(self, cmd: list[str]) -> list[str]:
        return ["taskset", "-c", "1", *cmd] if self.pin else cmd

    def log(self, text: str) -> None:
        print(text, flush=True)

    # ---------------------------------------------------------------- build

    def build(self) -> None:
        BUILD.mkdir(exist_ok=True)
        for name in ("udpload", "udpecho"):
            cmd = ["gcc", "-O2", "-Wall", "-o", str(BUILD / name), str(BENCH / f"{name}.c")]
            subprocess.run(cmd, check=True)
        self.udpload = str(BUILD / "udpload")
        self.udpecho = str(BUILD / "udpecho")

    def udpload_run(self, port: int, *flags: str, limit: float | None = None, **options: object) -> tuple[dict, float]:
        """Run udpload; ``options`` become ``--name value`` (``timeout_ms``: ``--timeout-ms``)."""
        args = [str(token) for name, value in options.items() for token in (f"--{name.replace('_', '-')}", value)]
        cmd = self.load_cmd([self.udpload, "--host", HOST, "--port", str(port), *flags, *args])
        rc, out, cpu, wall = run_bounded(cmd, limit or (self.dur * 3 + 30))
        for line in out.splitlines():
            if line.startswith("{"):
                result = json.loads(line)
                result["gen_cpu_pct"] = 100.0 * cpu / wall if wall else 0.0
                return result, wall
        raise RuntimeError(f"udpload failed (rc {rc}): {out[-2000:]}")

    # ---------------------------------------------------------------- our partition server

    def start_partition(self, name: str) -> tuple[Proc, int]:
        port = free_port(socket.SOCK_DGRAM)
        db = self.tmp / f"{name}.db"
        cmd = self.server_cmd([self.python, "-m", "sluicegate.server", "--listen", f"{HOST}:{port}", "--db", str(db)])
        proc = Proc(name, cmd, env=self.env, cwd=str(self.tmp))
        proc.wait_for("listening on udp", 30)
        return proc, port

    def udp_scenarios(self) -> None:
        server, port = self.start_partition("partition")
        try:
            t0 = time.monotonic()
            warm, _ = self.udpload_run(port, mode="fill", keys=KEYS, batch=64, conns=8, timeout_ms=2000, duration=60)
            stats = partition_stats(port)
            self.log(
                f"warm-up: sent each of the {KEYS:,} keys once ({warm['items']:,} checks, "
                f"{time.monotonic() - t0:.1f}s); server holds {stats['keys']:,} keys, "
                f"rule_loads {stats['rule_loads']:,}"
            )
            self.results["warmup"] = {"keys": stats["keys"], "rule_loads": stats["rule_loads"]}
            for label, batch in (("single", 1), ("batched", BATCH)):
                before = partition_stats(port)
                with Measured(server.pid) as m:
                    r, _ = self.udpload_run(
                        port, mode="closed", conns=CONNS, batch=batch, keys=KEYS, duration=self.dur, warmup=1
                    )
                after = partition_stats(port)
                m.fill(r)
                r["server_checks"] = after["checks"] - before["checks"]
                r["server_malformed"] = after["malformed"] - before["malformed"]
                r["server_denied"] = after["denied"] - before["denied"]
                self.results[f"udp_{label}"] = r
                self.log(
                    f"ours UDP {batch:>2} check/dgram: {r['decisions_per_s']:>10,.0f} decisions/s "
                    f"({r['dgrams_per_s']:,.0f} dgrams/s), p50 {r['lat_p50_us']:.0f} us, p99 {r['lat_p99_us']:.0f} us, "
                    f"lost {r['lost']}, server CPU {m.pct:.0f}%, generator CPU {r['gen_cpu_pct']:.0f}%; "
                    f"server counted {r['server_checks']:,} checks, malformed {r['server_malformed']}"
                )
            # 4. open loop at half of the peak of (1)
            rate = 0.5 * self.results["udp_single"]["dgrams_per_s"]
            with Measured(server.pid) as m:
                r, _ = self.udpload_run(
                    port, mode="open", rate=round(rate), conns=CONNS, batch=1, keys=KEYS, duration=self.dur, warmup=1
                )
            m.fill(r)
            self.results["udp_open"] = r
            self.log(
                f"ours UDP open loop at {rate:,.0f}/s (50% of peak): p50 {r['lat_p50_us']:.0f} us, "
                f"p99 {r['lat_p99_us']:.0f} us, p99.9 {r['lat_p999_us']:.0f} us (from scheduled send; "
                f"from actual send p99 {r['lat_send_p99_us']:.0f} us), lost {r['lost']}, server CPU {m.pct:.0f}%"
            )
            final = partition_stats(port)
            self.results["udp_final_stats"] = final
        finally:
            server.stop()
        self.latency_floor(rate)

    def echo_ceiling(self) -> None:
        """6. The generator's own ceiling, against a C reflector doing no work."""
        port = free_port(socket.SOCK_DGRAM)
        echo = Proc("udpecho", self.server_cmd([self.udpecho, str(port)]))
        try:
            echo.wait_for("ready", 10)
            for label, batch in (("single", 1), ("batched", BATCH)):
                with Measured(echo.pid) as m:
                    r, _ = self.udpload_run(
                        port, mode="closed", conns=CONNS, batch=batch, keys=KEYS, duration=self.ceiling_dur, warmup=0.5
                    )
                m.fill(r)
                self.results[f"echo_{label}"] = r
                self.log(
                    f"generator ceiling vs C reflector, {batch:>2} check/dgram: {r['dgrams_per_s']:,.0f} dgrams/s "
                    f"= {r['decisions_per_s']:,.0f} checks/s, p50 {r['lat_p50_us']:.0f} us, "
                    f"generator CPU {r['gen_cpu_pct']:.0f}%, reflector CPU {m.pct:.0f}%"
                )
        finally:
            echo.stop()

    def latency_floor(self, rate: float) -> None:
        """The open loop of (4), same rate and duration, against the C reflector: what the machine adds."""
        port = free_port(socket.SOCK_DGRAM)
        echo = Proc("udpecho", self.server_cmd([self.udpecho, str(port)]))
        try:
            echo.wait_for("ready", 10)
            with Measured(echo.pid) as m:
                r, _ = self.udpload_run(
                    port, mode="open", rate=round(rate), conns=CONNS, batch=1, keys=KEYS, duration=self.dur, warmup=1
                )
            m.fill(r)
            self.results["echo_open"] = r
            self.log(
                f"latency floor (same open loop vs C reflector at {rate:,.0f}/s): p50 {r['lat_p50_us']:.0f} us, "
                f"p99 {r['lat_p99_us']:.0f} us, p99.9 {r['lat_p999_us']:.0f} us"
            )
        finally:
            echo.stop()

    def memory(self) -> None:
        """5. RSS of one partition holding mem_keys distinct keys."""
        server, port = self.start_partition("partition-mem")
        try:
            time.sleep(0.3)
            start = rss_kb(server.pid)
            t0 = time.monotonic()
            r, _ = self.udpload_run(
                port,
                "--uuid",
                mode="fill",
                keys=self.mem_keys,
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
            self.results["memory"] = {
                "keys": stats["keys"],
                "lost": r["lost"],
                "fill_s": fill_s,
                "rss_start_kb": start["VmRSS"],
                "rss_full_kb": full["VmRSS"],
                "rss_settled_kb": settled["VmRSS"],
                "hwm_kb": settled["VmHWM"],
            }
            self.log(
                f"memory: {stats['keys']:,} keys (36-char UUID-shaped) loaded in {fill_s:.1f}s; RSS at start "
                f"{start['VmRSS'] / 1024:.0f} MB, right after loading {full['VmRSS'] / 1024:.0f} MB, after the "
                f"reply cache expired {settled['VmRSS'] / 1024:.0f} MB (peak {settled['VmHWM'] / 1024:.0f} MB)"
            )
        finally:
            server.stop()

    # ---------------------------------------------------------------- Redis

    def redis(self) -> None:
        if not (shutil.which("redis-server") and shutil.which("redis-benchmark") and shutil.which("redis-cli")):
            self.notes.append("Redis baseline skipped: redis-server / redis-benchmark / redis-cli not installed")
            self.log(self.notes[-1])
            return
        port = free_port()
        rdir = self.tmp / "redis"
        rdir.mkdir()
        server = Proc(
            "redis-server",
            self.server_cmd(
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
            ),
        )
        try:
            server.wait_for("Ready to accept connections", 15)
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
                calib = self.redis_benchmark(port, command, pipeline, calib_n, server.pid)
                n = max(10_000, int(calib["rps"] * self.dur))
                r = self.redis_benchmark(port, command, pipeline, n, server.pid)
                self.results[f"redis_{label}"] = r
                self.log(
                    f"Redis EVALSHA token bucket, -c {CONNS} -P {pipeline}: {r['rps']:>10,.0f} decisions/s in "
                    f"{r['wall_s']:.1f}s, p50 {r['p50_ms'] * 1000:.0f} us, p99 {r['p99_ms'] * 1000:.0f} us, "
                    f"redis-server CPU {r['server_cpu_pct']:.0f}%, redis-benchmark CPU {r['gen_cpu_pct']:.0f}%"
                )
            info = subprocess.run(
                ["redis-cli", "-h", HOST, "-p", str(port), "DBSIZE"], capture_output=True, text=True, timeout=10
            ).stdout.strip()
            self.results["redis_dbsize"] = info
        finally:
            server.stop()

    def redis_benchmark(self, port: int, command: list[str], pipeline: int, n: int, server_pid: int) -> dict:
        cmd = self.load_cmd(
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
            rc, out, cpu, wall = run_bounded(cmd, self.dur * 3 + 30)
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
            "gen_cpu_pct": 100.0 * cpu / wall,
        } | m.fill({})

    # ---------------------------------------------------------------- HTTP

    def wrk(self, port: int, server_pid: int) -> dict:
        script = self.tmp / "check.lua"
        script.write_text(
            "math.randomseed(os.time())\n"
            "request = function()\n"
            f'  return wrk.format("GET", "/v1/check/k" .. math.random(1, {KEYS}))\n'
            "end\n"
        )
        cmd = self.load_cmd(
            [
                "wrk",
                "-t1",
                f"-c{CONNS}",
                f"-d{self.dur:.0f}s",
                "--latency",
                "-s",
                str(script),
                f"http://{HOST}:{port}/",
            ]
        )
        with Measured(server_pid) as m:
            rc, out, cpu, wall = run_bounded(cmd, self.dur * 3 + 30)
        result: dict = m.fill({"gen_cpu_pct": 100.0 * cpu / wall, "raw": out})
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

    def nginx(self) -> None:
        if not (shutil.which("nginx") and shutil.which("wrk")):
            self.notes.append("nginx baseline skipped: nginx or wrk not installed")
            self.log(self.notes[-1])
            return
        port = free_port()
        ndir = self.tmp / "nginx"
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
        server = Proc(
            "nginx", self.server_cmd(["nginx", "-p", str(ndir), "-e", str(ndir / "error.log"), "-c", str(conf)])
        )
        try:
            wait_tcp(port, 10)
            r = self.wrk(port, server.pid)
            self.results["nginx"] = r
            self.log(
                f"nginx return 200 (1 worker): {r['rps']:>10,.0f} req/s, p50 {r.get('p50')}, p99 {r.get('p99')}, "
                f"nginx CPU {r['server_cpu_pct']:.0f}%, wrk CPU {r['gen_cpu_pct']:.0f}%"
            )
        finally:
            server.stop()

    def local_command(self) -> list[str] | None:
        probe = subprocess.run(
            [self.python, "-c", "import sluicegate.cli"], env=self.env, capture_output=True, timeout=30
        )
        if probe.returncode == 0:
            return [self.python, "-m", "sluicegate.cli"]
        script = Path(self.python).parent / "sluicegate"
        return [str(script)] if script.exists() else None

    def http_front(self) -> None:
        if not shutil.which("wrk"):
            return
        base = self.local_command()
        if base is None:
            self.notes.append("HTTP front skipped: sluicegate.cli not importable")
            self.log(self.notes[-1])
            return
        port = free_port()
        db = self.tmp / "b.db"
        cmd = self.server_cmd(
            [*base, "local", "--host", HOST, "--port", str(port), "--partitions", "2", "--db", str(db)]
        )
        front = Proc("sluicegate local", cmd, env=self.env, cwd=str(self.tmp))
        try:
            front.wait_for("http://", 60)
            warm_s, warm_errors = self.warm_http(port)
            self.log(
                f"HTTP warm-up: {KEYS:,} keys via POST /v1/check batches of 100 in {warm_s:.1f}s ({warm_errors} errors)"
            )
            r = self.wrk(port, front.pid)
            r["warm_s"] = warm_s
            self.results["front"] = r
            self.log(
                f"sluicegate local (front + 2 partitions): {r['rps']:>10,.0f} req/s, p50 {r.get('p50')}, "
                f"p99 {r.get('p99')}, non-2xx {r.get('non2xx', 0)}, server CPU (all processes) "
                f"{r['server_cpu_pct']:.0f}%, wrk CPU {r['gen_cpu_pct']:.0f}%"
            )
        finally:
            front.stop()

    def warm_http(self, port: int) -> tuple[float, int]:
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

    # ---------------------------------------------------------------- report

    def machine(self) -> dict[str, str]:
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
                self.python,
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
            "pinning": "servers on CPU 0, load generators on CPU 1 (taskset)" if self.pin else "none",
            "mode": "quick (smoke run: short durations)" if self.quick else "full",
            "activity before the bench": f"{self.background:.0f}% of one core (user+system, 1 s sample)",
        }

    def report(self) -> str:
        R = self.results
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

        machine = self.machine()
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
        lines += [f"- {note}" for note in self.notes]
        lines += self.saturation_notes()
        return "\n".join(lines) + "\n"

    def saturation_notes(self) -> list[str]:
        """Say where a load generator's core was saturated: that figure is then a lower bound."""
        R = self.results
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
            if not isinstance(v, dict) or not self.pin:
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

    def run(self) -> None:
        steps = [
            ("build", self.build),
            ("UDP partition server (1, 2, 4) and the latency floor", self.udp_scenarios),
            ("Redis baseline (1, 2)", self.redis),
            ("load generator ceiling (6)", self.echo_ceiling),
            ("HTTP front (3)", self.http_front),
            ("nginx baseline (3)", self.nginx),
            ("memory (5)", self.memory),
        ]
        t0 = time.monotonic()
        before = machine_user_sys()
        time.sleep(1.0)
        self.background = 100.0 * (machine_user_sys() - before)
        self.log(f"machine activity before the bench (1 s sample): {self.background:.0f}% of one core")
        for title, step in steps:
            self.log(f"== {title}")
            try:
                step()
            except Exception as exc:
                if title == "build":
                    raise
                self.notes.append(f"{title} failed: {exc}")
                self.log(f"!! {title} failed: {exc}")
            finally:
                stop_all()
        report = self.report()
        report = report.replace("\nNotes:\n", f"\nTotal bench time {time.monotonic() - t0:.0f} s.\n\nNotes:\n", 1)
        (BENCH / "results.md").write_text(report)
        print()
        print(report)
        print(f"written: {BENCH / 'results.md'}")


def _n(value: float | None) -> str:
    return f"{value:,.0f}" if value else "n/a"


def _us(value: float | None) -> str:
    if not value:
        return "n/a"
    return f"{value / 1000:.2f} ms" if value >= 1000 else f"{value:.0f} us"


def _pf(ok: bool | None) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "FAIL")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short durations (smoke run)")
    parser.add_argument("--python", default=sys.executable, help="interpreter that runs the server (default: this one)")
    args = parser.parse_args()
    bench = Bench(args)
    # Stop our children on SIGTERM too (finally blocks run on SystemExit).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        bench.run()
    finally:
        stop_all()
        shutil.rmtree(bench.tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
