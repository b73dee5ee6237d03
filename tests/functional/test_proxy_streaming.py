"""Bodies through `sluicegate proxy`: 20 MB each way while it is still being sent, chunked and
Content-Length framing, trailers, HTTP/1.0 clients and ``Expect: 100-continue``."""

from __future__ import annotations

import hashlib
import http.client
import os
import socket
import threading
from collections.abc import Iterator

import pytest

from tests.functional.proxy_stack import Service, request, start_local, start_proxy, start_upstream

SIZE = 20 * 1024 * 1024
FIRST = 1024 * 1024
POLICY = "default: {key: 'ip:{client_ip}'}\n"
GROWTH_LIMIT = SIZE // 4  # the proxy's peak memory may grow by far less than a body


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Service, Service]]:
    """(upstream, proxy); every request is checked, and has room."""
    tmp = tmp_path_factory.mktemp("stream")
    upstream = start_upstream()
    local, partitions = start_local(
        tmp, "rules: []\n", SLUICEGATE_DEFAULT_CAPACITY="100000", SLUICEGATE_DEFAULT_RATE="1"
    )
    proxy = start_proxy(tmp, f"http://127.0.0.1:{upstream.port}", POLICY, partitions)
    yield upstream, proxy
    for service in (proxy, local, upstream):
        service.stop()


def _upload_while_reading(proxy: Service, head: bytes, pieces: list[bytes]) -> tuple[http.client.HTTPResponse, bytes]:
    """Send ``head`` and the first piece; read the answer's first bytes *before* sending the rest (which a
    proxy buffering the request whole would never answer); then send the rest while reading everything."""
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=15)
    sock.sendall(head + pieces[0])
    response = http.client.HTTPResponse(sock)
    response.begin()
    first = response.read(1000)
    assert len(first) == 1000, "the upload's echo did not start while the upload was under way"
    sender = threading.Thread(target=lambda: [sock.sendall(piece) for piece in pieces[1:]])
    sender.start()
    rest = response.read()
    sender.join()
    sock.close()
    return response, first + rest


def test_a_20_mb_upload_streams_through_both_ways_while_it_is_sent(stack: tuple[Service, Service]) -> None:
    _, proxy = stack
    body = os.urandom(SIZE)
    proxy.reset_peak_memory()
    before = proxy.vm("VmRSS")
    head = b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % SIZE
    response, echoed = _upload_while_reading(proxy, head, [body[:FIRST], body[FIRST:]])
    assert response.status == 200 and response.getheader("RateLimit") is not None
    assert hashlib.sha256(echoed).digest() == hashlib.sha256(body).digest()
    assert proxy.vm("VmHWM") - before < GROWTH_LIMIT


def test_a_chunked_20_mb_upload_streams_through(stack: tuple[Service, Service]) -> None:
    _, proxy = stack
    body = os.urandom(SIZE)
    pieces = [body[i : i + FIRST] for i in range(0, SIZE, FIRST)]
    chunks = [b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces]
    chunks[-1] += b"0\r\n\r\n"
    proxy.reset_peak_memory()
    before = proxy.vm("VmRSS")
    head = b"PUT /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
    response, echoed = _upload_while_reading(proxy, head, chunks)
    assert response.status == 200
    assert hashlib.sha256(echoed).digest() == hashlib.sha256(body).digest()
    assert proxy.vm("VmHWM") - before < GROWTH_LIMIT


def test_a_20_mb_download_streams_with_its_content_length(stack: tuple[Service, Service]) -> None:
    _, proxy = stack
    proxy.reset_peak_memory()
    before = proxy.vm("VmRSS")
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=15)
    conn.request("GET", "/big?mb=20")
    response = conn.getresponse()
    assert response.getheader("Content-Length") == str(SIZE)
    received = 0
    while piece := response.read(256 * 1024):
        assert piece == b"x" * len(piece)
        received += len(piece)
    conn.close()
    assert received == SIZE
    assert proxy.vm("VmHWM") - before < GROWTH_LIMIT


def test_a_chunked_response_passes_piece_by_piece_with_its_trailer(stack: tuple[Service, Service]) -> None:
    upstream, proxy = stack
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=15)
    sock.sendall(b"GET /stream?gate=g1 HTTP/1.1\r\nHost: t\r\n\r\n")
    reader = sock.makefile("rb")
    head = []
    while (line := reader.readline()) != b"\r\n":
        head.append(line.decode().strip().lower())
    assert head[0] == "http/1.1 200 ok" and "transfer-encoding: chunked" in head
    # The first chunk arrives while the upstream is still holding back the rest of its answer.
    assert (reader.readline(), reader.readline(), reader.readline()) == (b"6\r\n", b"first\n", b"\r\n")
    assert request(upstream.port, "POST", "/open/g1")[0] == 200
    assert (reader.readline(), reader.readline(), reader.readline()) == (b"5\r\n", b"last\n", b"\r\n")
    assert (reader.readline(), reader.readline(), reader.readline()) == (b"0\r\n", b"X-Total: 2\r\n", b"\r\n")
    sock.sendall(b"GET /after HTTP/1.1\r\nHost: t\r\n\r\n")  # the connection is still in step
    assert reader.readline().startswith(b"HTTP/1.1 200")
    sock.close()


def test_an_http10_client_gets_a_chunked_answer_unchunked_and_then_the_end(stack: tuple[Service, Service]) -> None:
    upstream, proxy = stack
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=15)
    sock.sendall(b"GET /stream?gate=g2 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
    assert request(upstream.port, "POST", "/open/g2")[0] == 200
    received = b""
    while piece := sock.recv(65536):  # the proxy closes the connection: that is the body's end
        received += piece
    sock.close()
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"chunked" not in head.lower()
    assert b"connection: close" in head.lower()
    assert body == b"first\nlast\n"


def test_expect_100_continue_is_relayed_before_the_body_is_sent(stack: tuple[Service, Service]) -> None:
    _, proxy = stack
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=15)
    sock.sendall(b"POST /form HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
    reader = sock.makefile("rb")
    assert reader.readline() == b"HTTP/1.1 100 Continue\r\n"
    while reader.readline() != b"\r\n":
        pass
    sock.sendall(b"hello")
    response = http.client.HTTPResponse(sock)
    response.fp = reader  # what was already read stays read
    response.begin()
    assert (response.status, response.read()) == (200, b'{"path": "/form", "received": 5}')
    sock.close()


def test_head_answers_keep_the_upstream_length_without_a_body(stack: tuple[Service, Service]) -> None:
    _, proxy = stack
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=15)
    conn.request("HEAD", "/file")
    response = conn.getresponse()
    assert (response.status, response.getheader("Content-Length"), response.read()) == (200, "1234", b"")
    conn.request("GET", "/file")  # no stray body bytes were left on the connection
    assert conn.getresponse().status == 200
    conn.close()
