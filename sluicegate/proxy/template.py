"""QoS key templates: literal text with ``{field}`` placeholders filled from a request.

Placeholders: ``{client_ip}``, ``{host}``, ``{method}``, ``{path}``,
``{header:NAME}`` (all values of the header, joined with ``, ``) and
``{query:NAME}`` (the first value of a query parameter). A missing header or
parameter is empty text. ``{{`` and ``}}`` are literal braces, so a routing
tag (the part of a key inside ``{...}``) is written ``{{{header:x-tenant}}}:uploads``.

Example:
    >>> from sluicegate.proxy.view import RequestView
    >>> view = RequestView.build("POST", "/v1/jobs?plan=pro", {"x-tenant": "acme"}, "10.1.2.3")
    >>> KeyTemplate("{{{header:X-Tenant}}}:{method}:{query:plan}").render(view)
    '{acme}:POST:pro'
    >>> KeyTemplate("ip:{client_ip}").render(view)
    'ip:10.1.2.3'
"""

from __future__ import annotations

from collections.abc import Callable

from sluicegate.proxy.view import RequestView

Part = Callable[[RequestView], str]

_FIELDS: dict[str, Part] = {
    "client_ip": lambda view: str(view.client_ip),
    "host": lambda view: view.host,
    "method": lambda view: view.method,
    "path": lambda view: view.path,
}
FIELD_NAMES = (*_FIELDS, "header:NAME", "query:NAME")


class TemplateError(ValueError):
    """A template that cannot be parsed (the message says what is wrong)."""


class KeyTemplate:
    """A parsed key template; :meth:`render` builds the key of one request."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._parts: list[str | Part] = []
        self._parse(text)

    @property
    def constant(self) -> bool:
        """True when the key is the same for every request (no placeholder)."""
        return all(isinstance(part, str) for part in self._parts)

    def render(self, view: RequestView) -> str:
        return "".join(part if isinstance(part, str) else part(view) for part in self._parts)

    def _parse(self, text: str) -> None:
        literal: list[str] = []
        i, n = 0, len(text)
        while i < n:
            char = text[i]
            if char in "{}" and text[i + 1 : i + 2] == char:
                literal.append(char)
                i += 2
            elif char == "}":
                raise TemplateError(f"a lone '}}' at offset {i}: write '}}}}' for a literal brace")
            elif char == "{":
                end = text.find("}", i + 1)
                if end < 0:
                    raise TemplateError(f"'{{' at offset {i} is not closed: write '{{{{' for a literal brace")
                if literal:
                    self._parts.append("".join(literal))
                    literal = []
                self._parts.append(_placeholder(text[i + 1 : end]))
                i = end + 1
            else:
                literal.append(char)
                i += 1
        if literal:
            self._parts.append("".join(literal))


def _placeholder(name: str) -> Part:
    found = _FIELDS.get(name)
    if found is not None:
        return found
    kind, colon, argument = name.partition(":")
    argument = argument.strip()
    if colon and argument and kind == "header":
        header = argument.lower()
        return lambda view: view.headers.get(header, "")
    if colon and argument and kind == "query":
        return lambda view: view.query_param(argument) or ""
    raise TemplateError(f"unknown placeholder {{{name}}}: use one of " + ", ".join(f"{{{f}}}" for f in FIELD_NAMES))
