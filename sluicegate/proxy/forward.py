"""What the proxy changes in the heads it forwards (RFC 9110 7.6), and nothing more.

Towards the upstream: hop-by-hop fields are dropped (``Connection`` and every
field it names, ``Proxy-Connection``, ``Keep-Alive``, ``TE``,
``Transfer-Encoding``, ``Upgrade``), the body is framed again, ``Via`` gets
``1.1 sluicegate``, ``X-Forwarded-For`` gets the client's address appended,
``X-Forwarded-Proto`` and ``X-Forwarded-Host`` are set (replacing what a
client sent: they are ours to say), and the target gets the upstream's base
path in front. The client's ``Host`` is kept. Towards the client: the same
hop-by-hop fields are dropped, the body is framed again for the client's
HTTP version, and the ``RateLimit`` fields of the admission are added.

Example:
    >>> from sluicegate.proxy.http1 import parse_request_head, request_framing
    >>> head = parse_request_head(b"GET /a HTTP/1.1\\r\\nHost: shop\\r\\nConnection: close, X-Secret\\r\\n"
    ...                           b"X-Secret: 1\\r\\nAccept: */*\\r\\n\\r\\n")
    >>> print(upstream_request(head, request_framing(head), "10.0.0.9", "/base").decode().replace("\\r", "").strip())
    GET /base/a HTTP/1.1
    Host: shop
    Accept: */*
    Via: 1.1 sluicegate
    X-Forwarded-For: 10.0.0.9
    X-Forwarded-Proto: http
    X-Forwarded-Host: shop
"""

from __future__ import annotations

from urllib.parse import urlsplit

from sluicegate.proxy.http1 import Framing, Head, RequestHead, ResponseHead, encode_head

HOP_BY_HOP = frozenset({"connection", "proxy-connection", "keep-alive", "te", "transfer-encoding", "upgrade"})
# Fields the proxy sets itself (framing, forwarding): never copied from the incoming message.
_REQUEST_OWN = frozenset({"content-length", "via", "x-forwarded-for", "x-forwarded-proto", "x-forwarded-host"})
_RESPONSE_OWN = frozenset({"content-length"})
VIA = "1.1 sluicegate"


def _end_to_end(head: Head, own: frozenset[str]) -> list[tuple[str, str]]:
    """``head``'s fields without the hop-by-hop ones, those ``Connection`` names, and ``own``."""
    drop = HOP_BY_HOP | own | head.tokens("connection")
    return [(name, value) for name, value in head.fields if name.lower() not in drop]


def origin_form(target: str) -> tuple[str, str | None]:
    """``(origin-form target, authority or None)`` of a request target (absolute-form is accepted too).

    Example:
        >>> origin_form("http://Shop:8080/a?b=1"), origin_form("/x"), origin_form("http://shop")
        (('/a?b=1', 'Shop:8080'), ('/x', None), ('/', 'shop'))
    """
    if target.startswith("/") or target == "*":
        return target, None
    parts = urlsplit(target)
    if parts.scheme.lower() not in ("http", "https") or not parts.netloc:
        raise ValueError(f"unsupported request target {target[:80]!r}")
    path = parts.path or "/"
    return (f"{path}?{parts.query}" if parts.query else path), parts.netloc


def upstream_request(
    head: RequestHead, framing: Framing, client_ip: str, base_path: str, *, upstream_host: str = ""
) -> bytes:
    """The head to send upstream for ``head`` (whose body, if any, follows as ``framing`` says)."""
    target, authority = origin_form(head.target)
    host = authority or head.get("host") or upstream_host
    fields = [(name, value) for name, value in _end_to_end(head, _REQUEST_OWN) if name.lower() != "host"]
    fields.insert(0, ("Host", host))
    if framing.kind == "chunked":
        fields.append(("Transfer-Encoding", "chunked"))
    elif framing.kind == "length" or head.values("content-length"):
        fields.append(("Content-Length", str(framing.length)))
    via = head.get("via")
    fields.append(("Via", f"{via}, {VIA}" if via else VIA))
    forwarded = head.get("x-forwarded-for")
    fields.append(("X-Forwarded-For", f"{forwarded}, {client_ip}" if forwarded else client_ip))
    fields.append(("X-Forwarded-Proto", "http"))
    if host:
        fields.append(("X-Forwarded-Host", host))
    path = target if target == "*" else base_path + target
    return encode_head(f"{head.method} {path} HTTP/1.1", fields)


def client_response(
    head: ResponseHead,
    framing: Framing,
    *,
    client_version: str,
    keep_alive: bool,
    extra: list[tuple[str, str]],
) -> tuple[bytes, bool, bool]:
    """``(head bytes, chunked, keep_alive)`` of the response to send the client.

    The body is sent chunked when its length is unknown and the client speaks
    HTTP/1.1; an HTTP/1.0 client gets it raw and the connection closes after it.
    """
    fields = _end_to_end(head, _RESPONSE_OWN if framing.kind != "none" else frozenset())
    chunked = False
    if framing.kind == "length":
        fields.append(("Content-Length", str(framing.length)))
    elif framing.kind in ("chunked", "close"):
        if client_version == "HTTP/1.1":
            chunked = True
            fields.append(("Transfer-Encoding", "chunked"))
        else:
            keep_alive = False  # the end of the body is the end of the connection
    fields += extra
    if not keep_alive:
        fields.append(("Connection", "close"))
    elif client_version == "HTTP/1.0":
        fields.append(("Connection", "keep-alive"))
    return encode_head(f"HTTP/1.1 {head.status} {head.reason}", fields), chunked, keep_alive


def interim_response(head: ResponseHead) -> bytes:
    """A 1xx (100 Continue, 103 Early Hints) as relayed to an HTTP/1.1 client."""
    return encode_head(f"HTTP/1.1 {head.status} {head.reason}", _end_to_end(head, frozenset()))
