"""Pattern rules: glob semantics, literal length, and PatternIndex resolution (precedence, specificity, ties)."""

from __future__ import annotations

import random
from fnmatch import fnmatchcase

import pytest

from sluicegate.patterns import PatternIndex, glob_match, literal_length
from sluicegate.rules import Rule


def rule(key: str, precedence: int = 0) -> Rule:
    return Rule(key, 10, 1, precedence=precedence)


def index_of(*rules: Rule) -> PatternIndex:
    index = PatternIndex()
    for item in rules:
        index.put(item)
    return index


def winner(index: PatternIndex, key: str) -> str | None:
    found = index.match(key)
    return None if found is None else found.key


class TestGlob:
    @pytest.mark.parametrize(
        ("pattern", "key", "expected"),
        [
            ("tenant:*", "tenant:acme:user:1", True),  # * crosses ":"
            ("a/*", "a/b/c", True),  # and "/"
            ("*", "", True),
            ("k?", "k", False),
            ("k?", "kx", True),
            ("user:[0-9]", "user:7", True),
            ("user:[!0-9]", "user:7", False),
            ("x[]]y", "x]y", True),  # "]" first in a class is a member
            ("a[b", "a[b", True),  # an unclosed "[" is literal
            ("Tenant:*", "tenant:a", False),  # case-sensitive
            ("*:admin", "tenant:acme:admin", True),
            ("*:admin", "tenant:acme:admins", False),
        ],
    )
    def test_fnmatchcase_semantics(self, pattern: str, key: str, expected: bool) -> None:
        assert glob_match(pattern, key) is expected

    @pytest.mark.parametrize(
        ("pattern", "length"),
        [
            ("tenant:*", 7),
            ("*", 0),
            ("*:admin", 6),
            ("user:[ab]?x", 6),
            ("a[b", 3),
            ("x[]]y", 2),
            ("[!abc]def", 3),
            ("exact", 5),
        ],
    )
    def test_literal_length_counts_characters_outside_glob_syntax(self, pattern: str, length: int) -> None:
        assert literal_length(pattern) == length


class TestResolution:
    def test_longest_literal_part_wins_among_equal_precedence(self) -> None:
        index = index_of(rule("tenant:*"), rule("tenant:acme:*"), rule("tenant:acme:user:*"), rule("*"))
        assert winner(index, "tenant:acme:user:42") == "tenant:acme:user:*"
        assert winner(index, "tenant:acme:bob") == "tenant:acme:*"
        assert winner(index, "tenant:other") == "tenant:*"
        assert winner(index, "elsewhere") == "*"

    def test_precedence_beats_specificity(self) -> None:
        index = index_of(rule("tenant:acme:user:*"), rule("*:admin", precedence=5), rule("tenant:*", precedence=1))
        assert winner(index, "tenant:acme:user:admin") == "*:admin"
        assert winner(index, "tenant:acme:user:bob") == "tenant:*"  # precedence 1 over a longer literal part
        assert winner(index, "nobody") is None

    def test_negative_precedence_loses_to_the_default_zero(self) -> None:
        index = index_of(rule("tenant:acme:*", precedence=-1), rule("tenant:*"))
        assert winner(index, "tenant:acme:x") == "tenant:*"

    def test_a_glob_in_the_middle_counts_only_its_literal_characters(self) -> None:
        # "t*:user:*" has 7 literal characters, "tenant:*" 7 too: the smaller string wins the tie.
        index = index_of(rule("tenant:*"), rule("t*:user:*"))
        assert winner(index, "tenant:user:1") == "t*:user:*"
        # A longer literal part wins regardless of where the glob is.
        index.put(rule("*:user:1"))
        assert winner(index, "tenant:user:1") == "*:user:1"

    def test_ties_go_to_the_smallest_pattern_string_whatever_the_insertion_order(self) -> None:
        patterns = ["a?c:*", "ab?:*", "?bc:*"]  # same precedence, same literal length 3
        for order in (patterns, patterns[::-1], sorted(patterns)):
            index = index_of(*(rule(p) for p in order))
            assert winner(index, "abc:x") == "?bc:*"  # "?" < "a" in code-point order

    def test_exact_looking_keys_match_only_themselves(self) -> None:
        index = index_of(rule("tenant:*"), rule("tenant:acme"))
        assert winner(index, "tenant:acme") == "tenant:acme"
        assert winner(index, "tenant:acme2") == "tenant:*"

    def test_suffix_pattern_does_not_overlap_its_prefix(self) -> None:
        index = index_of(rule("ab*ba"))
        assert winner(index, "aba") is None
        assert winner(index, "abba") == "ab*ba"
        assert winner(index, "ab-ba") == "ab*ba"

    def test_patterns_hanging_on_every_node_of_the_path_are_considered(self) -> None:
        index = index_of(rule("a*z"), rule("ab?d*"), rule("abc*", precedence=-1), rule("abcd[xy]"))
        assert winner(index, "abcdy") == "abcd[xy]"
        assert winner(index, "abcdz") == "ab?d*"  # literal 3 vs "a*z" 2
        assert winner(index, "abcz") == "a*z"
        assert winner(index, "abcq") == "abc*"


class TestIndexMaintenance:
    def test_put_replaces_and_get_returns_the_stored_rule(self) -> None:
        index = index_of(rule("tenant:*"))
        replacement = Rule("tenant:*", 99, 9, precedence=3)
        index.put(replacement)
        assert len(index) == 1
        assert index.get("tenant:*") is replacement
        assert index.match("tenant:x") is replacement
        assert index.get("tenant:x") is None  # get is by pattern, not a match

    def test_precedence_change_through_put_reorders(self) -> None:
        index = index_of(rule("tenant:*"), rule("tenant:acme:*"))
        assert winner(index, "tenant:acme:1") == "tenant:acme:*"
        index.put(rule("tenant:*", precedence=1))
        assert winner(index, "tenant:acme:1") == "tenant:*"

    def test_remove(self) -> None:
        index = index_of(rule("tenant:*"), rule("tenant:acme:*"), rule("tenant:acme:user:*"))
        assert index.remove("tenant:acme:*")
        assert not index.remove("tenant:acme:*")
        assert not index.remove("never:*")
        assert len(index) == 2
        assert winner(index, "tenant:acme:bob") == "tenant:*"
        assert winner(index, "tenant:acme:user:1") == "tenant:acme:user:*"
        assert index.remove("tenant:*")
        assert winner(index, "tenant:acme:bob") is None
        assert index.remove("tenant:acme:user:*")
        assert len(index) == 0
        assert winner(index, "tenant:acme:user:1") is None
        index.put(rule("tenant:acme:*"))  # the emptied trie still works
        assert winner(index, "tenant:acme:user:1") == "tenant:acme:*"

    def test_put_refuses_what_is_not_a_rule(self) -> None:
        with pytest.raises(TypeError, match="needs a Rule"):
            PatternIndex().put("tenant:*")  # type: ignore[arg-type]


def _random_pattern(rng: random.Random) -> str:
    pieces = ["a", "b", ":", "a", "b", ":", "*", "?", "[ab]", "[!a]", "[", "]", "ab", "ba:"]
    while True:
        pattern = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 6)))
        if pattern:
            return pattern


def _oracle(patterns: dict[str, int], key: str) -> str | None:
    """The documented order by brute force: precedence, literal length, smallest string."""
    matching = [(-prec, -literal_length(p), p) for p, prec in patterns.items() if fnmatchcase(key, p)]
    return min(matching)[2] if matching else None


def test_agrees_with_brute_force_through_puts_and_removes() -> None:
    """Random overlapping patterns (prefixes that split and merge trie edges), random keys: same winner."""
    rng = random.Random(6)
    for _round in range(5):
        patterns: dict[str, int] = {}
        index = PatternIndex()
        for _ in range(300):
            pattern = _random_pattern(rng)
            patterns[pattern] = rng.choice([0, 0, 0, 1, -1])
            index.put(rule(pattern, patterns[pattern]))
        for pattern in rng.sample(sorted(patterns), 120):  # remove some, put some back with a new precedence
            assert index.remove(pattern)
            del patterns[pattern]
            if rng.random() < 0.3:
                patterns[pattern] = rng.choice([0, 2])
                index.put(rule(pattern, patterns[pattern]))
        assert len(index) == len(patterns)
        keys = ["".join(rng.choice("ab:[]!") for _ in range(rng.randint(0, 9))) for _ in range(1500)]
        for key in keys:
            assert winner(index, key) == _oracle(patterns, key), key


def test_100000_patterns_still_resolve_correctly() -> None:
    """Realistic shapes: per-tenant prefixes, per-tenant user prefixes, a few globs with precedence."""
    index = PatternIndex()
    tenants = 50_000
    for t in range(tenants):
        index.put(rule(f"tenant:{t}:*"))
    for t in range(tenants):
        if t % 50 != 0:
            index.put(rule(f"tenant:{t}:user:*"))
    index.put(rule("*:admin", precedence=1))
    index.put(rule("tenant:*:export:*"))
    index.put(rule("tenant:[0-9]*:batch", precedence=2))
    assert len(index) == tenants + tenants - tenants // 50 + 3
    assert winner(index, "tenant:31337:user:alice") == "tenant:31337:user:*"
    assert winner(index, "tenant:31350:user:alice") == "tenant:31350:*"  # no user rule for multiples of 50
    assert winner(index, "tenant:31337:report") == "tenant:31337:*"
    assert winner(index, "tenant:31337:user:admin") == "*:admin"
    assert winner(index, "tenant:7:batch") == "tenant:[0-9]*:batch"
    # "tenant:*:export:*" has 15 literal characters: more than "tenant:7:*" (9) and "tenant:7:user:*" (14).
    assert winner(index, "tenant:7:export:x") == "tenant:*:export:*"
    assert winner(index, "tenant:7:user:export:x") == "tenant:*:export:*"
    assert winner(index, "tenant:99999:x") is None
    assert winner(index, "guest:admin") == "*:admin"
    rng = random.Random(1)
    for t in rng.sample(range(tenants), 200):
        assert winner(index, f"tenant:{t}:k{t}") == f"tenant:{t}:*"
        assert index.remove(f"tenant:{t}:*")
        assert winner(index, f"tenant:{t}:k{t}") is None
