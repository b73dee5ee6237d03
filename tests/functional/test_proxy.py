"""`sluicegate proxy` in front of a real upstream app, with `sluicegate local` deciding: classification,
refusals, the fields it adds and drops, kept-alive upstream connections and upstream failures."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluicegate import cli
from sluicegate.config import Config, ConfigError
from sluicegate.proxy import command as proxy_command
from tests.conftest import child_env, read_until, stop
from tests.functional.proxy_stack import (
    Service,
    quota,
    remaining,
    request,
    start_local,
    start_proxy,
    start_upstream,
    upstream_stats,
)

RULES = """
rules:
  - {key: "tenant:*", capacity: 2, rate: 0.01}
  - {key: "upload:*", capacity: 7, rate: 0.01}
  - {key: office, capacity: 1, rate: 0.01}
  - {key: "ip:*", capacity: 2, rate: 0.01}
"""
POLICY = """
classes:
  - name: plumbing
    match: {path: [/stats, "/open/*"]}
    mode: pass
  - name: uploads
    match: {method: [POST, PUT], path: "/upload/*"}
    key: "upload:{header:x-tenant}"
    cost: 3
  - name: office
    match: {host: "office.*", client_ip: 127.0.0.0/8}
    key: office
  - name: tenants
    match: {headers: {x-tenant: "*"}}
    key: "tenant:{header:x-tenant}"
  - name: per-ip
    match: {headers: {x-test: per-ip}}
    key: "ip:{client_ip}"
    status: 503
default:
  key: "open:{path}"
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Service, Service, Service, str]]:
    """(upstream, quota service, proxy, partitions); keys without a rule have room for a million requests."""
    tmp = tmp_path_factory.mktemp("proxy")
    upstream = start_upstream()
    local, partitions = start_local(
        tmp, RULES, SLUICEGATE_DEFAULT_CAPACITY="1000000", SLUICEGATE_DEFAULT_RATE="1000000"
    )
    proxy = start_proxy(tmp, f"http://127.0.0.1:{upstream.port}", POLICY, partitions, "--upstream-timeout", "1")
    yield upstream, local, proxy, partitions
    for service in (proxy, local, upstream):
        service.stop()


@pytest.fixture(scope="module")
def proxy_port(stack: tuple[Service, Service, Service, str]) -> int:
    return stack[2].port


def test_each_request_is_charged_to_the_key_and_cost_of_the_first_class_that_matches(proxy_port: int) -> None:
    acme = {"x-tenant": "acme"}
    # tenants: one bucket of 2 per tenant, cost 1.
    answers = [request(proxy_port, "GET", "/things", headers=acme) for _ in range(2)]
    assert [status for status, _, _ in answers] == [200, 200]
    assert [(quota(h), remaining(h)) for _, h, _ in answers] == [(2, 1), (2, 0)]
    assert json.loads(answers[0][2]) == {"path": "/things"}  # the upstream's own answer
    status, headers, _ = request(proxy_port, "GET", "/things", headers={"x-tenant": "beta"})
    assert (status, quota(headers), remaining(headers)) == (200, 2, 1)  # another tenant, another bucket
    # uploads come first in the policy: a POST to /upload/ of acme spends upload:acme, 3 at a time.
    uploads = [request(proxy_port, "POST", "/upload/a", headers=acme, body=b"data") for _ in range(3)]
    assert [status for status, _, _ in uploads] == [200, 200, 429]
    assert [(quota(h), remaining(h)) for _, h, _ in uploads[:2]] == [(7, 4), (7, 1)]
    assert json.loads(uploads[0][2]) == {"path": "/upload/a", "received": 4}
    # A GET to /upload/ is no upload: it is acme's, and acme has nothing left.
    assert request(proxy_port, "GET", "/upload/a", headers=acme)[0] == 429
    # office (by Host glob and client network) is tried before tenants.
    office = {"host": "office.example.com:8080", "x-tenant": "gamma"}
    assert [request(proxy_port, "GET", "/", headers=office)[0] for _ in range(2)] == [200, 429]
    # Requests no class matches get the default class: a key per path, here with room to spare.
    status, headers, _ = request(proxy_port, "GET", "/public")
    assert (status, headers["ratelimit-policy"]) == (200, '"default";q=1000000;w=1')
    # mode pass: forwarded without a check, so without RateLimit fields.
    status, headers, _ = request(proxy_port, "GET", "/stats")
    assert status == 200 and "ratelimit" not in headers


def test_a_refused_request_gets_429_with_retry_after_and_json_and_keeps_its_connection(proxy_port: int) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", proxy_port, timeout=10)
    headers = {"x-tenant": "delta"}
    statuses = []
    for _ in range(3):
        conn.request("POST", "/submit", body=b"x" * 1000, headers=headers)
        response = conn.getresponse()
        statuses.append(response.status)
        body = response.read()
    assert statuses == [200, 200, 429]
    assert response.getheader("Retry-After") == "100"  # one credit at 0.01/s
    assert response.getheader("RateLimit") == '"key";r=0;t=200'
    assert response.getheader("RateLimit-Policy") == '"key";q=2;w=200'
    assert json.loads(body) == {"error": "too many requests", "retry_after": 100}
    conn.request("GET", "/stats")  # the refused request's body was read: the connection still works
    assert conn.getresponse().status == 200
    conn.close()


def test_a_class_may_refuse_with_503(proxy_port: int) -> None:
    answers = [request(proxy_port, "GET", "/ip", headers={"x-test": "per-ip"}) for _ in range(3)]
    assert [status for status, _, _ in answers] == [200, 200, 503]
    status, headers, body = answers[2]
    assert headers["retry-after"] == "100" and quota(headers) == 2
    assert json.loads(body)["error"] == "service unavailable: over its limit"


def test_a_key_that_cannot_be_built_gets_400(proxy_port: int) -> None:
    status, _, body = request(proxy_port, "GET", "/", headers={"x-tenant": "t" * 300})
    assert status == 400
    assert "cannot build a key" in json.loads(body)["error"]


def test_hop_by_hop_fields_are_dropped_and_forwarding_fields_added(proxy_port: int) -> None:
    headers = {
        "Host": "shop.example",
        "Connection": "keep-alive, X-Drop-Me",
        "X-Drop-Me": "1",
        "Keep-Alive": "timeout=5",
        "TE": "trailers",
        "Upgrade": "websocket",
        "X-Forwarded-For": "203.0.113.9",
        "X-Forwarded-Proto": "https",
        "X-Kept": "yes",
    }
    status, response_headers, body = request(proxy_port, "GET", "/headers?a=1", headers=headers)
    assert status == 200
    seen = json.loads(body)
    fields = {name.lower(): value for name, value in seen["headers"]}
    assert seen["target"] == "/headers?a=1"
    assert fields["host"] == "shop.example" and fields["x-kept"] == "yes"
    for dropped in ("connection", "x-drop-me", "keep-alive", "te", "upgrade"):
        assert dropped not in fields
    assert fields["x-forwarded-for"] == "203.0.113.9, 127.0.0.1"
    assert fields["x-forwarded-proto"] == "http"
    assert fields["x-forwarded-host"] == "shop.example"
    assert fields["via"] == "1.1 sluicegate"
    # The upstream's own hop-by-hop fields stay between it and the proxy.
    assert "x-private" not in response_headers and "keep-alive" not in response_headers
    assert response_headers["content-type"] == "application/json"


def test_upstream_connections_are_kept_alive_and_reused(stack: tuple[Service, Service, Service, str]) -> None:
    upstream, _, proxy, _ = stack
    before = upstream_stats(upstream.port)
    for index in range(20):  # each on a new client connection
        assert request(proxy.port, "GET", f"/page/{index}")[0] == 200
    after = upstream_stats(upstream.port)
    assert after["requests"] - before["requests"] == 20 + 1  # and the first /stats
    assert after["connections"] - before["connections"] <= 2  # our /stats calls; the proxy's are pooled


def test_an_upstream_that_does_not_answer_in_time_gets_504(proxy_port: int) -> None:
    status, _, body = request(proxy_port, "GET", "/slow?ms=3000")
    assert status == 504
    assert json.loads(body) == {"error": "the upstream did not answer in time"}


def test_an_unreachable_upstream_gets_502(tmp_path: Path, stack: tuple[Service, Service, Service, str]) -> None:
    with socket.socket() as placeholder:
        placeholder.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        port = placeholder.getsockname()[1]
        proxy = start_proxy(tmp_path, f"http://127.0.0.1:{port}", POLICY, stack[3])
        try:
            status, _, body = request(proxy.port, "GET", "/anything")
        finally:
            proxy.stop()
    assert status == 502
    assert json.loads(body)["error"].startswith(f"upstream 127.0.0.1:{port} unreachable")


def test_a_bad_policy_is_refused_with_its_file_line_and_field(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("classes:\n  - match: {path: /a}\n    key: 'k:{client_ip}'\n    mode: lease\n")
    code = cli.main(
        ["proxy", "--upstream", "http://127.0.0.1:9", "--policy", str(policy), "--partitions", "127.0.0.1:9"]
    )
    assert code == 2
    assert capsys.readouterr().err.strip() == (
        f"sluicegate: {policy}:4: classes[0].mode: must be one of check, acquire, pass, got 'lease'"
    )


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
        (b"POST /a HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n", 400),
        (b"GET /a HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
        (b"GET /a HTTP/1.1\r\nHost: t\r\nX-Folded: a\r\n b\r\n\r\n", 400),
        (b"POST /a HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501),
        (b"GET /a HTTP/1.1\r\nHost: t\r\nX-Big: " + b"x" * 20000 + b"\r\n\r\n", 431),
        (b"CONNECT t:443 HTTP/1.1\r\nHost: t:443\r\n\r\n", 405),
    ],
)
def test_an_ambiguous_or_malformed_request_is_refused_and_its_connection_closed(
    proxy_port: int, head: bytes, status: int
) -> None:
    with socket.create_connection(("127.0.0.1", proxy_port), timeout=10) as sock:
        sock.sendall(head)
        received = b""
        while piece := sock.recv(65536):  # read to the end: the proxy closes the connection
            received += piece
    assert received.startswith(b"HTTP/1.1 %d " % status)
    assert b"Connection: close" in received


def test_partitions_may_come_from_the_environment(tmp_path: Path, stack: tuple[Service, Service, Service, str]) -> None:
    upstream, _, _, partitions = stack
    policy = tmp_path / "policy.yaml"
    policy.write_text("default: {key: 'tenant:{header:x-tenant}'}\n")
    command = [sys.executable, "-m", "sluicegate.cli", "proxy", "--upstream", f"http://127.0.0.1:{upstream.port}"]
    command += ["--listen", "127.0.0.1:0", "--policy", str(policy)]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=child_env(SLUICEGATE_PARTITION_ADDRESSES=partitions),
    )
    try:
        port = int(read_until(process, r"sluicegate proxy: http://127\.0\.0\.1:(\d+)")[0].group(1))
        statuses = [request(port, "GET", "/", headers={"x-tenant": "env"})[0] for _ in range(3)]
    finally:
        stop(process)
    assert statuses == [200, 200, 429]  # tenant:* has room for 2: the checks reached the partitions


def test_namespace_names_partition_i_as_p_i() -> None:
    parser = cli._parser(Config())
    args = parser.parse_args(["proxy", "--upstream", "http://u", "--policy", "p", "--namespace", "ns.internal"])
    args.partition_count = 3
    assert proxy_command._endpoints(args, Config()) == (
        [("p0.ns.internal", 7000), ("p1.ns.internal", 7000), ("p2.ns.internal", 7000)],
        True,
    )
    args.partitions = "127.0.0.1:1"
    with pytest.raises(ConfigError, match="not both"):
        proxy_command._endpoints(args, Config())
