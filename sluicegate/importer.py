"""Read rules from YAML, JSON or CSV files, with the line number of each row.

Every row yields ``(where, Rule)`` or ``(where, RuleError)``, so a caller keeps
the good rows and reports the bad ones by line. ``where`` is the line number
(an int), or ``"item N"`` in the rare case a JSON item's line cannot be found.
:func:`import_rules` streams a file into a store in batches; both
``sluicegate rules import`` and ``sluicegate local --rules`` use it.

Formats (chosen by file extension, or ``fmt``):

* CSV: a header row naming ``key,capacity,rate`` and, optionally, the policy
  columns ``precedence``, ``parent``, ``weight``, ``priority``, ``share``,
  ``shadow`` (true/false), ``level_weights`` (``2=4,1=2,0=1``) and
  ``limits`` (a JSON list of limits, or ``field=value,...`` limits separated
  by ``;``); an empty cell keeps the field's default, other columns are
  ignored. Text cells are read by :mod:`sluicegate.rule_text`.
* JSON: a list of rule objects (``{"key", "capacity", "rate"}`` plus any
  policy field, as the admin API takes them), or ``{"rules": [...]}``.
* YAML: the same shapes as JSON.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sluicegate.rule_text import policy_from_text
from sluicegate.rules import Rule, RuleError

if TYPE_CHECKING:
    from sluicegate.store import RuleStore

Row = tuple["int | str", "Rule | RuleError"]
FORMATS = ("csv", "json", "yaml")
_JSON_SPACE = " \t\r\n"


@dataclass
class ImportSummary:
    """Counts of an import so far: rules stored, rows read, bad rows skipped."""

    stored: int = 0
    rows: int = 0
    bad: int = 0


def bad_row_message(path: Path, where: int | str, error: RuleError) -> str:
    """``file:line: message`` (or ``file: item N: message`` when the line is unknown)."""
    return f"{path}:{where}: {error}" if isinstance(where, int) else f"{path}: {where}: {error}"


def import_rules(
    store: RuleStore,
    path: Path,
    fmt: str | None = None,
    *,
    on_bad: Callable[[str], None],
    progress: Callable[[ImportSummary], None] | None = None,
) -> ImportSummary:
    """Stream the good rows of ``path`` into ``store`` in batches.

    ``on_bad`` gets a ``file:line: message`` text for every bad row;
    ``progress`` gets the running summary after each stored batch. A file
    that cannot be read at all raises :class:`RuleError` (rows already
    stored stay stored).
    """
    summary = ImportSummary()

    def good_rows() -> Iterator[Rule]:
        for where, row in read_rules(path, fmt):
            summary.rows += 1
            if isinstance(row, RuleError):
                summary.bad += 1
                on_bad(bad_row_message(path, where, row))
            else:
                yield row

    def stored(done: int) -> None:
        summary.stored = done
        if progress is not None:
            progress(summary)

    summary.stored = store.put_rules(good_rows(), progress=stored)
    return summary


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


def _rule(where: int | str, data: object) -> Row:
    try:
        return where, Rule.from_dict(data)
    except RuleError as exc:
        return where, exc


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
            try:
                policy = policy_from_text(row)
            except RuleError as exc:
                yield line, exc
                continue
            yield _rule(line, {"key": row["key"], "capacity": row["capacity"], "rate": row["rate"], **policy})


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
    except RecursionError as exc:
        raise RuleError("not valid JSON: nested too deeply") from exc
    items = _items(payload)
    try:
        lines: list[int | str] = list(_json_item_lines(text, len(items)))
    except (ValueError, IndexError, RecursionError):
        # Should not happen for text json.loads accepted; number the items instead of crashing.
        lines = [f"item {number}" for number in range(1, len(items) + 1)]
    for line, item in zip(lines, items, strict=True):
        yield _rule(line, item)


def _json_item_lines(text: str, count: int) -> Iterator[int]:
    """The line where each item of the rules array starts (json has no positions: walk the text)."""
    decoder = json.JSONDecoder()

    def skip_space(index: int) -> int:
        while text[index] in _JSON_SPACE:
            index += 1
        return index

    def expect(index: int, char: str) -> int:
        index = skip_space(index)
        if text[index] != char:
            raise ValueError(f"expected {char!r} at offset {index}")
        return index + 1

    index = skip_space(0)
    if text[index] == "{":
        # Walk the top-level members; json.loads keeps the last of repeated names, so do we.
        index, array = skip_space(index + 1), None
        while text[index] != "}":
            name, index = decoder.raw_decode(text, index)
            index = skip_space(expect(index, ":"))
            if name == "rules":
                array = index
            _, index = decoder.raw_decode(text, index)
            index = skip_space(index)
            if text[index] == ",":
                index = skip_space(index + 1)
            elif text[index] != "}":
                raise ValueError(f"expected ',' or '}}' at offset {index}")
        if array is None:
            raise ValueError("no rules member")
        index = array
    index = expect(index, "[")
    line, counted = 1, 0
    for _ in range(count):
        index = skip_space(index)
        line += text.count("\n", counted, index)  # counted incrementally: one pass over the text
        counted = index
        yield line
        _, index = decoder.raw_decode(text, index)
        index = skip_space(index)
        if text[index] == ",":
            index += 1


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
