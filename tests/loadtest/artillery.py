"""Run the pinned Artillery (loadtest/node_modules) against a `sluicegate local` started for a test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.conftest import child_env, read_until, stop

ROOT = Path(__file__).resolve().parents[2]
LOADTEST = ROOT / "loadtest"
ARTILLERY = LOADTEST / "node_modules" / ".bin" / "artillery"


@dataclass
class ArtilleryRun:
    returncode: int
    output: str
    report: dict[str, Any]

    @property
    def counters(self) -> dict[str, int]:
        return self.report.get("aggregate", {}).get("counters", {})


@contextmanager
def sluicegate_local(tmp_path: Path, *, partitions: int = 2, **env: str) -> Iterator[str]:
    """Start `sluicegate local` on a free port; yield its base URL; stop it afterwards."""
    command = [sys.executable, "-m", "sluicegate.cli", "local", "--port", "0", "--partitions", str(partitions)]
    command += ["--db", str(tmp_path / "local.db")]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env(**env)
    )
    try:
        match, _ = read_until(process, r"(http://127\.0\.0\.1:\d+)")
        yield match.group(1)
    finally:
        stop(process)


def run_artillery(script: str, target: str, report: Path, *extra: str, timeout: float = 120) -> ArtilleryRun:
    """``artillery run --target TARGET --output REPORT loadtest/SCRIPT``; its exit code, output and JSON report."""
    assert ARTILLERY.exists(), f"{ARTILLERY} missing: run `make loadtest-deps` (npm ci in loadtest/)"
    env = {**os.environ, "ARTILLERY_DISABLE_TELEMETRY": "true", "NO_COLOR": "1"}
    command = [str(ARTILLERY), "run", "--target", target, "--output", str(report), *extra, str(LOADTEST / script)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=LOADTEST)
    data = json.loads(report.read_text()) if report.exists() else {}
    return ArtilleryRun(done.returncode, done.stdout + done.stderr, data)
