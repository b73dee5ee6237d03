"""What classification sees of a request: method, host, normalized path, query, headers, client IP.

The path is matched as the upstream will most likely read it: percent-decoded
and with ``.``/``..`` segments resolved, so ``/api/%75pload`` and
``/api/x/../upload`` cannot slip past a rule for ``/api/upload``.

Example:
    >>> view = RequestView.build("get", "/a/b/../%63?x=1&y=%20", {"host": "API.example.com:8443"}, "::ffff:10.0.0.7")
    >>> view.method, view.host, view.path, view.query_param("y"), str(view.client_ip)
    ('GET', 'api.example.com', '/a/c', ' ', '10.0.0.7')
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import parse_qs, unquote

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def normalize_path(raw: str) -> str:
    """``raw`` percent-decoded, with dot segments removed (RFC 3986 5.2.4).

    Example:
        >>> normalize_path("/a/./b/../c/"), normalize_path("/a/.."), normalize_path("/%2e%2e/x")
        ('/a/c/', '/', '/x')
    """
    path = unquote(raw, errors="replace")
    if not path.startswith("/"):
        return path  # "*" (OPTIONS *) and the like: nothing to resolve
    out: list[str] = []
    segments = path.split("/")[1:]
    for segment in segments:
        if segment == "..":
            if out:
                out.pop()
        elif segment != ".":
            out.append(segment)
    # "/a/b/.." names the directory "/a/": keep its trailing slash.
    trailing = segments[-1] in (".", "..") and bool(out)
    return "/" + "/".join(out) + ("/" if trailing else "")


def host_name(authority: str) -> str:
    """The host of a ``Host`` value, lower-case and without its port (``[v6]`` keeps its brackets).

    Example:
        >>> host_name("Example.COM:8080"), host_name("[::1]:80"), host_name("")
        ('example.com', '[::1]', '')
    """
    authority = authority.strip().lower()
    if authority.startswith("["):
        end = authority.find("]")
        return authority[: end + 1] if end > 0 else authority
    return authority.rpartition(":")[0] if ":" in authority else authority


def client_address(text: str) -> IpAddress:
    """The peer's address; an IPv4-mapped IPv6 address becomes the IPv4 one (so IPv4 CIDRs match it)."""
    address = ipaddress.ip_address(text.split("%", 1)[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


@dataclass(slots=True)
class RequestView:
    """A request as classes match it and key templates read it (header names lower-case)."""

    method: str
    host: str
    path: str
    query: str
    headers: Mapping[str, str]
    client_ip: IpAddress
    _query: dict[str, list[str]] | None = field(default=None, repr=False)

    @classmethod
    def build(cls, method: str, target: str, headers: Mapping[str, str], client_ip: str | IpAddress) -> RequestView:
        """From the request line's method and origin-form target, the headers and the peer address."""
        raw_path, _, query = target.partition("?")
        return cls(
            method.upper(),
            host_name(headers.get("host", "")),
            normalize_path(raw_path),
            query,
            headers,
            client_address(client_ip) if isinstance(client_ip, str) else client_ip,
        )

    def query_param(self, name: str) -> str | None:
        """The first value of query parameter ``name`` (decoded), or None."""
        if self._query is None:
            self._query = parse_qs(self.query, keep_blank_values=True)
        values = self._query.get(name)
        return values[0] if values else None
