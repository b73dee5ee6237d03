"""Processes for the proxy tests: the upstream app, `sluicegate local` (the quota service) and `sluicegate proxy`.

Each is a real process on 127.0.0.1, stopped by its PID after the tests that use it.
"""

from __future__ import annotations

import http.client
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import child_env, read_until, stop

UPSTREAM_APP = Path(__file__).with_name("proxy_upstream.py")


@dataclass
class Service:
    """A started process and what it printed until it was ready."""

    process: subprocess.Popen[str]
    port: int
    output: list[str]

    def stop(self) -> str:
        """Stop it (SIGTERM) and return everything it printed."""
        stop(self.process)
        rest = self.process.stdout.read() if self.process.stdout else ""
        return "".join(self.output) + rest

    def vm(self, field: str) -> int:
        """A ``/proc/<pid>/status`` memory figure (``VmRSS``, ``VmHWM``) in bytes."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
        raise AssertionError(f"no {field} for pid {self.process.pid}")

    def reset_peak_memory(self) -> None:
        Path(f"/proc/{self.process.pid}/clear_refs").write_text("5")  # VmHWM := VmRSS (Linux >= 4.0)


def _start(command: list[str], ready: str, **env: str) -> tuple[Service, re.Match[str]]:
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env(**env)
    )
    try:
        match, output = read_until(process, ready)
    except BaseException:
        stop(process)
        raise
    return Service(process, int(match.group(1)), output), match


def start_upstream() -> Service:
    return _start([sys.executable, str(UPSTREAM_APP)], r"upstream listening on 127\.0\.0\.1:(\d+)")[0]


def start_local(tmp: Path, rules_yaml: str, **env: str) -> tuple[Service, str]:
    """`sluicegate local` with 2 partitions and these rules: (service, its partitions as HOST:PORT,...)."""
    rules = tmp / "rules.yaml"
    rules.write_text(rules_yaml)
    command = [sys.executable, "-m", "sluicegate.cli", "local", "--port", "0", "--partitions", "2"]
    command += ["--db", str(tmp / "quota.db"), "--rules", str(rules)]
    service, match = _start(command, r"http://127\.0\.0\.1:(\d+) with 2 partitions \(udp ([^)]*)\)", **env)
    return service, match.group(2).replace(" ", "")


def start_proxy(tmp: Path, upstream: str, policy_yaml: str, partitions: str, *extra: str, **env: str) -> Service:
    policy = tmp / f"policy{len(list(tmp.glob('policy*.yaml')))}.yaml"
    policy.write_text(policy_yaml)
    command = [sys.executable, "-m", "sluicegate.cli", "proxy", "--upstream", upstream, "--listen", "127.0.0.1:0"]
    command += ["--policy", str(policy), "--partitions", partitions, *extra]
    return _start(command, r"sluicegate proxy: http://127\.0\.0\.1:(\d+)", **env)[0]


def request(
    port: int, method: str, path: str, *, headers: dict[str, str] | None = None, body: bytes | None = None
) -> tuple[int, dict[str, str], bytes]:
    """One request on a new connection: (status, headers with lower-case names, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def upstream_stats(port: int) -> dict[str, int]:
    return json.loads(request(port, "GET", "/stats")[2])


def remaining(headers: dict[str, str]) -> int:
    """``r`` of the ``RateLimit`` field."""
    return int(re.search(r";r=(\d+)", headers["ratelimit"]).group(1))


def quota(headers: dict[str, str]) -> int:
    """``q`` of the ``RateLimit-Policy`` field (the capacity of the rule that decided)."""
    return int(re.search(r";q=(\d+)", headers["ratelimit-policy"]).group(1))
