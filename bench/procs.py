"""Processes of the bench: starting and stopping them by PID, ports, and their CPU and memory from /proc."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from context import HOST

CLK_TCK = os.sysconf("SC_CLK_TCK")

_started: list[Proc] = []


class Proc:
    """A child process whose output is drained by a thread (lines kept)."""

    def __init__(self, name: str, cmd: list[str], *, env: dict[str, str] | None = None, cwd: str | None = None):
        self.name = name
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
        children = [(pid, int(fields[19])) for pid, fields in _descendants(self.pid, _process_table())]
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


@contextmanager
def running(
    name: str,
    cmd: list[str],
    *,
    ready: str | None = None,
    timeout: float = 10,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
) -> Iterator[Proc]:
    """Start ``cmd``, wait until it prints ``ready`` (if given), and stop it by PID on the way out."""
    proc = Proc(name, cmd, env=env, cwd=cwd)
    try:
        if ready is not None:
            proc.wait_for(ready, timeout)
        yield proc
    finally:
        proc.stop()


def stop_all() -> None:
    """Stop every process started here that is still running (newest first)."""
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


def cpu_pct(cpu_s: float, wall_s: float) -> float:
    """CPU seconds over a wall time, as % of one core."""
    return 100.0 * cpu_s / wall_s if wall_s else 0.0


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


# --------------------------------------------------------------------------- /proc


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name: [0] state, [1] ppid, [11] utime, [12] stime, [19] start."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return data[data.rindex(")") + 2 :].split()


def _start_time(pid: int) -> int | None:
    """Start time of a living process (to tell a PID's process from a later one); None if gone or a zombie."""
    fields = _stat_fields(pid)
    return None if fields is None or fields[0] == "Z" else int(fields[19])


def _process_table() -> dict[int, list[str]]:
    """The stat fields of every process on the machine, by PID."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields is not None:
                table[int(entry)] = fields
    return table


def _descendants(root: int, table: dict[int, list[str]]) -> list[tuple[int, list[str]]]:
    """``(pid, stat fields)`` of the descendants of ``root`` in ``table``."""
    found, todo, seen = [], [root], {root}
    while todo:
        parent = todo.pop()
        for pid, fields in table.items():
            if int(fields[1]) == parent and pid not in seen:
                seen.add(pid)
                found.append((pid, fields))
                todo.append(pid)
    return found


def tree_cpu(root: int) -> float:
    """CPU seconds (user+system, all threads) of ``root`` and all its living descendants."""
    table = _process_table()
    if root not in table:
        return 0.0
    tree = [table[root]] + [fields for _, fields in _descendants(root, table)]
    return sum(int(fields[11]) + int(fields[12]) for fields in tree) / CLK_TCK


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
        return cpu_pct(self.cpu, self.wall)

    def fill(self, result: dict) -> dict:
        """Add the server's CPU, the two cores' busy share and everything else's CPU to ``result``."""
        result["server_cpu_pct"] = self.pct
        result["core0_pct"] = self.core_pct.get("cpu0", 0.0)
        result["core1_pct"] = self.core_pct.get("cpu1", 0.0)
        # Everything else that ran meanwhile (other users of the machine), as % of one core.
        machine_pct = cpu_pct(self.machine, self.wall)
        result["other_pct"] = max(0.0, machine_pct - self.pct - result.get("gen_cpu_pct", 0.0))
        return result
