"""What every scenario of the bench shares: the workload constants and one run's settings, results and notes."""

from __future__ import annotations

import os
import shutil
import tempfile
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


class Context:
    """Settings of one run (durations, interpreter, pinning, environment) and what it has found so far."""

    def __init__(self, *, quick: bool, python: str):
        self.quick = quick
        self.dur = 2.0 if quick else 10.0  # each measured load run
        self.ceiling_dur = 2.0 if quick else 4.0
        self.mem_keys = 100_000 if quick else 1_000_000
        self.tmp = Path(tempfile.mkdtemp(prefix="sluicegate-bench-"))
        self.python = python
        self.pin = shutil.which("taskset") is not None and (os.cpu_count() or 1) >= 2
        self.results: dict[str, object] = {}
        self.notes: list[str] = []
        self.background = 0.0
        self.env = dict(os.environ)
        self.env["SLUICEGATE_DEFAULT_CAPACITY"] = str(CAPACITY)
        self.env["SLUICEGATE_DEFAULT_RATE"] = str(RATE)
        self.env["PYTHONPATH"] = str(REPO) + (os.pathsep + self.env["PYTHONPATH"] if self.env.get("PYTHONPATH") else "")

    @property
    def load_limit(self) -> float:
        """How long one measured load generator may run before it is killed."""
        return self.dur * 3 + 30

    # pinning: servers on CPU 0, load generators on CPU 1
    def server_cmd(self, cmd: list[str]) -> list[str]:
        return ["taskset", "-c", "0", *cmd] if self.pin else cmd

    def load_cmd(self, cmd: list[str]) -> list[str]:
        return ["taskset", "-c", "1", *cmd] if self.pin else cmd

    def log(self, text: str) -> None:
        print(text, flush=True)

    def skip(self, note: str) -> None:
        """Record (for results.md) and print why a scenario did not run."""
        self.notes.append(note)
        self.log(note)
