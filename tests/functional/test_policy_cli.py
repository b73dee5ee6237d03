"""Policies as a user drives them: a rules file for `sluicegate local`, `sluicegate check`, `rules put`.

One real `sluicegate local` (2 partitions on 127.0.0.1) per test, started with
a YAML rules file holding a daily quota, a shadow limit and patterns; every
command is a real `sluicegate` process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import child_env, read_until, stop
from tests.functional.test_cli_rules import sluicegate

RULES = """rules:
  - key: acme
    capacity: 100
    rate: 100
    limits: [{name: daily, quota: 3, per: day, offset: "+02:00"}]
  - key: trial
    capacity: 100
    rate: 100
    limits: [{name: new, capacity: 1, rate: 0.001, shadow: true}]
  - {key: "tenant:*", capacity: 7, rate: 1}
  - {key: "*:admin", capacity: 9, rate: 1, precedence: 5}
  - {key: broken, capacity: 1, rate: 1, limits: [{quota: 1, per: fortnight}]}
"""


class Service:
    def __init__(self, tmp_path: Path, port: int, output: list[str]) -> None:
        self.tmp_path = tmp_path
        self.endpoint = f"http://127.0.0.1:{port}"
        self.output = output

    def check(self, key: str) -> tuple[int, dict[str, object], str]:
        done = sluicegate("check", key, "--endpoint", self.endpoint, cwd=self.tmp_path)
        return done.returncode, json.loads(done.stdout), done.stderr

    def rules(self, *args: str) -> subprocess.CompletedProcess[str]:
        return sluicegate("rules", "--db", str(self.tmp_path / "local.db"), *args, cwd=self.tmp_path)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    command = [sys.executable, "-m", "sluicegate.cli", "local", "--port", "0", "--partitions", "2"]
    command += ["--db", str(tmp_path / "local.db"), "--rules", str(rules)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env())
    try:
        match, output = read_until(process, r"http://127\.0\.0\.1:(\d+)")
        yield Service(tmp_path, int(match.group(1)), output)
    finally:
        stop(process)


def test_rules_file_with_policies_is_loaded_and_bad_rows_reported(service: Service, tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    errors = [line for line in service.output if line.startswith(f"{rules}:")]
    assert len(errors) == 1
    assert errors[0].startswith(f"{rules}:12: limits: per must be one of")
    listing = [json.loads(line) for line in service.rules("list").stdout.splitlines()]
    assert [rule["key"] for rule in listing] == ["*:admin", "acme", "tenant:*", "trial"]
    assert listing[1]["limits"] == [{"name": "daily", "quota": 3, "per": "day", "offset": "+02:00"}]


def test_check_names_the_quota_that_denies(service: Service) -> None:
    for _ in range(3):
        code, answer, note = service.check("acme")
        assert (code, answer["allowed"], answer["limit"], note) == (0, True, None, "")
    code, answer, note = service.check("acme")
    assert code == 1
    assert (answer["allowed"], answer["limit"], answer["would_deny"]) == (False, "daily", False)
    assert answer["capacity"] == 3  # the quota's count, not the main bucket's 100
    # The window ends at the next midnight at UTC+02:00: within a day.
    assert 0 < answer["retry_after_ms"] <= 86_400_000
    assert note.startswith("sluicegate: denied by the 'daily' limit (retry in ")


def test_check_reports_a_shadow_limit_without_denying(service: Service) -> None:
    code, answer, note = service.check("trial")
    assert (code, answer["would_deny"], note) == (0, False, "")
    for _ in range(2):
        code, answer, note = service.check("trial")
        assert (code, answer["allowed"], answer["would_deny"], answer["limit"]) == (0, True, True, "new")
        assert note == "sluicegate: allowed, but the shadow limit 'new' would have denied it\n"


def test_patterns_resolve_and_a_new_pattern_reaches_a_held_key(service: Service) -> None:
    assert service.check("tenant:zeta")[1]["capacity"] == 7
    assert service.check("tenant:acme:admin")[1]["capacity"] == 9  # precedence beats the longer literal part
    assert service.check("tenant:acme:x")[1]["capacity"] == 7
    put = service.rules("put", "tenant:acme:*", "--capacity", "11", "--rate", "1")
    assert put.returncode == 0
    deadline = time.monotonic() + 10  # the sync interval is 1 s; each check is a process start
    while service.check("tenant:acme:x")[1]["capacity"] != 11:
        assert time.monotonic() < deadline, "the new pattern did not reach a held key"
        time.sleep(0.1)
    assert service.check("tenant:acme:admin")[1]["capacity"] == 9
