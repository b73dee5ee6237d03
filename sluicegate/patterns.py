"""Pattern rules: glob matching and an index that resolves a key to the winning pattern. Pure.

Pattern syntax is :func:`fnmatch.fnmatchcase`'s: ``*`` any run of characters
(``:`` and ``/`` included: no path-separator special cases), ``?`` one
character, ``[...]`` a character class (``[!...]`` negated); a ``[`` without
its ``]`` is a literal character. Matching is case-sensitive.

Resolution order among the patterns that match a key (the exact rule of a key
and the default rule are the caller's business, before and after this):

1. the highest ``precedence``;
2. then the most specific: the longest literal part (:func:`literal_length`);
3. then the smallest pattern string (code-point order), so that the winner
   never depends on the order patterns were added.

Example:
    >>> from sluicegate.rules import Rule
    >>> index = PatternIndex()
    >>> index.put(Rule("tenant:*", 100, 10))
    >>> index.put(Rule("tenant:acme:*", 50, 5))
    >>> index.put(Rule("*:admin", 5, 1, precedence=1))
    >>> index.match("tenant:acme:alice").key
    'tenant:acme:*'
    >>> index.match("tenant:acme:admin").key
    '*:admin'
    >>> index.match("other") is None
    True
"""

from __future__ import annotations

import re
from bisect import insort
from fnmatch import fnmatchcase, translate
from operator import attrgetter

from sluicegate.rules import PATTERN_CHARS, Rule

# How an entry tests the part of a key after its literal prefix.
_ANY, _END, _SUFFIX, _REGEX = range(4)
_FIRST_GLOB = re.compile(r"[*?\[]")


def _tokens(pattern: str) -> list[tuple[bool, str]]:
    """``(is_glob, text)`` pieces of ``pattern``, parsed as :func:`fnmatch.translate` does."""
    tokens: list[tuple[bool, str]] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        i += 1
        if c in "*?":
            tokens.append((True, c))
        elif c == "[":
            j = i
            if j < n and pattern[j] == "!":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1  # a "]" right after "[" or "[!" is a member, not the end
            while j < n and pattern[j] != "]":
                j += 1
            if j >= n:
                tokens.append((False, c))  # no closing "]": a literal "["
            else:
                tokens.append((True, pattern[i - 1 : j + 1]))
                i = j + 1
        else:
            tokens.append((False, c))
    return tokens


def literal_length(pattern: str) -> int:
    """Characters of ``pattern`` outside glob syntax (``*``, ``?`` and ``[...]`` classes count 0).

    Example:
        >>> literal_length("tenant:*"), literal_length("user:[ab]?x"), literal_length("a[b")
        (7, 6, 3)
    """
    if "[" not in pattern:  # the common case, without parsing
        return len(pattern) - pattern.count("*") - pattern.count("?")
    return sum(not is_glob for is_glob, _ in _tokens(pattern))


def glob_match(pattern: str, key: str) -> bool:
    """Whether ``key`` matches ``pattern`` (:func:`fnmatch.fnmatchcase`: ``*`` crosses ``:`` and ``/``).

    Example:
        >>> glob_match("tenant:*", "tenant:acme:user:1"), glob_match("k?", "k")
        (True, False)
    """
    return fnmatchcase(key, pattern)


def _literal_prefix(pattern: str) -> str:
    """``pattern`` up to its first ``*``, ``?`` or ``[`` (the part every matching key starts with)."""
    found = _FIRST_GLOB.search(pattern)
    return pattern if found is None else pattern[: found.start()]


class _Entry:
    """One pattern in the index: its rule, rank and how to test a key past the literal prefix."""

    __slots__ = ("arg", "kind", "pattern", "prefix_len", "rank", "rule")

    def __init__(self, rule: Rule) -> None:
        pattern = rule.key
        prefix = _literal_prefix(pattern)
        rest = pattern[len(prefix) :]
        self.rule = rule
        self.pattern = pattern
        self.prefix_len = len(prefix)
        # Smallest rank wins: highest precedence, then longest literal part, then smallest string.
        self.rank = (-rule.precedence, -literal_length(pattern), pattern)
        self.arg: object = None
        tail = rest.lstrip("*")
        if not rest:
            self.kind = _END
        elif rest.startswith("*") and not tail:
            self.kind = _ANY  # the common "prefix*": reaching the prefix's node is a match
        elif rest.startswith("*") and PATTERN_CHARS.isdisjoint(tail):
            self.kind, self.arg = _SUFFIX, tail
        else:
            self.kind, self.arg = _REGEX, re.compile(translate(rest)).match

    def matches(self, key: str) -> bool:
        """Whether ``key`` matches, given that it starts with this entry's literal prefix."""
        kind = self.kind
        if kind == _ANY:
            return True
        if kind == _END:
            return len(key) == self.prefix_len
        if kind == _SUFFIX:
            suffix: str = self.arg  # type: ignore[assignment]
            return len(key) - self.prefix_len >= len(suffix) and key.endswith(suffix)
        return self.arg(key, self.prefix_len) is not None  # type: ignore[operator]


_rank = attrgetter("rank")


class _Node:
    """A radix-trie node: ``label`` is the text of the edge leading to it (empty at the root)."""

    __slots__ = ("children", "entries", "label")

    def __init__(self, label: str) -> None:
        self.label = label
        self.children: dict[str, _Node] | None = None  # by the first character of the child's label
        self.entries: list[_Entry] | None = None  # best rank first


class PatternIndex:
    """Pattern rules indexed for :meth:`match` in time that grows with the key, not the number of patterns.

    The index is a radix trie on each pattern's literal prefix (the text before
    its first ``*``, ``?`` or ``[``). A key walks down the trie along its own
    characters and tests only the patterns hanging on the nodes it passes:
    those whose literal prefix the key starts with. Patterns that start with a
    glob character (``*:admin``) have an empty prefix and sit at the root, so
    every key tests them: keep them few. On each node patterns are kept best
    first, so a node's test stops at its first match or as soon as the
    remaining ones rank below the best match found so far.

    The order among matching patterns is the module's resolution order
    (precedence, then literal length, then the pattern string). A key without
    glob characters is a pattern that matches only itself, but exact rules
    belong in a dict and win before any pattern (the caller's job).

    Example:
        >>> from sluicegate.rules import Rule
        >>> index = PatternIndex()
        >>> index.put(Rule("user:*", 10, 1))
        >>> index.put(Rule("user:1?", 10, 1))
        >>> index.match("user:17").key, index.match("user:42").key, len(index)
        ('user:1?', 'user:*', 2)
        >>> index.remove("user:1?"), index.match("user:17").key
        (True, 'user:*')
    """

    def __init__(self) -> None:
        self._root = _Node("")
        self._entries: dict[str, _Entry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> Rule | None:
        """The rule stored under pattern ``key`` (not a match: see :meth:`match`)."""
        entry = self._entries.get(key)
        return entry.rule if entry is not None else None

    def put(self, rule: Rule) -> None:
        """Add ``rule`` under its key, replacing the rule stored under the same key."""
        if not isinstance(rule, Rule):
            raise TypeError(f"put() needs a Rule, got {type(rule).__name__}")
        self.remove(rule.key)
        entry = _Entry(rule)
        self._entries[rule.key] = entry
        node = self._node_for(rule.key[: entry.prefix_len])
        if node.entries is None:
            node.entries = []
        insort(node.entries, entry, key=_rank)

    def remove(self, key: str) -> bool:
        """Remove the rule stored under pattern ``key``; False if there was none."""
        entry = self._entries.pop(key, None)
        if entry is None:
            return False
        path = self._path_to(key[: entry.prefix_len])
        node = path[-1]
        assert node.entries is not None
        node.entries.remove(entry)
        if not node.entries:
            node.entries = None
        self._prune(path)
        return True

    def match(self, key: str) -> Rule | None:
        """The best pattern rule matching ``key`` (resolution order in the module docstring), or None."""
        best: _Entry | None = None
        node = self._root
        pos, end = 0, len(key)
        while True:
            entries = node.entries
            if entries is not None:
                for entry in entries:
                    if best is not None and entry.rank >= best.rank:
                        break  # the rest of this node ranks lower still
                    if entry.matches(key):
                        best = entry
                        break
            children = node.children
            if children is None or pos >= end:
                break
            child = children.get(key[pos])
            if child is None or not key.startswith(child.label, pos):
                break
            pos += len(child.label)
            node = child
        return best.rule if best is not None else None

    # -- the trie ---------------------------------------------------------------------------

    def _node_for(self, prefix: str) -> _Node:
        """The node of ``prefix``, created (splitting an edge if need be) when missing."""
        node, pos = self._root, 0
        while pos < len(prefix):
            if node.children is None:
                node.children = {}
            child = node.children.get(prefix[pos])
            if child is None:
                leaf = _Node(prefix[pos:])
                node.children[prefix[pos]] = leaf
                return leaf
            label = child.label
            common, limit = 1, min(len(label), len(prefix) - pos)  # the first character matched already
            while common < limit and label[common] == prefix[pos + common]:
                common += 1
            if common < len(label):
                # The prefix ends inside or leaves this edge: split it at the common part.
                middle = _Node(label[:common])
                child.label = label[common:]
                middle.children = {child.label[0]: child}
                node.children[prefix[pos]] = middle
                child = middle
            node, pos = child, pos + common
        return node

    def _path_to(self, prefix: str) -> list[_Node]:
        """The nodes from the root to the node of ``prefix`` (which must exist)."""
        path, node, pos = [self._root], self._root, 0
        while pos < len(prefix):
            assert node.children is not None
            node = node.children[prefix[pos]]
            pos += len(node.label)
            path.append(node)
        return path

    def _prune(self, path: list[_Node]) -> None:
        """Drop empty leaves along ``path`` and merge a pass-through node into its only child."""
        for depth in range(len(path) - 1, 0, -1):
            node, parent = path[depth], path[depth - 1]
            assert parent.children is not None
            if node.entries is None and node.children is None:
                del parent.children[node.label[0]]
                if not parent.children:
                    parent.children = None
                continue
            if node.entries is None and node.children is not None and len(node.children) == 1:
                (child,) = node.children.values()
                child.label = node.label + child.label
                parent.children[node.label[0]] = child
            break
