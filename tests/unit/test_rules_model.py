"""The rule model: validation of capacity, rate and key; from_dict; window_ms; the default rule."""

from __future__ import annotations

import pytest

from sluicegate.rules import (
    DEFAULT_RULE_KEY,
    DENY_ALL,
    MAX_CAPACITY,
    MAX_KEY_BYTES,
    NEVER_MS,
    Rule,
    RuleError,
    default_rule,
    validate_key,
)


class TestCapacity:
    @pytest.mark.parametrize(
        ("given", "stored"), [(0, 0), (1, 1), (MAX_CAPACITY, MAX_CAPACITY), (10.0, 10), ("10", 10), (" 7 ", 7)]
    )
    def test_whole_numbers_in_range_are_accepted(self, given: object, stored: int) -> None:
        rule = Rule("k", given, 1)  # type: ignore[arg-type]
        assert rule.capacity == stored
        assert type(rule.capacity) is int

    @pytest.mark.parametrize(
        "given",
        [
            -1,
            MAX_CAPACITY + 1,
            2**64,
            pytest.param(10**400, id="10**400"),
            1.5,
            "1.5",
            "ten",
            "",
            None,
            True,
            False,
            float("nan"),
            float("inf"),
        ],
    )
    def test_everything_else_is_a_rule_error_naming_capacity(self, given: object) -> None:
        with pytest.raises(RuleError, match="capacity"):
            Rule("k", given, 1)  # type: ignore[arg-type]


class TestRate:
    @pytest.mark.parametrize(("given", "stored"), [(0, 0.0), (0.5, 0.5), (100, 100.0), ("2.5", 2.5), (1e9, 1e9)])
    def test_finite_non_negative_rates_are_accepted(self, given: object, stored: float) -> None:
        rule = Rule("k", 1, given)  # type: ignore[arg-type]
        assert rule.rate == stored
        assert type(rule.rate) is float

    @pytest.mark.parametrize(
        "given",
        [
            -0.001,
            -1,
            float("nan"),
            float("inf"),
            "inf",
            "nan",
            "fast",
            None,
            True,
            [1],
            pytest.param(10**400, id="10**400"),
        ],
    )
    def test_everything_else_is_a_rule_error_naming_rate(self, given: object) -> None:
        with pytest.raises(RuleError, match="rate"):
            Rule("k", 1, given)  # type: ignore[arg-type]


class TestKey:
    @pytest.mark.parametrize(
        "key",
        ["a", "x" * MAX_KEY_BYTES, "é" * (MAX_KEY_BYTES // 2), "team/alice:42", "😀"],
        ids=["short", "256-ascii", "256-utf8-bytes", "punctuation", "emoji"],
    )
    def test_valid_keys(self, key: str) -> None:
        assert validate_key(key) == key
        assert Rule(key, 1, 1).key == key

    @pytest.mark.parametrize(
        ("key", "message"),
        [
            ("", "empty"),
            pytest.param("x" * (MAX_KEY_BYTES + 1), "longer than 256", id="257-ascii"),
            pytest.param("é" * (MAX_KEY_BYTES // 2) + "x", "longer than 256", id="129-chars-257-bytes"),
            pytest.param("😀" * 65, "longer than 256", id="65-chars-260-bytes"),
            ("ab\ud800", "not valid Unicode"),
            ("\udcff", "not valid Unicode"),
            (None, "string"),
            (b"bytes", "string"),
            (42, "string"),
        ],
    )
    def test_invalid_keys(self, key: object, message: str) -> None:
        with pytest.raises(RuleError, match=message):
            validate_key(key)
        with pytest.raises(RuleError, match=message):
            Rule(key, 1, 1)  # type: ignore[arg-type]

    def test_rule_error_is_a_value_error(self) -> None:
        assert issubclass(RuleError, ValueError)


class TestFromDict:
    def test_round_trip_through_to_dict(self) -> None:
        rule = Rule("alice", 1000, 2.5)
        assert rule.to_dict() == {"key": "alice", "capacity": 1000, "rate": 2.5}
        assert Rule.from_dict(rule.to_dict()) == rule

    def test_key_argument_overrides_the_body(self) -> None:
        assert Rule.from_dict({"capacity": 5, "rate": 1}, key="bob") == Rule("bob", 5, 1)
        assert Rule.from_dict({"key": "ignored", "capacity": 5, "rate": 1}, key="bob").key == "bob"

    def test_unknown_fields_are_named(self) -> None:
        with pytest.raises(RuleError, match="unknown rule field\\(s\\): burst, ttl"):
            Rule.from_dict({"key": "a", "capacity": 1, "rate": 1, "ttl": 5, "burst": 3})

    @pytest.mark.parametrize("missing", ["capacity", "rate"])
    def test_missing_numbers_are_required(self, missing: str) -> None:
        data: dict[str, object] = {"key": "a", "capacity": 1, "rate": 1}
        del data[missing]
        with pytest.raises(RuleError, match=f"{missing} is required"):
            Rule.from_dict(data)
        data[missing] = None
        with pytest.raises(RuleError, match=f"{missing} is required"):
            Rule.from_dict(data)
        data[missing] = ""
        with pytest.raises(RuleError, match=f"{missing} is required"):
            Rule.from_dict(data)

    def test_missing_key(self) -> None:
        with pytest.raises(RuleError, match="key"):
            Rule.from_dict({"capacity": 1, "rate": 1})

    @pytest.mark.parametrize("data", [None, [], ["a", 1, 1], "a,1,1", 5])
    def test_not_an_object(self, data: object) -> None:
        with pytest.raises(RuleError, match="must be an object"):
            Rule.from_dict(data)

    def test_values_are_validated(self) -> None:
        with pytest.raises(RuleError, match="capacity"):
            Rule.from_dict({"key": "a", "capacity": -5, "rate": 1})
        with pytest.raises(RuleError, match="rate"):
            Rule.from_dict({"key": "a", "capacity": 5, "rate": "quick"})


class TestWindow:
    @pytest.mark.parametrize(
        ("capacity", "rate", "window_ms"),
        [
            (1000, 100, 10_000),
            (1, 3, 334),  # rounded up: the bucket is not full after 333 ms
            (10, 0.5, 20_000),
            (0, 10, 0),
            (5, 0, NEVER_MS),  # never refills
            (0, 0, NEVER_MS),
            (MAX_CAPACITY, 0.001, NEVER_MS),  # capped at the wire's "never"
        ],
    )
    def test_window_is_the_time_to_refill_from_empty(self, capacity: int, rate: float, window_ms: int) -> None:
        assert Rule("k", capacity, rate).window_ms == window_ms

    def test_tiny_rate_never_refills_within_the_wire_range(self) -> None:
        assert Rule("k", 1, 1e-310).window_ms == NEVER_MS

    def test_derived_fields_do_not_affect_equality(self) -> None:
        assert Rule("k", 10, 1) == Rule("k", "10", "1")  # type: ignore[arg-type]
        assert Rule("k", 10, 1) != Rule("k", 10, 2)


class TestDefaultRule:
    def test_deny_all_admits_nothing(self) -> None:
        assert DENY_ALL == default_rule(0, 0)
        assert DENY_ALL.key == DEFAULT_RULE_KEY
        assert (DENY_ALL.capacity, DENY_ALL.rate) == (0, 0.0)
        assert DENY_ALL.admits_anything is False
        assert DENY_ALL.window_ms == NEVER_MS

    def test_default_rule_carries_its_parameters(self) -> None:
        rule = default_rule(100, 10)
        assert rule == Rule(DEFAULT_RULE_KEY, 100, 10)
        assert rule.admits_anything is True
        assert rule.window_ms == 10_000

    def test_default_rule_is_validated(self) -> None:
        with pytest.raises(RuleError, match="capacity"):
            default_rule(-1, 10)
        with pytest.raises(RuleError, match="rate"):
            default_rule(10, float("nan"))

    def test_with_key_keeps_parameters(self) -> None:
        assert default_rule(7, 2).with_key("alice") == Rule("alice", 7, 2)
        with pytest.raises(RuleError):
            default_rule(7, 2).with_key("")
