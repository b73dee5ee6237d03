"""Read rules from YAML, JSON or CSV files, with the line number of each row.

Every row yields ``(line, Rule)`` or ``(line, RuleError)``, so a caller keeps
the good rows and reports the bad ones by line.

Formats (chosen by file extension, or ``fmt``):

* CSV: a header row ``key,capacity,rate`` then one rule per row.
* JSON: a list of ``{"key", "capacity", "rate"}`` objects, or ``{"rules": [...]}``.
* YAML: the same shapes as JSON.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path

from sluicegate.rules import Rule, RuleError

Row = tuple[int, "Rule | RuleError"]
FORMATS = ("csv", "json", "yaml")


def detect_format(path: Path) -> str:
    suffix = path.suffix.lower().lstrip(".")
    if suffix == "yml":
        return "yaml"
    if suffix in FORMATS:
        return suffix
    raise RuleError(f"cannot tell the format of {path.name}: use .csv, .json, .yaml or pass --format")


def read_rules(path: Path, fmt: str | None = None) -> Iterator[Row]:
    """Yield ``(line, Rule or RuleError)`` for every row of ``path``."""
    fmt = fmt or detect_format(path)
    try:
        # utf-8-sig: spreadsheets often start a CSV (or JSON) with a byte order mark.
        if fmt == "csv":
            yield from _read_csv(path)
        elif fmt == "json":
            yield from _read_json(path.read_text(encoding="utf-8-sig"))
        elif fmt == "yaml":
            yield from _read_yaml(path.read_text(encoding="utf-8-sig"))
        else:
            raise RuleError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    except UnicodeDecodeError as exc:
        raise RuleError(f"{path.name} is not UTF-8 text: {exc.reason}") from exc


def _rule(line: int, data: object) -> Row:
    try:
        return line, Rule.from_dict(data)
    except RuleError as exc:
        return line, exc


def _read_csv(path: Path) -> Iterator[Row]:
    with path.open(newline="", encoding="utf-8-sig") as handle:
        reader = csv.DictReader(handle)
        missing = {"key", "capacity", "rate"} - set(reader.fieldnames or [])
        if missing:
            raise RuleError(f"CSV header must name key, capacity and rate; missing {', '.join(sorted(missing))}")
        for row in reader:
            line = reader.line_num
            if None in row:
                yield line, RuleError("more fields than the header names")
                continue
            yield _rule(line, {name: value for name, value in row.items() if name in ("key", "capacity", "rate")})


def _items(payload: object) -> list[object]:
    if isinstance(payload, dict) and "rules" in payload:
        payload = payload["rules"]
    if not isinstance(payload, list):
        raise RuleError('expected a list of rules or {"rules": [...]}')
    return payload


def _read_json(text: str) -> Iterator[Row]:
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RuleError(f"not valid JSON (line {exc.lineno}): {exc.msg}") from exc
    items = _items(payload)
    # json has no positions: walk the array again to find where each item starts.
    decoder = json.JSONDecoder()
    index = text.index("[", text.index('"rules"') if isinstance(payload, dict) else 0) + 1
    for item in items:
        while text[index] in " \t\r\n,":
            index += 1
        line = text.count("\n", 0, index) + 1
        _, index = decoder.raw_decode(text, index)
        yield _rule(line, item)


def _read_yaml(text: str) -> Iterator[Row]:
    import yaml

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        payload = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise RuleError(f"not valid YAML: {exc}") from exc
    items = _items(payload)
    node = root
    if isinstance(root, yaml.MappingNode):
        node = next(value for key, value in root.value if key.value == "rules")
    for item, item_node in zip(items, node.value, strict=True):
        yield _rule(item_node.start_mark.line + 1, item)
