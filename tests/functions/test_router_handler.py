"""The router Lambda in-process with recorded ALB events, against real bucket servers on UDP.

Two ``sluicegate local`` services start with the same rules: one is asked over
HTTP (the reference), the other's partitions serve the Lambda handler. The
same requests must get the same answers, headers and fallbacks from both.
"""

from __future__ import annotations

import http.client
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.conftest import child_env, children_of, read_until, stop
from tests.functions.conftest import LambdaContext, event

RULES = 'key,capacity,rate,limits\nalice,5,0.001,\nvip,1000,100,\npool,1000,1000,"name=inflight,concurrency=1"\n'
DEFAULTS = {"SLUICEGATE_DEFAULT_CAPACITY": "3", "SLUICEGATE_DEFAULT_RATE": "0.001"}


class Local:
    """A running ``sluicegate local``: its HTTP port and its partitions' UDP addresses."""

    def __init__(self, process: subprocess.Popen[str], port: int, partitions: list[str]) -> None:
        self.process = process
        self.port = port
        self.partitions = partitions

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, dict[str, str], Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        conn.request(method, path, body=body)
        response = conn.getresponse()
        raw = response.read()
        conn.close()
        return response.status, dict(response.getheaders()), json.loads(raw) if raw else None

    def partition_pid(self, index: int) -> int:
        for pid in children_of(self.process.pid):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if b"--partition" in argv and argv[argv.index(b"--partition") + 1] == str(index).encode():
                return pid
        raise AssertionError(f"partition {index} is not running")


def start_local(folder: Path) -> Local:
    folder.mkdir()
    (folder / "rules.csv").write_text(RULES)
    command = [sys.executable, "-m", "sluicegate.cli", "local", "--port", "0", "--partitions", "3"]
    command += ["--db", str(folder / "local.db"), "--rules", str(folder / "rules.csv")]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env(**DEFAULTS)
    )
    match, _ = read_until(process, r"http://127\.0\.0\.1:(\d+) with 3 partitions \(udp ([^)]+)\)")
    return Local(process, int(match.group(1)), [part.strip() for part in match.group(2).split(",")])


@pytest.fixture
def reference(tmp_path: Path) -> Iterator[Local]:
    local = start_local(tmp_path / "reference")
    yield local
    stop(local.process)


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[Local]:
    local = start_local(tmp_path / "lambda")
    yield local
    stop(local.process)


@pytest.fixture
def router(load_function, backend: Local) -> ModuleType:  # type: ignore[no-untyped-def]
    return load_function(
        "router", SLUICEGATE_PARTITION_ADDRESSES=",".join(backend.partitions), SLUICEGATE_PARTITIONS="3", **DEFAULTS
    )


def invoke(router: ModuleType, method: str, path: str, body: bytes | None = None) -> tuple[int, dict[str, str], Any]:
    path, _, query = path.partition("?")
    params = dict(part.split("=", 1) for part in query.split("&")) if query else {}
    alb_event = event("alb_get_check", httpMethod=method, path=path, queryStringParameters=params)
    if body is not None:
        alb_event.update(body=body.decode(), isBase64Encoded=False)
    answer = router.handler(alb_event, LambdaContext())
    assert answer["isBase64Encoded"] is False
    headers = {name.lower(): value for name, value in answer["headers"].items()}
    return answer["statusCode"], headers, json.loads(answer["body"]) if answer["body"] else None


COMPARED_HEADERS = ("content-type", "ratelimit", "ratelimit-policy", "retry-after")

REQUESTS: list[tuple[str, str, bytes | None]] = [
    ("GET", "/v1/check/alice", None),
    ("GET", "/v1/check/alice?cost=3", None),
    ("GET", "/v1/check/alice?cost=2", None),  # denied: 1 left
    ("HEAD", "/v1/check/bob", None),
    ("GET", "/v1/check/bob", None),
    ("GET", "/v1/check/%E2%9C%93%20tick", None),
    ("GET", "/v1/check/%7Bt%7D%2Fa?cost=9", None),  # above capacity: never
    ("POST", "/v1/check", b'{"checks":[{"key":"vip","cost":600},{"key":"bob"},{"key":"carol","cost":2}]}'),
    ("GET", "/v1/check/bob", None),  # the default rule's last credit went to the batch: denied
    ("GET", "/v1/check/alice?cost=abc", None),
    ("GET", "/v1/check/%ff%fe", None),
    ("POST", "/v1/check", b"{not json"),
    ("POST", "/v1/check/alice", None),
    ("GET", "/nowhere", None),
    ("GET", "/healthz", None),
]


def comparable(status: int, headers: dict[str, str], body: Any) -> tuple[Any, ...]:
    headers = {name.lower(): value for name, value in headers.items()}
    results = body.get("results", [body]) if isinstance(body, dict) else []
    for result in results:
        if isinstance(result, dict) and result.get("retry_after_ms"):
            # Both wait ~1000 s for one credit; they asked a few ms apart.
            result["retry_after_ms"] = round(result["retry_after_ms"], -3)
    kept = {name: headers.get(name) for name in COMPARED_HEADERS}
    if kept["ratelimit"]:
        kept["ratelimit"] = re.sub(r";t=\d+", ";t=?", kept["ratelimit"])
    if kept["retry-after"]:
        kept["retry-after"] = str(round(int(kept["retry-after"]), -3))
    return status, kept, body


def test_same_answers_and_headers_as_sluicegate_local(reference: Local, router: ModuleType) -> None:
    for method, path, body in REQUESTS:
        expected = comparable(*reference.request(method, path, body))
        got = comparable(*invoke(router, method, path, body))
        assert got == expected, f"{method} {path}"


def test_a_stopped_partition_gets_the_same_fallback(
    reference: Local, backend: Local, router: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = "zed"
    index = router.client.partition(key)
    lookups: list[str] = []
    resolve = router.directory._resolve
    monkeypatch.setattr(router.directory, "_resolve", lambda host, port: lookups.append(host) or resolve(host, port))
    frozen = [reference.partition_pid(index), backend.partition_pid(index)]
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    try:
        expected = reference.request("GET", f"/v1/check/{key}")
        got = invoke(router, "GET", f"/v1/check/{key}")
        assert lookups == []  # within the TTL: no lookups
        other = next(k for k in ("a", "b", "c", "d", "e") if router.client.partition(k) != index)
        healthy = invoke(router, "GET", f"/v1/check/{other}")
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
    assert expected[2]["fallback"] is True and expected[0] == 200  # fail-open by default
    assert comparable(*got) == comparable(*expected)
    assert healthy[0] == 200 and healthy[2]["fallback"] is False
    # The partition may have moved: the names were looked up again before the next invocation.
    assert len(lookups) == 3


def test_acquire_and_release_through_the_router(router: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    answer = router.handler(event("alb_post_acquire"), LambdaContext())  # {"key":"pool","ttl_ms":5000}, base64
    assert answer["statusCode"] == 200
    acquired = json.loads(answer["body"])
    assert acquired["allowed"] is True and acquired["capacity"] == 1 and isinstance(acquired["lease"], int)
    status, headers, body = invoke(router, "POST", "/v1/acquire", b'{"key":"pool"}')
    assert status == 429 and body["limit"] == "inflight" and "retry-after" in headers
    release = json.dumps({"key": "pool", "lease": acquired["lease"], "service_ms": 20}).encode()
    assert invoke(router, "POST", "/v1/release", release)[2] == {
        "key": "pool",
        "lease": acquired["lease"],
        "released": True,
        "concurrency": 1,
    }
    status, _, body = invoke(router, "POST", "/v1/release", release)
    assert status == 409 and body["released"] is False
    assert invoke(router, "GET", "/v1/acquire")[0] == 405
    documents = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith('{"_aws"')]
    assert sum(sum(doc.get("Checks", [0])) for doc in documents) == 2  # acquires are counted as decisions
    assert sum(sum(doc.get("Denied", [0])) for doc in documents) == 1


def test_a_held_request_is_cut_to_the_invocations_time_left(router: ModuleType) -> None:
    lease = invoke(router, "POST", "/v1/acquire", b'{"key":"pool"}')[2]["lease"]
    short = LambdaContext()
    short.get_remaining_time_in_millis = lambda: 1_000  # type: ignore[method-assign]
    waiting = event("alb_get_check", httpMethod="POST", path="/v1/acquire", body='{"key":"pool","max_wait_ms":60000}')
    started = time.monotonic()
    answer = router.handler(waiting, short)
    # Held at most 1000 ms less the retry budget and a margin, then denied: not for the 60 s asked.
    assert answer["statusCode"] == 429 and json.loads(answer["body"])["limit"] == "inflight"
    assert time.monotonic() - started < 1.0  # answered within the time the invocation had left
    assert invoke(router, "POST", "/v1/release", json.dumps({"key": "pool", "lease": lease}).encode())[0] == 200


def test_metrics_are_valid_emf_and_count_the_decisions(router: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    invoke(router, "POST", "/v1/check", b'{"checks":[{"key":"m1"},{"key":"m1","cost":3},{"key":"m2"}]}')
    documents = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    emf = [doc for doc in documents if "_aws" in doc]
    assert len(emf) == 1
    assert_valid_emf(emf[0])
    assert emf[0]["_aws"]["CloudWatchMetrics"][0]["Namespace"] == "Sluicegate"
    names = ("Checks", "Allowed", "Denied", "Fallbacks", "PartitionErrors", "WouldDeny")
    counts = {name: sum(emf[0][name]) for name in names}
    assert counts == {"Checks": 3, "Allowed": 2, "Denied": 1, "Fallbacks": 0, "PartitionErrors": 0, "WouldDeny": 0}
    assert emf[0]["CheckLatency"][0] > 0
    assert emf[0]["service"] == "sluicegate-router"


def test_logs_carry_the_alb_trace_id_as_correlation_id(router: ModuleType) -> None:
    logs = io.StringIO()
    router.logger.registered_handler.setStream(logs)
    recorded = event("alb_post_check")
    answer = router.handler(recorded, LambdaContext())
    assert answer["statusCode"] == 200
    assert json.loads(answer["body"])["results"][0]["remaining"] == 3  # alice 5, cost 2 (base64 body decoded)
    router.logger.info("after")
    after = json.loads(logs.getvalue().splitlines()[-1])
    assert after["message"] == "after"
    assert after["correlation_id"] == recorded["headers"]["x-amzn-trace-id"]
    assert after["function_request_id"] == LambdaContext.aws_request_id


def test_partition_names_are_resolved(load_function, backend: Local) -> None:  # type: ignore[no-untyped-def]
    named = ",".join(address.replace("127.0.0.1", "localhost") for address in backend.partitions)
    router = load_function("router", SLUICEGATE_PARTITION_ADDRESSES=named, SLUICEGATE_PARTITIONS="3", **DEFAULTS)
    status, _, body = invoke(router, "GET", "/v1/check/alice")
    assert status == 200 and body["fallback"] is False and body["remaining"] == 4


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "SLUICEGATE_NAMESPACE"),
        ({"SLUICEGATE_PARTITION_ADDRESSES": "p0.local"}, "expected HOST:PORT"),
        ({"SLUICEGATE_NAMESPACE": "x.internal", "SLUICEGATE_TIMEOUT_MS": "soon"}, "SLUICEGATE_TIMEOUT_MS"),
        ({"SLUICEGATE_NAMESPACE": "x.internal", "SLUICEGATE_FALLBACK": "maybe"}, "SLUICEGATE_FALLBACK"),
    ],
)
def test_bad_settings_fail_the_cold_start_with_a_clear_error(load_function, env: dict[str, str], message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(Exception, match=message):
        load_function("router", **env)


def test_cloud_map_names_that_do_not_resolve_fall_back(load_function) -> None:  # type: ignore[no-untyped-def]
    router = load_function(
        "router",
        SLUICEGATE_NAMESPACE="sluicegate.invalid",
        SLUICEGATE_PARTITIONS="2",
        SLUICEGATE_TIMEOUT_MS="20",
        SLUICEGATE_FALLBACK="deny",
    )
    assert router.directory.endpoints == [("p0.sluicegate.invalid", 7000), ("p1.sluicegate.invalid", 7000)]
    status, headers, body = invoke(router, "GET", "/v1/check/alice")
    assert status == 429 and body["fallback"] is True and headers["retry-after"] == "1"


def assert_valid_emf(document: dict[str, Any]) -> None:
    """The CloudWatch Embedded Metric Format specification's rules for one log event."""
    meta = document["_aws"]
    assert isinstance(meta["Timestamp"], int) and meta["Timestamp"] > 1_600_000_000_000
    directives = meta["CloudWatchMetrics"]
    assert isinstance(directives, list) and directives
    units = {"Seconds", "Microseconds", "Milliseconds", "Bytes", "Count", "Percent", "None", "Count/Second"}
    for directive in directives:
        assert isinstance(directive["Namespace"], str) and 1 <= len(directive["Namespace"]) <= 1024
        for dimension_set in directive["Dimensions"]:
            assert len(dimension_set) <= 30
            for name in dimension_set:
                assert isinstance(document[name], str)  # dimension values are strings at the root
        assert 1 <= len(directive["Metrics"]) <= 100
        for metric in directive["Metrics"]:
            value = document[metric["Name"]]
            values = value if isinstance(value, list) else [value]
            assert all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
            assert metric.get("Unit", "None") in units
