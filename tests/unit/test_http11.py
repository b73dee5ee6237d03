"""The small HTTP/1.1 server: request framing, keep-alive, pipelining, over real sockets."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

import pytest

from sluicegate.router.api import HttpRequest, HttpResponse
from sluicegate.router.http import MAX_BODY_BYTES, MAX_HEADER_BYTES, FramingError, parse_request, serve_http

# ---------------------------------------------------------------------------- parse_request


def parse_all(data: bytes) -> tuple[list[tuple[HttpRequest, bool]], bytearray]:
    buffer = bytearray(data)
    parsed = []
    while (item := parse_request(buffer)) is not None:
        parsed.append(item)
    return parsed, buffer


class TestParseRequest:
    def test_simple_get(self) -> None:
        buffer = bytearray(b"GET /v1/check/alice?cost=2 HTTP/1.1\r\nHost: x\r\nX-Trace-ID:  abc \r\n\r\n")
        request, keep_alive = parse_request(buffer)  # type: ignore[misc]
        assert (request.method, request.path, request.query) == ("GET", "/v1/check/alice", "cost=2")
        assert request.headers == {"host": "x", "x-trace-id": "abc"}
        assert request.body == b""
        assert keep_alive is True
        assert buffer == b""

    def test_pipelined_requests_in_one_buffer(self) -> None:
        data = (
            b"GET /a HTTP/1.1\r\n\r\n"
            b"POST /b HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello"
            b"GET /c HTTP/1.1\r\nConnection: close\r\n\r\n"
            b"GET /d HT"
        )
        parsed, rest = parse_all(data)
        assert [(r.method, r.path, r.body, keep) for r, keep in parsed] == [
            ("GET", "/a", b"", True),
            ("POST", "/b", b"hello", True),
            ("GET", "/c", b"", False),
        ]
        assert rest == b"GET /d HT"

    def test_partial_header_is_left_in_the_buffer(self) -> None:
        data = b"POST /v1/check HTTP/1.1\r\nContent-Length: 11\r\n\r\n" + b'{"checks":1}'[:11]
        for cut in range(len(data)):
            buffer = bytearray(data[:cut])
            assert parse_request(buffer) is None
            assert buffer == data[:cut]
        buffer = bytearray(data)
        request, _ = parse_request(buffer)  # type: ignore[misc]
        assert request.body == b'{"checks":1'

    def test_body_is_exactly_content_length(self) -> None:
        buffer = bytearray(b"PUT /x HTTP/1.1\r\nContent-Length: 3\r\n\r\n")
        assert parse_request(buffer) is None
        buffer += b"ab"
        assert parse_request(buffer) is None
        buffer += b"cGET"
        request, _ = parse_request(buffer)  # type: ignore[misc]
        assert request.body == b"abc"
        assert buffer == b"GET"

    @pytest.mark.parametrize(
        ("version", "connection", "keep_alive"),
        [
            ("HTTP/1.1", None, True),
            ("HTTP/1.1", "keep-alive", True),
            ("HTTP/1.1", "close", False),
            ("HTTP/1.1", "Close", False),
            ("HTTP/1.1", "TE, close", False),
            ("HTTP/1.0", None, False),
            ("HTTP/1.0", "close", False),
            ("HTTP/1.0", "keep-alive", True),
            ("HTTP/1.0", "Keep-Alive", True),
        ],
    )
    def test_keep_alive(self, version: str, connection: str | None, keep_alive: bool) -> None:
        head = f"GET / {version}\r\n" + (f"Connection: {connection}\r\n" if connection else "") + "\r\n"
        _, keep = parse_request(bytearray(head.encode()))  # type: ignore[misc]
        assert keep is keep_alive

    def test_header_block_at_the_limit_is_accepted(self) -> None:
        start = b"GET / HTTP/1.1\r\nX-Pad: "
        head = start + b"a" * (MAX_HEADER_BYTES - len(start))
        assert len(head) == MAX_HEADER_BYTES
        assert parse_request(bytearray(head + b"\r\n\r\n")) is not None

    def test_header_block_too_large_without_end(self) -> None:
        # 431 as soon as the limit is passed, without waiting for a header block that never ends.
        buffer = bytearray(b"GET / HTTP/1.1\r\nX-Pad: " + b"a" * MAX_HEADER_BYTES)
        with pytest.raises(FramingError) as info:
            parse_request(buffer)
        assert info.value.status == 431

    def test_header_block_too_large_with_end(self) -> None:
        buffer = bytearray(b"GET / HTTP/1.1\r\nX-Pad: " + b"a" * MAX_HEADER_BYTES + b"\r\n\r\n")
        with pytest.raises(FramingError) as info:
            parse_request(buffer)
        assert info.value.status == 431

    def test_body_too_large_is_refused_before_it_arrives(self) -> None:
        buffer = bytearray(f"POST / HTTP/1.1\r\nContent-Length: {MAX_BODY_BYTES + 1}\r\n\r\n".encode())
        with pytest.raises(FramingError) as info:
            parse_request(buffer)
        assert info.value.status == 413
        body = b"x" * MAX_BODY_BYTES
        buffer = bytearray(f"POST / HTTP/1.1\r\nContent-Length: {MAX_BODY_BYTES}\r\n\r\n".encode() + body)
        request, _ = parse_request(buffer)  # type: ignore[misc]
        assert len(request.body) == MAX_BODY_BYTES

    @pytest.mark.parametrize("encoding", ["chunked", "Chunked", "gzip, chunked"])
    def test_chunked_body_needs_length(self, encoding: str) -> None:
        buffer = bytearray(f"POST / HTTP/1.1\r\nTransfer-Encoding: {encoding}\r\n\r\n5\r\nhello\r\n0\r\n\r\n".encode())
        with pytest.raises(FramingError) as info:
            parse_request(buffer)
        assert info.value.status == 411

    @pytest.mark.parametrize(
        "head",
        [
            b"GET /\r\n\r\n",
            b"GET / HTTP/1.1 extra\r\n\r\n",
            b"GET  / HTTP/1.1\r\n\r\n",
            b"GET / FTP/1.0\r\n\r\n",
            b"GET / HTTP/2\r\n\r\n",
            b"\r\n\r\n",
            b"GET / HTTP/1.1\r\nno colon here\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost : x\r\n\r\n",
            b"GET / HTTP/1.1\r\n: empty name\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: abc\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: 1 2\r\n\r\n",
            b"POST / HTTP/1.1\r\nContent-Length: \xb2\r\n\r\n",  # latin-1 superscript two: isdigit() but not a number
            b"POST / HTTP/1.1\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n",  # more digits than int() takes
        ],
        ids=lambda head: repr(head[:60]),
    )
    def test_malformed_is_400(self, head: bytes) -> None:
        with pytest.raises(FramingError) as info:
            parse_request(bytearray(head))
        assert info.value.status == 400


# ---------------------------------------------------------------------------- a real server


class Response:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)


async def read_response(reader: asyncio.StreamReader, *, head: bool = False) -> Response:
    block = await reader.readuntil(b"\r\n\r\n")
    lines = block.decode("latin-1").split("\r\n")[:-2]
    status = int(lines[0].split(" ")[1])
    assert lines[0].startswith("HTTP/1.1 ")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.lower()] = value.strip()
    length = 0 if head or status == 204 else int(headers["content-length"])
    body = await reader.readexactly(length)
    return Response(status, headers, body)


async def read_until_closed(reader: asyncio.StreamReader) -> bytes:
    return await asyncio.wait_for(reader.read(), 5)


Handler = Callable[[HttpRequest], "HttpResponse | Awaitable[HttpResponse]"]


@asynccontextmanager
async def server(handler: Handler, **options: Any) -> AsyncIterator[Callable[[], Awaitable[tuple[Any, Any]]]]:
    srv = await serve_http(handler, "127.0.0.1", 0, **options)
    host, port = srv.sockets[0].getsockname()[:2]
    assert host == "127.0.0.1"
    writers: list[asyncio.StreamWriter] = []

    async def connect() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writers.append(writer)
        return reader, writer

    try:
        yield connect
    finally:
        for writer in writers:
            writer.close()
        srv.close()
        await srv.wait_closed()


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 10))


def echo(request: HttpRequest) -> HttpResponse:
    """Answers at once with what it was asked."""
    if request.path == "/boom":
        raise RuntimeError("handler bug")
    payload = {"method": request.method, "path": request.path, "query": request.query, "body": request.body.decode()}
    return HttpResponse(200, json.dumps(payload).encode(), [("Content-Type", "application/json")])


class TestServer:
    def test_keep_alive_serves_several_requests_on_one_connection(self) -> None:
        async def main() -> None:
            async with server(echo) as connect:
                reader, writer = await connect()
                for i in range(3):
                    writer.write(f"GET /n/{i} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
                    response = await read_response(reader)
                    assert response.status == 200
                    assert response.json()["path"] == f"/n/{i}"
                    assert "connection" not in response.headers

        run(main())

    def test_pipelined_answers_keep_request_order_when_the_first_finishes_last(self) -> None:
        async def main() -> None:
            loop = asyncio.get_running_loop()
            slow: asyncio.Future[HttpResponse] = loop.create_future()
            fast_seen = asyncio.Event()

            def handler(request: HttpRequest) -> HttpResponse | Awaitable[HttpResponse]:
                if request.path == "/slow":
                    return slow
                if request.path == "/fast":
                    fast_seen.set()
                    return HttpResponse(200, b"fast")

                async def later() -> HttpResponse:
                    return HttpResponse(200, b"coroutine")

                return later()

            async with server(handler) as connect:
                reader, writer = await connect()
                writer.write(
                    b"GET /slow HTTP/1.1\r\n\r\nGET /fast HTTP/1.1\r\n\r\nGET /coro HTTP/1.1\r\n\r\n"
                    b"POST /fast HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi"
                )
                await fast_seen.wait()  # /fast is answered already; /slow is not
                slow.set_result(HttpResponse(202, b"slow"))
                bodies = [(r.status, r.body) for r in [await read_response(reader) for _ in range(4)]]
                assert bodies == [(202, b"slow"), (200, b"fast"), (200, b"coroutine"), (200, b"fast")]

        run(main())

    def test_connection_close_answers_then_closes_and_ignores_the_rest(self) -> None:
        calls: list[str] = []

        def handler(request: HttpRequest) -> HttpResponse:
            calls.append(request.path)
            return echo(request)

        async def main() -> None:
            async with server(handler) as connect:
                reader, writer = await connect()
                writer.write(b"GET /one HTTP/1.1\r\nConnection: close\r\n\r\nGET /two HTTP/1.1\r\n\r\n")
                response = await read_response(reader)
                assert response.json()["path"] == "/one"
                assert response.headers["connection"] == "close"
                assert await read_until_closed(reader) == b""
                assert calls == ["/one"]

        run(main())

    def test_http10_closes_unless_keep_alive(self) -> None:
        async def main() -> None:
            async with server(echo) as connect:
                reader, writer = await connect()
                writer.write(b"GET /a HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
                assert (await read_response(reader)).json()["path"] == "/a"
                writer.write(b"GET /b HTTP/1.0\r\n\r\n")
                response = await read_response(reader)
                assert response.json()["path"] == "/b"
                assert response.headers["connection"] == "close"
                assert await read_until_closed(reader) == b""

        run(main())

    def test_head_has_headers_but_no_body(self) -> None:
        async def main() -> None:
            async with server(echo) as connect:
                reader, writer = await connect()
                writer.write(b"HEAD /h HTTP/1.1\r\n\r\nGET /g HTTP/1.1\r\n\r\n")
                head = await read_response(reader, head=True)
                assert head.status == 200
                # The length the handler's body would have had.
                length = len(json.dumps({"method": "HEAD", "path": "/h", "query": "", "body": ""}))
                assert int(head.headers["content-length"]) == length
                # If HEAD had sent a body, it would be read here as the next status line.
                get = await read_response(reader)
                assert get.json()["path"] == "/g"

        run(main())

    def test_no_content_response_has_no_body_or_length(self) -> None:
        async def main() -> None:
            async with server(lambda request: HttpResponse(204)) as connect:
                reader, writer = await connect()
                writer.write(b"DELETE /x HTTP/1.1\r\n\r\nDELETE /y HTTP/1.1\r\nConnection: close\r\n\r\n")
                block = await read_until_closed(reader)
                first, second, rest = block.split(b"\r\n\r\n")
                assert first.startswith(b"HTTP/1.1 204 No Content")
                assert b"content-length" not in first.lower()
                assert second.startswith(b"HTTP/1.1 204 ")
                assert rest == b""

        run(main())

    @pytest.mark.parametrize(
        ("request_bytes", "status"),
        [
            (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 411),
            (f"POST / HTTP/1.1\r\nContent-Length: {MAX_BODY_BYTES + 1}\r\n\r\n".encode(), 413),
            (b"GET / HTTP/1.1\r\nX: " + b"a" * (MAX_HEADER_BYTES + 10), 431),
            (b"NONSENSE\r\n\r\n", 400),
        ],
        ids=["chunked", "body-too-large", "header-too-large", "malformed"],
    )
    def test_framing_error_answers_and_closes(self, request_bytes: bytes, status: int) -> None:
        async def main() -> None:
            async with server(echo) as connect:
                reader, writer = await connect()
                writer.write(b"GET /first HTTP/1.1\r\n\r\n" + request_bytes)
                assert (await read_response(reader)).json()["path"] == "/first"
                response = await read_response(reader)
                assert response.status == status
                assert response.headers["connection"] == "close"
                assert "error" in response.json()
                assert await read_until_closed(reader) == b""

        run(main())

    def test_handler_exception_costs_one_request_not_the_connection(self) -> None:
        async def main() -> None:
            async def failing() -> HttpResponse:
                raise ValueError("async bug")

            def handler(request: HttpRequest) -> HttpResponse | Awaitable[HttpResponse]:
                return failing() if request.path == "/async-boom" else echo(request)

            async with server(handler) as connect:
                reader, writer = await connect()
                writer.write(b"GET /boom HTTP/1.1\r\n\r\nGET /async-boom HTTP/1.1\r\n\r\nGET /ok HTTP/1.1\r\n\r\n")
                first, second, third = [await read_response(reader) for _ in range(3)]
                assert (first.status, second.status, third.status) == (500, 500, 200)
                assert "RuntimeError" in first.json()["error"]
                assert "ValueError" in second.json()["error"]
                assert third.json()["path"] == "/ok"

        run(main())

    def test_half_closed_client_still_gets_pending_answers(self) -> None:
        async def main() -> None:
            async def later(request: HttpRequest) -> HttpResponse:
                await asyncio.sleep(0)
                return HttpResponse(200, request.path.encode())

            async with server(later) as connect:
                reader, writer = await connect()
                writer.write(b"GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\n\r\n")
                writer.write_eof()
                assert (await read_response(reader)).body == b"/a"
                assert (await read_response(reader)).body == b"/b"
                assert await read_until_closed(reader) == b""

        run(main())

    def test_request_split_across_many_packets(self) -> None:
        async def main() -> None:
            async with server(echo) as connect:
                reader, writer = await connect()
                data = b"POST /split?x=1 HTTP/1.1\r\nContent-Length: 10\r\n\r\n0123456789"
                for i in range(len(data)):
                    writer.write(data[i : i + 1])
                    await writer.drain()
                response = await read_response(reader)
                assert response.json() == {"method": "POST", "path": "/split", "query": "x=1", "body": "0123456789"}

        run(main())


def test_two_content_lengths_are_rejected() -> None:
    buffer = bytearray(b"POST /v1/check HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 5\r\n\r\nabcde")
    with pytest.raises(FramingError) as raised:
        parse_request(buffer)
    assert raised.value.status == 400


class TestIdleTimeout:
    def test_partial_request_gets_408_and_the_connection_closes(self) -> None:
        async def main() -> None:
            async with server(echo, idle_timeout_s=0.3) as connect:
                reader, writer = await connect()
                writer.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n")  # never finished
                response = await asyncio.wait_for(read_response(reader), 3)
                assert response.status == 408
                assert response.headers["connection"] == "close"
                assert await read_until_closed(reader) == b""

        run(main())

    def test_trickling_headers_do_not_keep_the_connection(self) -> None:
        async def main() -> None:
            async with server(echo, idle_timeout_s=0.3) as connect:
                reader, writer = await connect()
                loop = asyncio.get_running_loop()
                start = loop.time()
                writer.write(b"GET / HTTP/1.1\r\n")
                closed = asyncio.ensure_future(read_until_closed(reader))
                for _ in range(20):  # a header line every 0.1 s: bytes arrive, but no request completes
                    if closed.done():
                        break
                    writer.write(b"X-Slow: 1\r\n")
                    await asyncio.sleep(0.1)
                assert b" 408 " in await closed
                assert loop.time() - start < 1.5

        run(main())

    def test_idle_keep_alive_connection_is_closed_without_an_answer(self) -> None:
        async def main() -> None:
            async with server(echo, idle_timeout_s=0.3) as connect:
                reader, writer = await connect()
                for i in range(3):  # requests keep it open past the timeout
                    writer.write(f"GET /n/{i} HTTP/1.1\r\n\r\n".encode())
                    assert (await read_response(reader)).status == 200
                    await asyncio.sleep(0.2)
                assert await asyncio.wait_for(reader.read(), 3) == b""

        run(main())

    def test_a_slow_answer_is_not_cut_off(self) -> None:
        async def main() -> None:
            async def slow(request: HttpRequest) -> HttpResponse:
                await asyncio.sleep(0.6)
                return HttpResponse(200, b"late")

            async with server(slow, idle_timeout_s=0.2) as connect:
                reader, writer = await connect()
                writer.write(b"GET /x HTTP/1.1\r\n\r\n")
                assert (await asyncio.wait_for(read_response(reader), 3)).body == b"late"

        run(main())


class TestShutdown:
    def test_idle_closed_at_once_in_flight_answered_then_closed(self) -> None:
        async def main() -> None:
            release = asyncio.Event()
            busy = []

            async def handler(request: HttpRequest) -> HttpResponse:
                busy.append(request)
                await release.wait()
                return HttpResponse(200, b"done")

            srv = await serve_http(handler, "127.0.0.1", 0)
            address = srv.sockets[0].getsockname()[:2]
            idle_reader, idle_writer = await asyncio.open_connection(*address)
            busy_reader, busy_writer = await asyncio.open_connection(*address)
            busy_writer.write(b"GET /x HTTP/1.1\r\n\r\n")
            while len(srv.connections) < 2 or not busy:
                await asyncio.sleep(0.01)
            shutdown = asyncio.ensure_future(srv.shutdown(grace_s=5))
            assert await read_until_closed(idle_reader) == b""  # the idle one goes first
            assert not shutdown.done()
            release.set()
            assert (await read_response(busy_reader)).body == b"done"
            assert await read_until_closed(busy_reader) == b""
            await asyncio.wait_for(shutdown, 2)
            with pytest.raises(OSError):
                await asyncio.open_connection(*address)
            for writer in (idle_writer, busy_writer):
                writer.close()

        run(main())

    def test_requests_still_running_after_the_grace_period_are_cut(self) -> None:
        async def main() -> None:
            started = asyncio.Event()

            async def never(request: HttpRequest) -> HttpResponse:
                started.set()
                await asyncio.sleep(60)
                raise AssertionError("not reached")

            srv = await serve_http(never, "127.0.0.1", 0)
            reader, writer = await asyncio.open_connection(*srv.sockets[0].getsockname()[:2])
            writer.write(b"GET /x HTTP/1.1\r\n\r\n")
            await started.wait()
            loop = asyncio.get_running_loop()
            start = loop.time()
            await srv.shutdown(grace_s=0.3)
            assert 0.25 < loop.time() - start < 2
            assert not srv.connections
            writer.close()

        run(main())
