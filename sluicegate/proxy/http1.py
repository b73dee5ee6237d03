"""HTTP/1.1 message framing for a proxy: heads parsed whole, bodies streamed piece by piece.

A head (start line and header fields) is read whole, up to the stream's limit
(16 KiB: more gets 431). A body is never held whole: :class:`BodyReader`
yields pieces of at most 64 KiB as they arrive, for a ``Content-Length``, a
chunked or a close-delimited body (RFC 9112 6.3), and :class:`BodyWriter`
frames them again (``Content-Length`` as is, or chunked). Anything ambiguous
that could smuggle a request (both ``Transfer-Encoding`` and
``Content-Length``, differing lengths, a malformed chunk size, an obsolete
line folding) is a :class:`ProtocolError`, and the connection closes.

Example:
    >>> head = parse_request_head(b"POST /up HTTP/1.1\\r\\nHost: a\\r\\nContent-Length: 5\\r\\n\\r\\n")
    >>> head.method, head.target, head.get("content-length"), request_framing(head)
    ('POST', '/up', '5', Framing(kind='length', length=5))
"""

from __future__ import annotations

import asyncio
import re
from typing import NamedTuple

MAX_HEAD_BYTES = 16 * 1024  # the StreamReader limit: a head (or chunk-size line) longer than this gets 431
PIECE = 64 * 1024
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,15}")


class ProtocolError(Exception):
    """A message we cannot frame; ``status`` is what the client gets (before the connection closes)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class BodyError(Exception):
    """A body that ended early or is badly framed (the peer's fault; the connection is unusable)."""


class Framing(NamedTuple):
    """How a body is delimited: ``none``, ``length`` (with ``length``), ``chunked`` or ``close``."""

    kind: str
    length: int = 0


NO_BODY = Framing("none")
CHUNKED = Framing("chunked")
UNTIL_CLOSE = Framing("close")


class Head:
    """Header fields in order, with their names as sent, and indexed by lower-case name."""

    __slots__ = ("by_name", "fields")

    def __init__(self, fields: list[tuple[str, str]]) -> None:
        self.fields = fields
        self.by_name: dict[str, list[str]] = {}
        for name, value in fields:
            self.by_name.setdefault(name.lower(), []).append(value)

    def values(self, name: str) -> list[str]:
        """Every value of the field ``name`` (lower-case), in order."""
        return self.by_name.get(name, [])

    def get(self, name: str) -> str | None:
        """All values of ``name`` (lower-case) joined with ``, `` (RFC 9110 5.3), or None if absent."""
        found = self.by_name.get(name)
        return ", ".join(found) if found else None

    def tokens(self, name: str) -> set[str]:
        """The comma-separated tokens of ``name``, lower-case (``Connection: close, TE`` -> {close, te})."""
        found = self.by_name.get(name)
        if not found:
            return set()
        return {token.strip().lower() for value in found for token in value.split(",") if token.strip()}

    def lower_map(self) -> dict[str, str]:
        """Lower-case name -> all its values joined."""
        return {name: ", ".join(values) for name, values in self.by_name.items()}

    def _persistent(self, version: str) -> bool:
        connection = self.tokens("connection")
        return "close" not in connection if version == "HTTP/1.1" else "keep-alive" in connection


class RequestHead(Head):
    __slots__ = ("method", "target", "version")

    def __init__(self, fields: list[tuple[str, str]], method: str, target: str, version: str) -> None:
        super().__init__(fields)
        self.method = method
        self.target = target
        self.version = version

    @property
    def keep_alive(self) -> bool:
        """Whether the client wants the connection kept after this exchange."""
        return self._persistent(self.version)


class ResponseHead(Head):
    __slots__ = ("reason", "status", "version")

    def __init__(self, fields: list[tuple[str, str]], version: str, status: int, reason: str) -> None:
        super().__init__(fields)
        self.version = version
        self.status = status
        self.reason = reason

    @property
    def reusable(self) -> bool:
        """Whether the upstream keeps the connection open after this response."""
        return self._persistent(self.version)


async def read_head(reader: asyncio.StreamReader) -> bytes | None:
    """The next head's bytes (up to and with its blank line), None on a clean end of stream."""
    while True:
        try:
            data = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            if not exc.partial.strip():
                return None
            raise ProtocolError(400, "the connection closed inside a message head") from exc
        except asyncio.LimitOverrunError as exc:
            raise ProtocolError(431, f"message head larger than {MAX_HEAD_BYTES} bytes") from exc
        # Empty lines before a request line are allowed (RFC 9112 2.2): some clients send CRLF after a body.
        data = data.lstrip(b"\r\n")
        if data:
            return data


def _fields(lines: list[str]) -> list[tuple[str, str]]:
    fields = []
    for line in lines:
        if not line:
            continue
        if line[0] in " \t":
            raise ProtocolError(400, "obsolete line folding in a header field")
        name, colon, value = line.partition(":")
        if not colon or not _TOKEN.fullmatch(name):
            raise ProtocolError(400, f"malformed header field line {line[:60]!r}")
        fields.append((name, value.strip(" \t")))
    return fields


def parse_request_head(data: bytes) -> RequestHead:
    lines = data.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]) or not parts[1]:
        raise ProtocolError(400, "malformed request line")
    if parts[2] not in ("HTTP/1.1", "HTTP/1.0"):
        raise ProtocolError(505, f"HTTP version {parts[2][:20]!r} not supported: use HTTP/1.1")
    return RequestHead(_fields(lines[1:]), parts[0], parts[1], parts[2])


def parse_response_head(data: bytes) -> ResponseHead:
    lines = data.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    code, _, reason = rest.partition(" ")
    if not version.startswith("HTTP/1.") or len(code) != 3 or not code.isdigit():
        raise ProtocolError(502, "the upstream sent a malformed status line")
    return ResponseHead(_fields(lines[1:]), version, int(code), reason)


def _content_length(head: Head) -> int | None:
    values = {value.strip() for item in head.values("content-length") for value in item.split(",")}
    if not values:
        return None
    if len(values) != 1:
        raise ProtocolError(400, "differing Content-Length values")
    value = values.pop()
    if not (value.isascii() and value.isdigit()) or len(value) > 18:
        raise ProtocolError(400, f"bad Content-Length {value[:20]!r}")
    return int(value)


def request_framing(head: RequestHead) -> Framing:
    """How the request's body is delimited (RFC 9112 6.3); ProtocolError if it is ambiguous."""
    codings = head.values("transfer-encoding")
    if codings:
        if head.values("content-length"):
            raise ProtocolError(400, "both Transfer-Encoding and Content-Length")
        if head.version != "HTTP/1.1":
            raise ProtocolError(400, "Transfer-Encoding in an HTTP/1.0 request")
        if [token.strip().lower() for value in codings for token in value.split(",")] != ["chunked"]:
            raise ProtocolError(501, "only the chunked transfer coding is supported")
        return CHUNKED
    length = _content_length(head)
    return NO_BODY if not length else Framing("length", length)


def response_framing(head: ResponseHead, request_method: str) -> Framing:
    """How the upstream's response body is delimited (RFC 9112 6.3)."""
    if request_method == "HEAD" or head.status < 200 or head.status in (204, 304):
        return NO_BODY
    codings = head.tokens("transfer-encoding")
    if codings:
        last = head.values("transfer-encoding")[-1].split(",")[-1].strip().lower()
        return CHUNKED if last == "chunked" else UNTIL_CLOSE
    try:
        length = _content_length(head)
    except ProtocolError as exc:
        raise ProtocolError(502, f"the upstream sent a bad Content-Length ({exc})") from exc
    if length is None:
        return UNTIL_CLOSE
    return Framing("length", length) if length else NO_BODY


class BodyReader:
    """The pieces of one body as they arrive; :meth:`read` returns ``b""`` at its end.

    ``trailers`` holds a chunked body's trailer section (raw lines) once read.
    """

    def __init__(self, reader: asyncio.StreamReader, framing: Framing) -> None:
        self.reader = reader
        self.kind = framing.kind
        self.left = framing.length  # bytes left in the body (length) or in the current chunk (chunked)
        self.done = framing.kind == "none"
        self.trailers = b""
        self._in_chunk = False

    async def read(self) -> bytes:
        if self.done:
            return b""
        if self.kind == "close":
            data = await self.reader.read(PIECE)
            self.done = not data
            return data
        if self.kind == "chunked" and not self.left:
            await self._next_chunk()
            if self.done:
                return b""
        data = await self.reader.read(min(self.left, PIECE))
        if not data:
            raise BodyError("the connection closed inside a body")
        self.left -= len(data)
        if not self.left and self.kind == "length":
            self.done = True
        return data

    async def _next_chunk(self) -> None:
        try:
            if self._in_chunk and await self.reader.readexactly(2) != b"\r\n":
                raise BodyError("chunk data not followed by CRLF")
            line = await self.reader.readuntil(b"\r\n")
            size = line[:-2].split(b";", 1)[0].rstrip(b" \t")
            if not _CHUNK_SIZE.fullmatch(size):
                raise BodyError(f"bad chunk size line {line[:40]!r}")
            self.left = int(size, 16)
            self._in_chunk = True
            if not self.left:
                trailers = []
                while (line := await self.reader.readuntil(b"\r\n")) != b"\r\n":
                    trailers.append(line)
                    if sum(map(len, trailers)) > MAX_HEAD_BYTES:
                        raise BodyError("trailer section too large")
                self.trailers = b"".join(trailers)
                self.done = True
        except asyncio.IncompleteReadError as exc:
            raise BodyError("the connection closed inside a chunked body") from exc
        except asyncio.LimitOverrunError as exc:
            raise BodyError("a chunk-size line is too long") from exc


class BodyWriter:
    """Writes body pieces framed as the head announced: raw, or chunked (``chunked=True``)."""

    def __init__(self, writer: asyncio.StreamWriter, *, chunked: bool) -> None:
        self.writer = writer
        self.chunked = chunked

    def write(self, data: bytes) -> None:
        if not data:
            return  # an empty chunk would end a chunked body
        if self.chunked:
            self.writer.writelines((b"%x\r\n" % len(data), data, b"\r\n"))
        else:
            self.writer.write(data)

    def finish(self, trailers: bytes = b"") -> None:
        if self.chunked:
            self.writer.write(b"0\r\n" + trailers + b"\r\n")


def encode_head(start_line: str, fields: list[tuple[str, str]]) -> bytes:
    lines = [start_line, *(f"{name}: {value}" for name, value in fields)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
