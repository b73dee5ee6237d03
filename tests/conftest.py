"""Shared test helpers: a controllable clock, partition processes, `sluicegate local`."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from tests.stores import BACKENDS


class ManualClock:
    """A monotonic clock in nanoseconds that only moves when a test says so."""

    def __init__(self, start_ns: int = 1_000_000_000) -> None:
        self.now_ns = start_ns

    def __call__(self) -> int:
        return self.now_ns

    def advance(self, seconds: float) -> None:
        self.now_ns += round(seconds * 1_000_000_000)


def child_env(**overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLUICEGATE_")}
    env.update(overrides)
    return env


def read_until(process: subprocess.Popen[str], pattern: str, timeout: float = 15.0) -> tuple[re.Match[str], list[str]]:
    """Read output lines until one matches ``pattern``: (the match, every line read)."""
    deadline = time.monotonic() + timeout
    assert process.stdout is not None
    seen: list[str] = []
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            if process.poll() is not None:
                break
            continue
        seen.append(line)
        match = re.search(pattern, line)
        if match:
            return match, seen
    raise AssertionError(f"{pattern!r} not printed within {timeout}s; got: {''.join(seen)}")


def wait_for_line(process: subprocess.Popen[str], pattern: str, timeout: float = 15.0) -> re.Match[str]:
    return read_until(process, pattern, timeout)[0]


def stop(process: subprocess.Popen[str], timeout: float = 10.0) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()


@dataclass
class PartitionProcess:
    process: subprocess.Popen[str]
    address: tuple[str, int]


@pytest.fixture
def partition_process(tmp_path: Path) -> Iterator[object]:
    """Factory: start `python -m sluicegate.server` processes on free ports; all stopped after the test."""
    started: list[subprocess.Popen[str]] = []

    def start(**env: str) -> PartitionProcess:
        process = subprocess.Popen(
            [sys.executable, "-m", "sluicegate.server", "--listen", "127.0.0.1:0", "--db", str(tmp_path / "rules.db")],
            stdout=subprocess.PIPE,
            text=True,
            env=child_env(**env),
        )
        started.append(process)
        match = wait_for_line(process, r"listening on udp ([\d.]+):(\d+)")
        return PartitionProcess(process, (match.group(1), int(match.group(2))))

    yield start
    for process in started:
        stop(process)


# The store backends' fixtures (see tests/stores).
pytest_plugins = [f"tests.stores.{name}" for name in BACKENDS]


def children_of(pid: int) -> list[int]:
    """PIDs of the live child processes of ``pid`` (from /proc)."""
    children = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                children.append(int(entry))
    return children


@contextlib.contextmanager
def script_module(path: Path, name: str) -> Iterator[ModuleType]:
    """A script outside the packages (e.g. under bench/) imported as module ``name`` for the duration."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up by name
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[name]
