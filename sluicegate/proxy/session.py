"""One client connection of the proxy: its requests in order, each classified, admitted and forwarded.

For each request: read its head, classify it (:class:`Policy`), admit it
(:class:`Admission`), then either refuse it (429 or 503 with ``Retry-After``
and the ``RateLimit`` fields) or forward it to the upstream over a pooled
connection. The request body is sent upstream while it arrives and the
response is read at the same time (so ``100 Continue`` and early answers get
through), and the response body goes to the client as it arrives. A refused
request's small body (up to 64 KiB) is read and dropped to keep the
connection; a larger one, or one announced with ``Expect: 100-continue``,
closes it instead.

Upstream failures before the response starts become 502 (unreachable,
closed, malformed) or 504 (no response head within the upstream timeout)
with a small JSON body; after it started, the client connection is cut (an
unfinished chunked body tells the client). A request without a body that
meets a pooled connection the upstream had closed is sent again once on a
new connection when its method is idempotent.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING

from sluicegate.headers import rate_limit_headers
from sluicegate.proxy.forward import client_response, interim_response, origin_form, upstream_request
from sluicegate.proxy.http1 import (
    PIECE,
    BodyError,
    BodyReader,
    BodyWriter,
    Framing,
    ProtocolError,
    RequestHead,
    ResponseHead,
    parse_request_head,
    parse_response_head,
    read_head,
    request_framing,
    response_framing,
)
from sluicegate.proxy.policy import ClassifyError
from sluicegate.proxy.upstream import Connection, UpstreamError
from sluicegate.proxy.view import RequestView, client_address
from sluicegate.router.api import HttpResponse, error_response
from sluicegate.router.http import encode_response

if TYPE_CHECKING:
    from sluicegate.proxy.server import ProxyServer

DRAIN_LIMIT = 64 * 1024  # a refused request's body up to this size is read (and dropped) to keep the connection
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})


class ClientGone(Exception):
    """The client's request body broke off or was malformed while it was being sent upstream."""


class _Stale(Exception):
    """A reused upstream connection closed before it answered anything."""


class Session:
    """Serves the requests of one client connection until it closes or must close."""

    def __init__(self, server: ProxyServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.server = server
        self.reader = reader
        self.writer = writer
        peer = writer.get_extra_info("peername")
        self.client_ip = str(peer[0]) if peer else "0.0.0.0"
        self.client_address = client_address(self.client_ip)
        self.idle = True
        self.loop = asyncio.get_running_loop()

    async def serve(self) -> None:
        try:
            while not self.server.closing:
                self.idle = True
                try:
                    async with asyncio.timeout(self.server.idle_timeout_s):
                        data = await read_head(self.reader)
                except TimeoutError:
                    break
                self.idle = False
                if data is None or not await self._exchange(data):
                    break
        except ProtocolError as exc:
            self.server.count("bad_requests")
            await self._send(error_response(exc.status, str(exc)), keep_alive=False)
        except (ConnectionError, ClientGone, BodyError, TimeoutError):
            pass  # the client went away or stalled: nothing more to say to it
        finally:
            self.writer.close()

    async def _exchange(self, data: bytes) -> bool:
        """One request; True if the connection may carry another."""
        arrived = self.loop.time()
        head = parse_request_head(data)
        framing = request_framing(head)
        if head.method == "CONNECT":
            raise ProtocolError(405, "CONNECT is not supported: this is a reverse proxy")
        try:
            target, authority = origin_form(head.target)
        except ValueError as exc:
            raise ProtocolError(400, str(exc)) from exc
        if len(head.values("host")) > 1:
            raise ProtocolError(400, "more than one Host field")
        headers = head.lower_map()
        if authority:
            headers["host"] = authority
        view = RequestView.build(head.method, target, headers, self.client_address)
        keep_alive = head.keep_alive and not self.server.closing
        body = BodyReader(self.reader, framing)
        qos = self.server.policy.classify(view)
        self.server.count("requests")
        if qos is None or qos.mode == "pass":
            return await self._forward(head, framing, body, keep_alive, [])
        try:
            key = qos.key_for(view)
        except ClassifyError as exc:
            self.server.count("bad_requests")
            return await self._refuse(error_response(400, str(exc)), head, body, keep_alive)
        ticket = await self.server.admission.admit(qos, key, arrived=arrived)
        decision = ticket.decision
        if not decision.allowed:
            self.server.count("refused")
            headers_out = rate_limit_headers(decision)
            retry = next((int(value) for name, value in headers_out if name == "Retry-After"), None)
            message = "too many requests" if qos.status == 429 else "service unavailable: over its limit"
            payload = json.dumps({"error": message, "retry_after": retry}, separators=(",", ":")).encode()
            response = HttpResponse(qos.status, payload, [("Content-Type", "application/json"), *headers_out])
            return await self._refuse(response, head, body, keep_alive)
        started = self.loop.time()
        try:
            return await self._forward(head, framing, body, keep_alive, rate_limit_headers(decision))
        finally:
            self.server.admission.finish(ticket, service_ms=(self.loop.time() - started) * 1000)

    async def _refuse(self, response: HttpResponse, head: RequestHead, body: BodyReader, keep_alive: bool) -> bool:
        """Answer without forwarding; read a small body first so the connection stays usable."""
        if not body.done:
            small = body.kind == "length" and body.left <= DRAIN_LIMIT
            if small and "100-continue" not in head.tokens("expect"):
                async with asyncio.timeout(self.server.idle_timeout_s):
                    while await body.read():
                        pass
            else:
                keep_alive = False
        await self._send(response, keep_alive, head.method == "HEAD")
        return keep_alive

    async def _send(self, response: HttpResponse, keep_alive: bool, head_only: bool = False) -> None:
        try:
            self.writer.write(encode_response(response, keep_alive, head_only))
            await self.writer.drain()
        except ConnectionError:
            pass

    async def _forward(
        self, head: RequestHead, framing: Framing, body: BodyReader, keep_alive: bool, extra: list[tuple[str, str]]
    ) -> bool:
        server = self.server
        upstream = server.pool.upstream
        request = upstream_request(head, framing, self.client_ip, upstream.base_path, upstream_host=upstream.authority)
        retry = framing.kind == "none" and head.method in IDEMPOTENT
        try:
            conn, response, payload, upload = await self._open(request, body, head, retry)
        except UpstreamError as exc:
            server.count("upstream_errors")
            keep_alive = keep_alive and body.done
            await self._send(error_response(exc.status, str(exc)), keep_alive, head.method == "HEAD")
            return keep_alive
        server.count("forwarded")
        try:
            reusable, keep_alive = await self._relay(conn, response, payload, head, keep_alive, extra)
        except BaseException:
            conn.close()
            _discard(upload)
            raise
        if not _sent_whole(upload):
            reusable = keep_alive = False  # the upstream answered before it had the whole body: out of step
        if reusable:
            server.pool.put(conn)
        else:
            conn.close()
        return keep_alive

    async def _open(
        self, request: bytes, body: BodyReader, head: RequestHead, retry: bool
    ) -> tuple[Connection, ResponseHead, bytes | None, asyncio.Task[bool] | None]:
        """Send the request (its body in a task), read the final response head (relaying 1xx ones) and,
        when the response body is small (up to 64 KiB with a Content-Length), that body too."""
        pool = self.server.pool
        for attempt in (1, 2):
            conn = await pool.get() if attempt == 1 else await pool.connect()
            conn.writer.write(request)
            upload = None if body.done else asyncio.ensure_future(self._upload(body, conn))
            try:
                async with asyncio.timeout(self.server.upstream_timeout_s):
                    while True:
                        response = parse_response_head(await self._next_head(conn, upload))
                        if response.status >= 200:
                            framing = response_framing(response, head.method)
                            if framing.kind == "none":
                                return conn, response, b"", upload
                            if framing.kind == "length" and framing.length <= PIECE:
                                return conn, response, await self._read_small(conn, framing.length), upload
                            return conn, response, None, upload
                        if response.status == 101:
                            raise ProtocolError(502, "the upstream switched protocols: upgrades are not supported")
                        if head.version == "HTTP/1.1":
                            self.writer.write(interim_response(response))  # 100 Continue, 103 Early Hints
            except BaseException as exc:
                conn.close()
                _discard(upload)
                if isinstance(exc, _Stale):
                    if attempt == 1 and retry:
                        continue
                    raise UpstreamError(502, "the upstream closed the connection without answering") from None
                if isinstance(exc, TimeoutError):
                    raise UpstreamError(504, "the upstream did not answer in time") from None
                if isinstance(exc, ProtocolError):
                    raise UpstreamError(502, str(exc)) from exc
                raise
        raise AssertionError("unreachable: the second attempt returns or raises")

    async def _next_head(self, conn: Connection, upload: asyncio.Task[bool] | None) -> bytes:
        """The upstream's next response head, while the upload (if any) goes on; ClientGone if it broke."""
        if upload is None or upload.done():
            if upload is not None:
                upload.result()  # raises ClientGone
            return await self._read_upstream_head(conn)
        reading = asyncio.ensure_future(self._read_upstream_head(conn))
        try:
            await asyncio.wait((reading, upload), return_when=asyncio.FIRST_COMPLETED)
            if not reading.done():
                upload.result()  # raises ClientGone; else the body is sent (or the upstream stopped reading it)
            return await reading
        finally:
            _discard(reading)

    async def _read_upstream_head(self, conn: Connection) -> bytes:
        try:
            data = await read_head(conn.reader)
        except ConnectionError:
            data = None
        if data is None:
            if conn.reused:
                raise _Stale
            raise UpstreamError(502, "the upstream closed the connection without answering")
        return data

    async def _upload(self, body: BodyReader, conn: Connection) -> bool:
        """Stream the request body upstream: True when sent whole, False if the upstream stopped taking it."""
        out = BodyWriter(conn.writer, chunked=body.kind == "chunked")
        while True:
            try:
                async with asyncio.timeout(self.server.idle_timeout_s):
                    piece = await body.read()
            except (BodyError, ConnectionError, TimeoutError) as exc:
                raise ClientGone(str(exc)) from exc
            try:
                if not piece:
                    out.finish(body.trailers)
                    await conn.writer.drain()
                    return True
                out.write(piece)
                await conn.writer.drain()
            except ConnectionError:
                return False

    async def _read_small(self, conn: Connection, length: int) -> bytes:
        try:
            return await conn.reader.readexactly(length)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            raise ProtocolError(502, "the upstream broke off its response") from exc

    async def _relay(
        self,
        conn: Connection,
        response: ResponseHead,
        payload: bytes | None,
        head: RequestHead,
        keep_alive: bool,
        extra: list[tuple[str, str]],
    ) -> tuple[bool, bool]:
        """Send the response to the client (``payload``: its whole body if already read, else streamed as it
        arrives): (upstream connection reusable, client connection kept)."""
        framing = response_framing(response, head.method)
        head_bytes, chunked, keep = client_response(
            response, framing, client_version=head.version, keep_alive=keep_alive, extra=extra
        )
        writer = self.writer
        if payload is not None:  # the common small answer: one write to the client
            writer.write(head_bytes + payload)
            await writer.drain()
            return response.reusable, keep
        writer.write(head_bytes)
        source = BodyReader(conn.reader, framing)
        out = BodyWriter(writer, chunked=chunked)
        timeout_s = self.server.upstream_timeout_s
        broke = False
        try:
            async with asyncio.timeout(timeout_s) as deadline:
                while True:
                    try:
                        piece = await source.read()
                    except (BodyError, ConnectionError):
                        broke = True
                        break
                    if not piece:
                        break
                    out.write(piece)
                    await writer.drain()  # a client that went away raises here: the session ends
                    deadline.reschedule(self.loop.time() + timeout_s)
        except TimeoutError:
            broke = True  # the upstream stalled, or the client stopped reading
        if broke:
            self.server.count("upstream_errors")
            return False, False  # cut mid-body: closing the client connection tells the client
        out.finish(source.trailers if chunked and framing.kind == "chunked" else b"")
        await writer.drain()
        return response.reusable and framing.kind != "close", keep


def _discard(task: asyncio.Task | None) -> None:
    """Cancel a task that is not done, or collect the outcome of one that is (no "never retrieved" warning)."""
    if task is None:
        return
    if not task.done():
        task.cancel()
    elif not task.cancelled():
        task.exception()


def _sent_whole(upload: asyncio.Task[bool] | None) -> bool:
    """Whether the request body (if any) reached the upstream whole; cancels an upload still running."""
    if upload is None:
        return True
    if not upload.done():
        upload.cancel()
        return False
    return not upload.cancelled() and upload.exception() is None and upload.result()
