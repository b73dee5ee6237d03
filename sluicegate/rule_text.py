"""Rule fields written as text (``rules put`` options, CSV cells), turned into a rule's JSON form. Pure.

:meth:`sluicegate.rules.Rule.from_dict` takes a rule as JSON values; a
command line or a CSV cell only has text. These helpers turn the text into
those values and leave every check of the values themselves to the rule
model, so the rules and their error messages are the same from every door
(admin API, rule files, CLI).

Text forms:

* a limit: ``name=daily,quota=250,per=day,offset=+02:00,shadow`` or
  ``name=burst,capacity=20,rate=5`` (``shadow`` alone means ``shadow=true``),
  or the limit's JSON object;
* several limits (a CSV cell): a JSON list of limit objects, or limit
  texts separated by ``;``;
* level weights: ``2=4,1=2,0=1`` (priority = weight), or a JSON object;
* a flag: ``true``/``false``, ``yes``/``no``, ``on``/``off``, ``1``/``0``.

Example:
    >>> parse_limit("name=daily,quota=250,per=day,shadow")
    {'name': 'daily', 'quota': 250, 'per': 'day', 'shadow': True}
    >>> parse_level_weights("2=4,1=2,0=1")
    {'2': 4, '1': 2, '0': 1}
    >>> policy_from_text({"precedence": "5", "shadow": "yes", "parent": ""})
    {'shadow': True, 'precedence': 5}
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sluicegate.rules import RuleError

TRUE_WORDS = frozenset({"true", "yes", "on", "1"})
FALSE_WORDS = frozenset({"false", "no", "off", "0"})
#: The rule fields a CSV file may add as columns (besides key, capacity, rate); empty cells mean "default".
TEXT_FIELDS = ("limits", "shadow", "precedence", "parent", "weight", "priority", "share", "level_weights")


def parse_flag(name: str, text: str) -> bool:
    """``true``/``yes``/``on``/``1`` or ``false``/``no``/``off``/``0`` (any case)."""
    word = text.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise RuleError(f"{name} must be true or false, got {text!r}")


def parse_whole(name: str, text: str) -> int:
    """A whole number such as ``5`` or ``-2`` (the rule model checks its range)."""
    try:
        return int(text.strip())
    except ValueError:
        raise RuleError(f"{name} must be a whole number, got {text!r}") from None


def _scalar(text: str) -> Any:
    """A number when the text is one (the rule model wants numbers), else the text itself."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def _json(name: str, text: str) -> Any:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
        raise RuleError(f"{name}: not valid JSON: {reason}") from None


def _pairs(name: str, text: str) -> list[tuple[str, str | None]]:
    pairs: list[tuple[str, str | None]] = []
    for part in text.split(","):
        field, equals, value = part.partition("=")
        field = field.strip()
        if not field:
            raise RuleError(f"{name}: expected field=value pairs separated by commas, got {text!r}")
        pairs.append((field, value.strip() if equals else None))
    return pairs


def parse_limit(text: str) -> dict[str, Any]:
    """One limit from ``field=value,...`` text or a JSON object (fields are checked by the rule model)."""
    text = text.strip()
    if text.startswith("{"):
        return _json("limit", text)  # type: ignore[no-any-return]
    limit: dict[str, Any] = {}
    for field, value in _pairs("limit", text):
        if field in limit:
            raise RuleError(f"limit: {field} given twice in {text!r}")
        if field == "shadow":
            limit[field] = True if value is None else parse_flag("limit: shadow", value)
        elif value is None:
            raise RuleError(f"limit: {field} needs a value ({field}=...) in {text!r}")
        elif field in ("name", "per", "offset"):
            limit[field] = value
        else:
            limit[field] = _scalar(value)
    return limit


def parse_limits(text: str) -> list[Any]:
    """Several limits: a JSON list, or limit texts separated by ``;``."""
    text = text.strip()
    if text.startswith("["):
        return _json("limits", text)  # type: ignore[no-any-return]
    return [parse_limit(part) for part in text.split(";") if part.strip()]


def parse_level_weights(text: str) -> dict[str, Any]:
    """``priority=weight,...`` or a JSON object, as :meth:`Rule.from_dict` takes it."""
    text = text.strip()
    if text.startswith("{"):
        return _json("level_weights", text)  # type: ignore[no-any-return]
    weights: dict[str, Any] = {}
    for level, value in _pairs("level_weights", text):
        if value is None:
            raise RuleError(f"level_weights: expected priority=weight pairs like 2=4,1=2,0=1, got {text!r}")
        if level in weights:
            raise RuleError(f"level_weights: priority {level} given twice")
        weights[level] = _scalar(value)
    return weights


def policy_from_text(fields: Mapping[str, str | None]) -> dict[str, Any]:
    """The policy fields among ``fields`` (text cells by :data:`TEXT_FIELDS` name); blank ones are left out."""
    policy: dict[str, Any] = {}
    for name in TEXT_FIELDS:
        text = fields.get(name)
        if text is None or not text.strip():
            continue
        if name == "limits":
            policy[name] = parse_limits(text)
        elif name == "shadow":
            policy[name] = parse_flag(name, text)
        elif name in ("precedence", "priority"):
            policy[name] = parse_whole(name, text)
        elif name == "level_weights":
            policy[name] = parse_level_weights(text)
        else:  # parent and share as written (keys may hold spaces); the rule model reads a weight's text
            policy[name] = text
    return policy
