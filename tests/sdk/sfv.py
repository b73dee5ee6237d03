"""A strict parser of RFC 8941 structured-field Lists, and the RateLimit draft's rules on top.

Only what the RateLimit header fields use (Lists of Items with Parameters;
all bare item types), but strictly: anything RFC 8941 would reject fails.
"""

from __future__ import annotations

import base64
import re
import string
from dataclasses import dataclass
from typing import Any

_KEY_FIRST = set(string.ascii_lowercase + "*")
_KEY_REST = _KEY_FIRST | set(string.digits + "_-.")
_TCHAR = set("!#$%&'*+-.^_`|~" + string.ascii_letters + string.digits)
_TOKEN_REST = _TCHAR | set(":/")
_BASE64 = set(string.ascii_letters + string.digits + "+/=")


class Token(str):
    """An sf-token (as opposed to an sf-string)."""


@dataclass(frozen=True)
class Item:
    value: Any
    params: dict[str, Any]


class ParseError(ValueError):
    pass


class _Parser:
    def __init__(self, text: str) -> None:
        if not text.isascii():
            raise ParseError("not ASCII")
        self.text = text.strip(" ")
        self.pos = 0

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def take(self) -> str:
        char = self.peek()
        if not char:
            raise ParseError(f"unexpected end in {self.text!r}")
        self.pos += 1
        return char

    def parse_list(self) -> list[Item]:
        members = []
        while self.pos < len(self.text):
            if self.peek() == "(":
                raise ParseError("inner lists are not used by the RateLimit fields")
            members.append(self.parse_item())
            while self.peek() in (" ", "\t") and self.peek():
                self.pos += 1
            if self.pos >= len(self.text):
                return members
            if self.take() != ",":
                raise ParseError(f"expected ',' at {self.pos} in {self.text!r}")
            while self.peek() in (" ", "\t") and self.peek():
                self.pos += 1
            if self.pos >= len(self.text):
                raise ParseError("trailing comma")
        if not members:
            raise ParseError("empty list")
        return members

    def parse_item(self) -> Item:
        value = self.parse_bare()
        params: dict[str, Any] = {}
        while self.peek() == ";":
            self.pos += 1
            while self.peek() == " ":
                self.pos += 1
            key = self.parse_key()
            if key in params:
                raise ParseError(f"parameter {key!r} twice")
            if self.peek() == "=":
                self.pos += 1
                params[key] = self.parse_bare()
            else:
                params[key] = True
        return Item(value, params)

    def parse_key(self) -> str:
        start = self.pos
        if self.peek() not in _KEY_FIRST or not self.peek():
            raise ParseError(f"bad key start at {self.pos} in {self.text!r}")
        while self.peek() and self.peek() in _KEY_REST:
            self.pos += 1
        return self.text[start : self.pos]

    def parse_bare(self) -> Any:
        char = self.peek()
        if char == "-" or char.isdigit():
            return self.parse_number()
        if char == '"':
            return self.parse_string()
        if char == ":":
            return self.parse_binary()
        if char == "?":
            self.pos += 1
            flag = self.take()
            if flag not in "01":
                raise ParseError("bad boolean")
            return flag == "1"
        if char and (char.isalpha() or char == "*"):
            start = self.pos
            while self.peek() and self.peek() in _TOKEN_REST:
                self.pos += 1
            return Token(self.text[start : self.pos])
        raise ParseError(f"no bare item at {self.pos} in {self.text!r}")

    def parse_number(self) -> int | float:
        match = re.compile(r"-?\d+(\.\d+)?").match(self.text, self.pos)
        if match is None:
            raise ParseError("bad number")
        number = match.group()
        self.pos = match.end()
        digits = number.lstrip("-")
        if match.group(1) is None:
            if len(digits) > 15:
                raise ParseError("integer longer than 15 digits")
            return int(number)
        whole, fraction = digits.split(".")
        if len(whole) > 12 or len(fraction) > 3:
            raise ParseError("decimal out of range")
        return float(number)

    def parse_string(self) -> str:
        self.take()
        out = []
        while True:
            char = self.take()
            if char == "\\":
                escaped = self.take()
                if escaped not in '"\\':
                    raise ParseError("bad escape in string")
                out.append(escaped)
            elif char == '"':
                return "".join(out)
            elif not 0x20 <= ord(char) <= 0x7E:
                raise ParseError("control character in string")
            else:
                out.append(char)

    def parse_binary(self) -> bytes:
        self.take()
        end = self.text.find(":", self.pos)
        if end < 0:
            raise ParseError("unterminated byte sequence")
        data = self.text[self.pos : end]
        if not set(data) <= _BASE64:
            raise ParseError("bad base64")
        self.pos = end + 1
        return base64.b64decode(data)


def parse_list(text: str) -> list[Item]:
    """An RFC 8941 List of Items; ParseError for anything that is not one."""
    return _Parser(text).parse_list()


def _integer(item: Item, name: str, *, required: bool, minimum: int) -> int | None:
    value = item.params.get(name)
    if value is None:
        assert not required, f"{name} is required on {item}"
        return None
    assert type(value) is int and value >= minimum, f"{name} must be an Integer >= {minimum}, got {value!r}"
    return value


def check_rate_limit_headers(headers: dict[str, str]) -> dict[str, dict[str, int | None]]:
    """Assert that RateLimit / RateLimit-Policy (and Retry-After) follow the draft; their values by policy."""
    policies: dict[str, dict[str, int | None]] = {}
    for item in parse_list(headers["RateLimit-Policy"]):
        assert type(item.value) is str and not isinstance(item.value, Token), "a policy is named by an sf-string"
        assert set(item.params) <= {"q", "qu", "w", "pk"}, f"unknown policy parameters {item.params}"
        policies[item.value] = {
            "q": _integer(item, "q", required=True, minimum=0),
            "w": _integer(item, "w", required=False, minimum=1),
        }
    for item in parse_list(headers["RateLimit"]):
        assert type(item.value) is str and not isinstance(item.value, Token), "RateLimit names a policy by sf-string"
        assert item.value in policies, f"RateLimit names {item.value!r}, not in RateLimit-Policy"
        assert set(item.params) <= {"r", "t", "pk"}, f"unknown RateLimit parameters {item.params}"
        remaining = _integer(item, "r", required=True, minimum=0)
        policies[item.value]["r"] = remaining
        policies[item.value]["t"] = _integer(item, "t", required=False, minimum=0)
        assert remaining <= policies[item.value]["q"], "more remaining than the quota"  # type: ignore[operator]
    if "Retry-After" in headers:
        assert re.fullmatch(r"[0-9]+", headers["Retry-After"]), "Retry-After must be delay-seconds"
    return policies
