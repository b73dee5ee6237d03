"""The ``sluicegate`` command run as a real process: ``rules ...``, ``check``, configuration errors."""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluicegate.rules import Rule
from sluicegate.store.sqlite import SqliteRuleStore

REPO = Path(__file__).resolve().parents[2]


def sluicegate(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    clean = {name: value for name, value in os.environ.items() if not name.startswith("SLUICEGATE_")}
    clean["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), clean.get("PYTHONPATH")]))
    clean.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "sluicegate.cli", *args],
        cwd=cwd,
        env=clean,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def assert_clean_error(done: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("sluicegate: ")


class Cli:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.db = tmp_path / "rules.db"

    def rules(self, *args: str) -> subprocess.CompletedProcess[str]:
        return sluicegate("rules", "--db", str(self.db), *args, cwd=self.tmp_path)

    def stored(self) -> dict[str, Rule]:
        store = SqliteRuleStore(str(self.db))
        try:
            return {rule.key: rule for rule in store.iter_rules()}
        finally:
            store.close()


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(tmp_path)


class TestRulesCrud:
    def test_put_get_list_delete(self, cli: Cli) -> None:
        put = cli.rules("put", "alice", "--capacity", "1000", "--rate", "100")
        assert (put.returncode, put.stderr) == (0, "")
        assert json.loads(put.stdout) == {"key": "alice", "capacity": 1000, "rate": 100.0}
        assert cli.rules("put", "bob", "--capacity", "5", "--rate", "0.5").returncode == 0

        get = cli.rules("get", "alice")
        assert get.returncode == 0
        assert json.loads(get.stdout) == {"key": "alice", "capacity": 1000, "rate": 100.0}

        listing = cli.rules("list")
        assert listing.returncode == 0
        assert [json.loads(line)["key"] for line in listing.stdout.splitlines()] == ["alice", "bob"]

        delete = cli.rules("delete", "alice")
        assert (delete.returncode, delete.stdout, delete.stderr) == (0, "", "")
        assert cli.stored() == {"bob": Rule("bob", 5, 0.5)}

    def test_put_replaces(self, cli: Cli) -> None:
        cli.rules("put", "alice", "--capacity", "1", "--rate", "1")
        cli.rules("put", "alice", "--capacity", "2", "--rate", "3")
        assert cli.stored() == {"alice": Rule("alice", 2, 3)}

    def test_get_and_delete_of_a_missing_key_exit_1(self, cli: Cli) -> None:
        for action in ("get", "delete"):
            done = cli.rules(action, "ghost")
            assert done.returncode == 1
            assert done.stdout == ""
            assert "no rule for 'ghost'" in done.stderr

    def test_list_prefix_and_limit(self, cli: Cli) -> None:
        store = SqliteRuleStore(str(cli.db))
        store.put_rules(Rule(key, 1, 1) for key in ["t/1", "t/2", "t/3", "u", "t_"])
        store.close()
        done = cli.rules("list", "--prefix", "t/", "--limit", "2")
        assert done.returncode == 0
        assert [json.loads(line)["key"] for line in done.stdout.splitlines()] == ["t/1", "t/2"]
        empty = cli.rules("list", "--prefix", "zzz")
        assert (empty.returncode, empty.stdout) == (0, "")

    @pytest.mark.parametrize(
        ("args", "message"),
        [
            (("put", "alice", "--capacity", "-1", "--rate", "1"), "capacity"),
            (("put", "alice", "--capacity", "1.5", "--rate", "1"), "capacity"),
            (("put", "alice", "--capacity", "10", "--rate", "soon"), "rate"),
            (("put", "", "--capacity", "10", "--rate", "1"), "key must not be empty"),
            (("put", "x" * 300, "--capacity", "10", "--rate", "1"), "longer than 256"),
            (("get", ""), "key must not be empty"),
            (("list", "--limit", "0"), "limit"),
            (("list", "--limit", "5000"), "limit"),
        ],
    )
    def test_invalid_input_exits_2_with_a_message(self, cli: Cli, args: tuple[str, ...], message: str) -> None:
        done = cli.rules(*args)
        assert done.returncode == 2
        assert_clean_error(done)
        assert message in done.stderr
        assert done.stdout == ""
        assert cli.stored() == {}

    def test_missing_required_option_is_a_usage_error(self, cli: Cli) -> None:
        done = cli.rules("put", "alice", "--rate", "1")
        assert done.returncode == 2
        assert "--capacity" in done.stderr

    def test_database_in_a_missing_directory(self, tmp_path: Path) -> None:
        done = sluicegate("rules", "--db", str(tmp_path / "nope" / "rules.db"), "list", cwd=tmp_path)
        assert done.returncode == 2
        assert_clean_error(done)
        assert "unable to open database file" in done.stderr


class TestPolicyOptions:
    def test_put_with_every_policy_option_round_trips(self, cli: Cli) -> None:
        put = cli.rules(
            "put", "tenant:acme:*", "--capacity", "100", "--rate", "10", "--precedence", "5",
            "--limit", "name=daily,quota=250,per=day,offset=+02:00",
            "--limit", '{"name": "burst", "capacity": 20, "rate": 5, "shadow": true}',
        )  # fmt: skip
        assert (put.returncode, put.stderr) == (0, "")
        expected = {
            "key": "tenant:acme:*",
            "capacity": 100,
            "rate": 10.0,
            "limits": [
                {"name": "daily", "quota": 250, "per": "day", "offset": "+02:00"},
                {"name": "burst", "capacity": 20, "rate": 5.0, "shadow": True},
            ],
            "precedence": 5,
        }
        assert json.loads(put.stdout) == expected
        assert json.loads(cli.rules("get", "tenant:acme:*").stdout) == expected

        cli.rules(
            "put", "{acme}", "--capacity", "300", "--rate", "300", "--share", "strict", "--level-weights", "2=4,0=1"
        )
        cli.rules(
            "put", "{acme}:batch", "--capacity", "50", "--rate", "50",
            "--parent", "{acme}", "--weight", "2.5", "--priority", "2", "--shadow",
        )  # fmt: skip
        listing = [json.loads(line) for line in cli.rules("list", "--prefix", "{acme}").stdout.splitlines()]
        assert listing == [
            {"key": "{acme}", "capacity": 300, "rate": 300.0, "share": "strict", "level_weights": {"0": 1.0, "2": 4.0}},
            {
                "key": "{acme}:batch",
                "capacity": 50,
                "rate": 50.0,
                "shadow": True,
                "parent": "{acme}",
                "weight": 2.5,
                "priority": 2,
            },
        ]
        assert cli.stored()["{acme}:batch"].parent == "{acme}"

    def test_put_without_policy_options_stays_a_plain_rule(self, cli: Cli) -> None:
        cli.rules("put", "alice", "--capacity", "5", "--rate", "1", "--limit", "quota=9,per=hour")
        cli.rules("put", "alice", "--capacity", "5", "--rate", "1")
        assert cli.stored()["alice"].is_plain
        assert json.loads(cli.rules("get", "alice").stdout) == {"key": "alice", "capacity": 5, "rate": 1.0}

    @pytest.mark.parametrize(
        ("options", "message"),
        [
            (("--limit", "quota=5"), "limits: a quota limit needs per"),
            (("--limit", "quota=5,per=fortnight"), "per must be one of minute, hour, day, week, month"),
            (("--limit", "capacity=2.5,rate=1"), "capacity must be a whole number"),
            (("--limit", "capacity=2,rate=1,burst=4"), "unknown limit field(s): burst"),
            (("--limit", "quota"), "limit: quota needs a value"),
            (("--limit", "quota=1,per=day,offset=+25:00"), "offset must be within -14:00 and +14:00"),
            (("--limit", '{"quota": 1,'), "limit: not valid JSON"),
            (("--limit", "name=rate,quota=1,per=day"), "limit names must differ"),
            (("--precedence", "high"), "precedence must be a whole number, got 'high'"),
            (("--priority", "256"), "priority must be a whole number from 0 to 255"),
            (("--weight", "0"), "weight must be above 0"),
            (("--weight", "heavy"), "weight must be a number"),
            (("--share", "fair"), "share must be one of weighted, strict"),
            (("--parent", "bob"), "parent and child must share a routing key"),
            (
                (
                    "--parent",
                    "",
                ),
                "--parent must not be empty",
            ),
            (("--level-weights", "2"), "level_weights: expected priority=weight pairs"),
            (("--level-weights", "x=1"), "level_weights: 'x' is not a priority"),
        ],
    )
    def test_bad_policy_option_exits_2_with_the_rule_message(
        self, cli: Cli, options: tuple[str, ...], message: str
    ) -> None:
        done = cli.rules("put", "alice", "--capacity", "10", "--rate", "1", *options)
        assert done.returncode == 2
        assert_clean_error(done)
        assert message in done.stderr
        assert done.stdout == ""
        assert cli.stored() == {}


class TestImport:
    def test_csv_with_bad_rows(self, cli: Cli) -> None:
        path = cli.tmp_path / "rules.csv"
        path.write_text(
            "key,capacity,rate\n"  # 1
            "alice,10,1\n"  # 2
            "bob,-1,1\n"  # 3
            "carol,5,0.5\n"  # 4
            "dave,5,fast\n"  # 5
            "erin,1,1,1\n"  # 6
            "frank,7,2\n",  # 7
            encoding="utf-8",
        )
        done = cli.rules("import", str(path))
        assert done.returncode == 1
        errors = [line for line in done.stderr.splitlines() if line.startswith(f"{path}:")]
        assert [line.split(":")[1] for line in errors] == ["3", "5", "6"]
        assert "capacity" in errors[0]
        assert "rate" in errors[1]
        assert f"imported 3 rules from {path}; 3 bad rows skipped (6 rows read)" in done.stderr
        assert cli.stored() == {
            "alice": Rule("alice", 10, 1),
            "carol": Rule("carol", 5, 0.5),
            "frank": Rule("frank", 7, 2),
        }

    def test_all_good_exits_0(self, cli: Cli) -> None:
        path = cli.tmp_path / "rules.yaml"
        path.write_text("rules:\n  - {key: a, capacity: 1, rate: 1}\n  - {key: b, capacity: 2, rate: 2}\n")
        done = cli.rules("import", str(path))
        assert done.returncode == 0
        assert f"imported 2 rules from {path}; 0 bad rows skipped (2 rows read)" in done.stderr
        assert sorted(cli.stored()) == ["a", "b"]

    def test_json_bad_rows_have_their_lines(self, cli: Cli) -> None:
        path = cli.tmp_path / "rules.json"
        path.write_text(
            '[\n  {"key": "a", "capacity": 1, "rate": 1},\n  {"key": "b",\n   "capacity": -2, "rate": 1}\n]'
        )
        done = cli.rules("import", str(path))
        assert done.returncode == 1
        assert f"{path}:3: " in done.stderr
        assert sorted(cli.stored()) == ["a"]

    def test_json_with_rules_as_an_earlier_value(self, cli: Cli) -> None:
        path = cli.tmp_path / "rules.json"
        path.write_text(
            '{"comment": "rules", "tags": [1, 2],\n'
            ' "rules": [\n'
            '  {"key": "a", "capacity": 1, "rate": 1},\n'
            '  {"key": "b", "capacity": -2, "rate": 1},\n'
            '  {"key": "c", "capacity": 3, "rate": 1}\n'
            "]}\n"
        )
        done = cli.rules("import", str(path))
        assert "Traceback" not in done.stderr
        assert done.returncode == 1
        errors = [line for line in done.stderr.splitlines() if line.startswith(f"{path}:")]
        assert [line.split(":")[1] for line in errors] == ["4"]
        assert sorted(cli.stored()) == ["a", "c"]

    def test_format_option_overrides_extension(self, cli: Cli) -> None:
        path = cli.tmp_path / "export.txt"
        path.write_text("key,capacity,rate\na,1,1\n")
        assert cli.rules("import", str(path)).returncode == 2
        done = cli.rules("import", str(path), "--format", "csv")
        assert done.returncode == 0
        assert sorted(cli.stored()) == ["a"]

    @pytest.mark.parametrize(
        ("name", "text", "message"),
        [
            ("rules.csv", "name,capacity,rate\na,1,1\n", "header"),
            ("rules.json", "[{", "not valid JSON"),
            ("rules.txt", "key,capacity,rate\n", "cannot tell the format"),
        ],
    )
    def test_unreadable_file_exits_2(self, cli: Cli, name: str, text: str, message: str) -> None:
        path = cli.tmp_path / name
        path.write_text(text)
        done = cli.rules("import", str(path))
        assert done.returncode == 2
        assert_clean_error(done)
        assert message in done.stderr
        assert cli.stored() == {}

    def test_missing_file_exits_2(self, cli: Cli) -> None:
        done = cli.rules("import", str(cli.tmp_path / "absent.csv"))
        assert done.returncode == 2
        assert_clean_error(done)
        assert "absent.csv" in done.stderr

    def test_non_utf8_file_exits_2(self, cli: Cli) -> None:
        path = cli.tmp_path / "rules.csv"
        path.write_bytes("key,capacity,rate\nzoë,1,1\n".encode("latin-1"))
        done = cli.rules("import", str(path))
        assert done.returncode == 2
        assert_clean_error(done)
        assert "not UTF-8" in done.stderr

    def test_csv_policy_columns_with_bad_rows(self, cli: Cli) -> None:
        path = cli.tmp_path / "rules.csv"
        path.write_text(
            "key,capacity,rate,precedence,shadow,limits\n"  # 1
            'tenant:*,100,10,2,,"quota=250,per=day"\n'  # 2
            "tenant:vip:*,1000,100,high,,\n"  # 3
            "trial,10,1,,yes,\n"  # 4
            'broken,10,1,,,"[{""quota"": 5}]"\n',  # 5
            encoding="utf-8",
        )
        done = cli.rules("import", str(path))
        assert done.returncode == 1
        errors = [line for line in done.stderr.splitlines() if line.startswith(f"{path}:")]
        assert errors == [
            f"{path}:3: precedence must be a whole number, got 'high'",
            f"{path}:5: limits: a quota limit needs per",
        ]
        stored = cli.stored()
        assert sorted(stored) == ["tenant:*", "trial"]
        assert (stored["tenant:*"].precedence, stored["tenant:*"].limits[0].quota) == (2, 250)
        assert stored["trial"].shadow

    def test_large_import_shows_progress(self, cli: Cli) -> None:
        path = cli.tmp_path / "big.csv"
        path.write_text("key,capacity,rate\n" + "".join(f"user-{i:05},{i % 100},1\n" for i in range(5000)))
        done = cli.rules("import", str(path))
        assert done.returncode == 0
        lines = done.stderr.splitlines()
        progress = [line for line in lines if line.startswith("imported ") and "rules (" in line]
        assert progress, done.stderr
        assert progress[0].startswith("imported 500 rules (")
        assert lines[-1] == f"imported 5000 rules from {path}; 0 bad rows skipped (5000 rows read)"
        stored = cli.stored()
        assert len(stored) == 5000
        assert stored["user-04999"] == Rule("user-04999", 99, 1)


class StubApi(http.server.BaseHTTPRequestHandler):
    """Allows keys starting with 'ok', denies the rest (429), like the check API; some keys name a limit."""

    LIMITS: dict[str, dict[str, object]] = {
        "daily": {"limit": "daily", "retry_after_ms": 3_600_000, "would_deny": False},
        "forever": {"limit": "rate", "retry_after_ms": None, "would_deny": False},
        "ok-shadow": {"limit": "burst", "would_deny": True},
        "ok-plain": {"limit": None, "would_deny": False},
    }

    def do_GET(self) -> None:
        key = self.path.split("/v1/check/", 1)[1].split("?", 1)[0]
        if key == "garbled":  # a proxy in the way answering something that is not the API
            self.send_response(200)
            self.send_header("Content-Length", "9")
            self.end_headers()
            self.wfile.write(b"<html>hi<")
            return
        allowed = key.startswith("ok")
        answer = {"key": key, "allowed": allowed, "remaining": 1 if allowed else 0, "retry_after_ms": None}
        answer.update(self.LIMITS.get(key, {}))
        body = json.dumps(answer)
        self.send_response(200 if allowed else 429)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def stub_endpoint() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StubApi)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


class TestCheck:
    def test_nobody_listening_exits_2(self, tmp_path: Path) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))  # bound but not listening: connections are refused
            endpoint = f"http://127.0.0.1:{sock.getsockname()[1]}"
            done = sluicegate("check", "alice", "--endpoint", endpoint, cwd=tmp_path)
        assert done.returncode == 2
        assert_clean_error(done)
        assert f"cannot reach {endpoint}" in done.stderr
        assert done.stdout == ""

    @pytest.mark.parametrize(("key", "code", "allowed"), [("ok-alice", 0, True), ("bob", 1, False)])
    def test_exit_code_follows_the_decision(
        self, tmp_path: Path, stub_endpoint: str, key: str, code: int, allowed: bool
    ) -> None:
        done = sluicegate("check", key, "--cost", "3", "--endpoint", stub_endpoint + "/", cwd=tmp_path)
        assert done.returncode == code
        decision = json.loads(done.stdout)
        assert (decision["key"], decision["allowed"]) == (key, allowed)

    def test_answer_that_is_not_json_exits_2_without_a_traceback(self, tmp_path: Path, stub_endpoint: str) -> None:
        done = sluicegate("check", "garbled", "--endpoint", stub_endpoint, cwd=tmp_path)
        assert done.returncode == 2
        assert_clean_error(done)

    @pytest.mark.parametrize(
        ("key", "code", "note"),
        [
            ("daily", 1, "sluicegate: denied by the 'daily' limit (retry in 3600 s)\n"),
            ("forever", 1, "sluicegate: denied by the 'rate' limit (no wait helps)\n"),
            ("ok-shadow", 0, "sluicegate: allowed, but the shadow limit 'burst' would have denied it\n"),
            ("ok-plain", 0, ""),
            ("bob", 1, ""),
        ],
    )
    def test_the_limit_that_decided_is_printed(
        self, tmp_path: Path, stub_endpoint: str, key: str, code: int, note: str
    ) -> None:
        done = sluicegate("check", key, "--endpoint", stub_endpoint, cwd=tmp_path)
        assert (done.returncode, done.stderr) == (code, note)
        decision = json.loads(done.stdout)
        assert decision.get("limit") == StubApi.LIMITS.get(key, {}).get("limit")
        assert decision.get("would_deny") == StubApi.LIMITS.get(key, {}).get("would_deny")


class TestConfiguration:
    def test_bad_environment_exits_2_naming_the_variable(self, tmp_path: Path) -> None:
        done = sluicegate("rules", "list", cwd=tmp_path, env={"SLUICEGATE_PARTITIONS": "zero"})
        assert done.returncode == 2
        assert "configuration error" in done.stderr
        assert "SLUICEGATE_PARTITIONS" in done.stderr
        assert "Traceback" not in done.stderr

    def test_db_default_comes_from_the_environment(self, tmp_path: Path) -> None:
        db = tmp_path / "env.db"
        put = sluicegate(
            "rules", "put", "a", "--capacity", "1", "--rate", "1", cwd=tmp_path, env={"SLUICEGATE_DB": str(db)}
        )
        assert put.returncode == 0
        assert db.exists()
        assert not (tmp_path / "sluicegate.db").exists()

    def test_local_with_bad_options_exits_2_without_starting(self, tmp_path: Path) -> None:
        done = sluicegate("local", "--partitions", "0", "--port", "0", "--db", str(tmp_path / "r.db"), cwd=tmp_path)
        assert done.returncode == 2
        assert_clean_error(done)
        assert "SLUICEGATE_PARTITIONS" in done.stderr
