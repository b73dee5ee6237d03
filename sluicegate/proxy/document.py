"""A YAML or JSON document read with the line of every value, so errors can say where to look.

Example:
    >>> doc = parse_document("classes:\\n  - name: api\\n    cost: 2\\n", "policy.yaml")
    >>> entry = doc.value["classes"].value[0]
    >>> entry.value["cost"].value, entry.value["cost"].line
    (2, 3)
    >>> Section(doc, "policy.yaml", "").error("bad", doc.value["classes"]).args[0]
    'policy.yaml:2: bad'
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml


class DocumentError(ValueError):
    """The file cannot be used; the message starts with ``file:line:``."""


@dataclass(frozen=True, slots=True)
class Located:
    """A value of the document and the (1-based) line it starts on.

    Mappings hold ``dict[str, Located]``, sequences ``list[Located]``, scalars their Python value.
    """

    value: Any
    line: int


def load_document(path: Path) -> Located:
    """Read ``path`` (JSON if it ends in ``.json``, else YAML); :class:`DocumentError` if unreadable."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise DocumentError(f"{path}: cannot read: {exc}") from exc
    if path.suffix.lower() == ".json":
        try:
            json.loads(text)  # JSON's own rules first; YAML below only adds the line numbers
        except json.JSONDecodeError as exc:
            raise DocumentError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg}") from exc
    return parse_document(text, str(path))


def parse_document(text: str, source: str) -> Located:
    """Parse YAML (JSON is a subset) into :class:`Located` values."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise DocumentError(f"{source}:1: the file is empty")
        return _convert(loader, node, source)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line = mark.line + 1 if mark is not None else 1
        problem = getattr(exc, "problem", None) or str(exc)
        raise DocumentError(f"{source}:{line}: not valid YAML: {problem}") from exc
    finally:
        loader.dispose()


def _convert(loader: yaml.SafeLoader, node: yaml.Node, source: str) -> Located:
    line = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        members: dict[str, Located] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                raise DocumentError(f"{source}:{key_node.start_mark.line + 1}: field names must be text, got {key!r}")
            if key in members:
                raise DocumentError(f"{source}:{key_node.start_mark.line + 1}: {key!r} is given twice")
            members[key] = _convert(loader, value_node, source)
        return Located(members, line)
    if isinstance(node, yaml.SequenceNode):
        return Located([_convert(loader, item, source) for item in node.value], line)
    return Located(loader.construct_object(node, deep=True), line)


class Section:
    """One mapping of the document, read field by field; errors name the file, line and field path.

    ``where`` is the mapping's path in the document (``classes[2]``); :meth:`finish`
    refuses any field nobody took (a typo must not be ignored silently).
    """

    def __init__(self, located: Located, source: str, where: str) -> None:
        self.source = source
        self.where = where
        self.line = located.line
        if not isinstance(located.value, dict):
            raise self.error(f"must be a mapping of fields, got {_kind(located.value)}", located)
        self._fields: dict[str, Located] = dict(located.value)

    def path(self, name: str) -> str:
        return f"{self.where}.{name}" if self.where else name

    def error(self, message: str, at: Located | None = None, name: str | None = None) -> DocumentError:
        line = at.line if at is not None else self.line
        field = self.path(name) if name is not None else self.where
        return DocumentError(f"{self.source}:{line}: {field + ': ' if field else ''}{message}")

    def take(self, name: str) -> Located | None:
        """The field ``name`` (None if absent or null), no longer counted as unknown."""
        found = self._fields.pop(name, None)
        return None if found is None or found.value is None else found

    def names(self) -> list[str]:
        """The fields not taken yet, in document order."""
        return list(self._fields)

    def section(self, name: str) -> Section | None:
        found = self.take(name)
        return None if found is None else Section(found, self.source, self.path(name))

    def finish(self) -> None:
        for name, value in self._fields.items():
            raise self.error("unknown field", value, name)


def _kind(value: object) -> str:
    if isinstance(value, list):
        return "a list"
    return "nothing" if value is None else f"{type(value).__name__} {value!r}"
