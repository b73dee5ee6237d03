"""Reading rules from CSV, JSON and YAML files: good rows kept, bad rows reported by line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sluicegate import importer
from sluicegate.importer import ImportSummary, detect_format, import_rules, read_rules
from sluicegate.rules import Rule, RuleError
from sluicegate.store.sqlite import SqliteRuleStore


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def split(path: Path, fmt: str | None = None) -> tuple[list[tuple[int, Rule]], dict[int, str]]:
    """(good rows, {line: error message}) of ``path``."""
    good: list[tuple[int, Rule]] = []
    bad: dict[int, str] = {}
    for line, row in read_rules(path, fmt):
        if isinstance(row, RuleError):
            assert line not in bad, f"two errors reported for line {line}"
            bad[line] = str(row)
        else:
            good.append((line, row))
    return good, bad


class TestCsv:
    def test_good_rows_with_their_lines(self, tmp_path: Path) -> None:
        path = write(tmp_path, "rules.csv", "key,capacity,rate\nalice,1000,100\nbob,5,0.5\n")
        assert split(path) == ([(2, Rule("alice", 1000, 100)), (3, Rule("bob", 5, 0.5))], {})

    def test_bad_rows_reported_by_line_good_rows_kept(self, tmp_path: Path) -> None:
        text = (
            "key,capacity,rate\n"  # 1
            "alice,10,1\n"  # 2
            "bob,-1,1\n"  # 3  negative capacity
            "\n"  # 4  blank lines are skipped but still counted
            "carol,10,fast\n"  # 5  bad rate
            ",10,1\n"  # 6  empty key
            "dave,10,1,extra\n"  # 7  too many fields
            "erin,10\n"  # 8  too few fields
            "frank,20,2\n"  # 9
        )
        good, bad = split(write(tmp_path, "rules.csv", text))
        assert good == [(2, Rule("alice", 10, 1)), (9, Rule("frank", 20, 2))]
        assert sorted(bad) == [3, 5, 6, 7, 8]
        assert "capacity" in bad[3]
        assert "rate" in bad[5]
        assert "key" in bad[6]
        assert "more fields" in bad[7]
        assert "rate is required" in bad[8]

    def test_column_order_and_extra_columns_do_not_matter(self, tmp_path: Path) -> None:
        path = write(tmp_path, "rules.csv", "rate,note,key,capacity\n2,VIP customer,alice,50\n")
        assert split(path) == ([(2, Rule("alice", 50, 2))], {})

    def test_quoted_keys_with_commas(self, tmp_path: Path) -> None:
        path = write(tmp_path, "rules.csv", 'key,capacity,rate\n"acme, inc",5,1\n')
        assert split(path)[0] == [(2, Rule("acme, inc", 5, 1))]

    def test_crlf_line_endings(self, tmp_path: Path) -> None:
        path = tmp_path / "rules.csv"
        path.write_bytes(b"key,capacity,rate\r\nalice,1,1\r\nbob,x,1\r\n")
        good, bad = split(path)
        assert good == [(2, Rule("alice", 1, 1))]
        assert list(bad) == [3]

    def test_byte_order_mark_from_a_spreadsheet(self, tmp_path: Path) -> None:
        path = tmp_path / "rules.csv"
        path.write_bytes("key,capacity,rate\nalice,1,1\n".encode("utf-8-sig"))
        assert split(path) == ([(2, Rule("alice", 1, 1))], {})

    @pytest.mark.parametrize(
        ("header", "missing"),
        [("key,capacity\n", "rate"), ("name,cap,rate\n", "capacity, key"), ("", "capacity, key, rate")],
    )
    def test_bad_header(self, tmp_path: Path, header: str, missing: str) -> None:
        path = write(tmp_path, "rules.csv", header + "alice,1,1\n")
        with pytest.raises(RuleError, match=f"header.*missing {missing}"):
            list(read_rules(path))

    def test_not_utf8(self, tmp_path: Path) -> None:
        path = tmp_path / "rules.csv"
        path.write_bytes("key,capacity,rate\nzoë,1,1\n".encode("latin-1"))
        with pytest.raises(RuleError, match="not UTF-8"):
            list(read_rules(path))


class TestJson:
    def test_list_spread_over_several_lines(self, tmp_path: Path) -> None:
        text = """[
  {"key": "alice", "capacity": 10, "rate": 1},
  {
    "key": "bob",
    "capacity": -1,
    "rate": 1
  },

  {"key": "carol",
   "capacity": 5, "rate": 0.5},
  {"key": "dave", "capacity": 5, "rate": 1, "burst": 9}, {"key": "erin", "capacity": 1, "rate": 1},
  "frank",
  {"key": "", "capacity": 1, "rate": 1}
]
"""
        good, bad = split(write(tmp_path, "rules.json", text))
        assert good == [(2, Rule("alice", 10, 1)), (9, Rule("carol", 5, 0.5)), (11, Rule("erin", 1, 1))]
        assert sorted(bad) == [3, 11, 12, 13]
        assert "capacity" in bad[3]
        assert "burst" in bad[11]
        assert "must be an object" in bad[12]
        assert "key" in bad[13]

    def test_two_items_on_one_line_are_both_reported_at_that_line(self, tmp_path: Path) -> None:
        text = '[\n{"key": "a", "capacity": -1, "rate": 1}, {"key": "b", "capacity": 1, "rate": 1}\n]'
        rows = list(read_rules(write(tmp_path, "rules.json", text)))
        assert [line for line, _ in rows] == [2, 2]
        assert isinstance(rows[0][1], RuleError)
        assert rows[1][1] == Rule("b", 1, 1)

    def test_rules_object_with_other_fields_first(self, tmp_path: Path) -> None:
        text = """{
  "version": 2,
  "owners": ["platform", "billing"],
  "rules": [
    {"key": "alice", "capacity": 10, "rate": 1},
    {"key": "bob", "capacity": 1.5, "rate": 1}
  ]
}
"""
        good, bad = split(write(tmp_path, "rules.json", text))
        assert good == [(5, Rule("alice", 10, 1))]
        assert list(bad) == [6]

    def test_rules_as_a_value_before_the_rules_member(self, tmp_path: Path) -> None:
        # A naive text search finds the first "rules" (here a value) and the wrong array after it.
        text = """{"comment": "rules", "tags": [1, 2],
 "rules": [
  {"key": "a", "capacity": 1, "rate": 1},
  {"key": "b", "capacity": -1, "rate": 1},
  {"key": "c", "capacity": 3, "rate": 1}
 ]}"""
        good, bad = split(write(tmp_path, "rules.json", text))
        assert good == [(3, Rule("a", 1, 1)), (5, Rule("c", 3, 1))]
        assert list(bad) == [4]

    def test_rules_inside_another_member_and_as_a_key_in_a_string(self, tmp_path: Path) -> None:
        text = """{
  "meta": {"rules": [{"x": 1}], "note": "\\"rules\\": ["},
  "rules": [
    {"key": "a", "capacity": 1, "rate": 1},

    {"key": "b", "capacity": 2, "rate": "x"}
  ]
}"""
        good, bad = split(write(tmp_path, "rules.json", text))
        assert good == [(4, Rule("a", 1, 1))]
        assert list(bad) == [6]

    def test_repeated_rules_member_uses_the_last_like_json_does(self, tmp_path: Path) -> None:
        text = '{"rules": [{"key": "old", "capacity": 1, "rate": 1}],\n"rules": [\n{"key": "new", "capacity": -1}]}'
        rows = list(read_rules(write(tmp_path, "rules.json", text)))
        assert [line for line, _ in rows] == [3]
        assert isinstance(rows[0][1], RuleError)

    def test_unfindable_positions_fall_back_to_item_numbers(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        def lost(text: str, count: int) -> list[int]:
            raise ValueError("cannot find the items")

        monkeypatch.setattr(importer, "_json_item_lines", lost)
        text = '[{"key": "a", "capacity": 1, "rate": 1}, {"key": "b", "capacity": -1, "rate": 1}]'
        rows = list(read_rules(write(tmp_path, "rules.json", text)))
        assert [where for where, _ in rows] == ["item 1", "item 2"]
        assert rows[0][1] == Rule("a", 1, 1)
        assert isinstance(rows[1][1], RuleError)

    def test_deeply_nested_file_is_a_whole_file_error(self, tmp_path: Path) -> None:
        with pytest.raises(RuleError, match="nested too deeply"):
            list(read_rules(write(tmp_path, "rules.json", "[" * 100_000 + "]" * 100_000)))

    def test_nested_values_inside_items_do_not_shift_lines(self, tmp_path: Path) -> None:
        items = [{"key": f"k{i}", "capacity": i, "rate": 1} for i in range(5)]
        items[2]["capacity"] = "[not, a, number]"
        text = json.dumps(items, indent=2)
        good, bad = split(write(tmp_path, "rules.json", text))
        starts = [number for number, line in enumerate(text.splitlines(), 1) if line.strip() == "{"]
        assert [line for line, _ in good] == starts[:2] + starts[3:]
        assert list(bad) == [starts[2]]

    def test_huge_numbers_are_bad_rows_not_crashes(self, tmp_path: Path) -> None:
        huge = "9" * 400
        text = f'[\n{{"key": "a", "capacity": {huge}, "rate": 1}},\n{{"key": "b", "capacity": 1, "rate": 1e999}}\n]'
        good, bad = split(write(tmp_path, "rules.json", text))
        assert good == []
        assert sorted(bad) == [2, 3]

    def test_empty_list(self, tmp_path: Path) -> None:
        assert split(write(tmp_path, "rules.json", "[]")) == ([], {})
        assert split(write(tmp_path, "more.json", '{"rules": []}')) == ([], {})

    @pytest.mark.parametrize(
        ("text", "message"),
        [
            ('[{"key": "a", "capacity": 1, "rate": 1},\n', "not valid JSON \\(line 2\\)"),
            ("{'key': 'a'}", "not valid JSON"),
            ("", "not valid JSON"),
            ('{"key": "a", "capacity": 1, "rate": 1}', "expected a list"),
            ('{"rules": {"key": "a"}}', "expected a list"),
            ("42", "expected a list"),
        ],
    )
    def test_whole_file_errors(self, tmp_path: Path, text: str, message: str) -> None:
        with pytest.raises(RuleError, match=message):
            list(read_rules(write(tmp_path, "rules.json", text)))


class TestYaml:
    def test_list_with_line_numbers(self, tmp_path: Path) -> None:
        text = """# rules for the staging tenants
- key: alice
  capacity: 10
  rate: 1

- key: bob
  capacity: -3
  rate: 1
- {key: carol, capacity: 5, rate: 0.5}
- key: dave
  capacity: 5
  rate: 1
  burst: 2
- just a string
"""
        good, bad = split(write(tmp_path, "rules.yaml", text))
        assert good == [(2, Rule("alice", 10, 1)), (9, Rule("carol", 5, 0.5))]
        assert sorted(bad) == [6, 10, 14]
        assert "capacity" in bad[6]
        assert "burst" in bad[10]
        assert "must be an object" in bad[14]

    def test_mapping_with_rules(self, tmp_path: Path) -> None:
        text = """owner: platform
defaults:
  note: ignored
rules:
  - key: alice
    capacity: 10
    rate: 1
  - key: "12345"
    capacity: 3
    rate: 0
  - key: 12345
    capacity: 3
    rate: 0
"""
        good, bad = split(write(tmp_path, "rules.yml", text))
        assert good == [(5, Rule("alice", 10, 1)), (8, Rule("12345", 3, 0))]
        assert list(bad) == [11]
        assert "key must be a string" in bad[11]

    def test_flow_style_list(self, tmp_path: Path) -> None:
        text = "[{key: a, capacity: 1, rate: 1},\n {key: b, capacity: x, rate: 1}]\n"
        good, bad = split(write(tmp_path, "rules.yaml", text))
        assert good == [(1, Rule("a", 1, 1))]
        assert list(bad) == [2]

    @pytest.mark.parametrize(
        ("text", "message"),
        [
            ("- key: a\n  capacity: [1\n", "not valid YAML"),
            ("key: a\n- b\n", "not valid YAML"),
            ("", "expected a list"),
            ("just text\n", "expected a list"),
            ("rules: 5\n", "expected a list"),
            ("other: []\n", "expected a list"),
        ],
    )
    def test_whole_file_errors(self, tmp_path: Path, text: str, message: str) -> None:
        with pytest.raises(RuleError, match=message):
            list(read_rules(write(tmp_path, "rules.yaml", text)))


class TestFormat:
    @pytest.mark.parametrize(
        ("name", "fmt"),
        [("a.csv", "csv"), ("a.CSV", "csv"), ("a.json", "json"), ("a.yaml", "yaml"), ("a.yml", "yaml")],
    )
    def test_detected_from_extension(self, name: str, fmt: str) -> None:
        assert detect_format(Path(name)) == fmt

    @pytest.mark.parametrize("name", ["rules.txt", "rules", "rules.csv.bak", "rules.xlsx"])
    def test_unknown_extension(self, tmp_path: Path, name: str) -> None:
        path = write(tmp_path, name, "key,capacity,rate\na,1,1\n")
        with pytest.raises(RuleError, match="cannot tell the format"):
            list(read_rules(path))

    def test_explicit_format_overrides_extension(self, tmp_path: Path) -> None:
        path = write(tmp_path, "rules.txt", "key,capacity,rate\na,1,1\n")
        assert split(path, "csv") == ([(2, Rule("a", 1, 1))], {})
        with pytest.raises(RuleError, match="unknown format 'xml'"):
            list(read_rules(path, "xml"))


class TestImportRules:
    def test_streams_good_rows_reports_bad_ones_with_file_and_line(self, tmp_path: Path) -> None:
        path = write(tmp_path, "rules.csv", "key,capacity,rate\n" + "".join(f"k{i},{i - 1},1\n" for i in range(2500)))
        store = SqliteRuleStore(str(tmp_path / "rules.db"))
        bad: list[str] = []
        seen: list[tuple[int, int, int]] = []
        try:
            summary = import_rules(
                store, path, on_bad=bad.append, progress=lambda s: seen.append((s.stored, s.rows, s.bad))
            )
            assert summary == ImportSummary(stored=2499, rows=2500, bad=1)
            assert len(bad) == 1
            assert bad[0].startswith(f"{path}:2: capacity ")
            assert len(seen) > 1  # several batches, each reported as it is stored
            assert seen[-1] == (2499, 2500, 1)
            assert [stored for stored, _, _ in seen] == sorted(stored for stored, _, _ in seen)
            assert store.get_rule("k2499") == Rule("k2499", 2498, 1)
        finally:
            store.close()

    def test_item_numbers_when_lines_are_unknown(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        def lost(text: str, count: int) -> list[int]:
            raise ValueError("cannot find the items")

        monkeypatch.setattr(importer, "_json_item_lines", lost)
        path = write(tmp_path, "rules.json", '[{"key": "a", "capacity": -1, "rate": 1}]')
        store = SqliteRuleStore(str(tmp_path / "rules.db"))
        bad: list[str] = []
        try:
            assert import_rules(store, path, on_bad=bad.append).bad == 1
        finally:
            store.close()
        assert len(bad) == 1
        assert bad[0].startswith(f"{path}: item 1: capacity ")


class TestPolicyFields:
    """The rule fields beyond the main bucket, in every file format; old files read as before."""

    DAILY = {"name": "daily", "quota": 250, "per": "day", "offset": "+02:00"}

    def expected(self) -> dict[str, Rule]:
        return {
            "tenant:acme:*": Rule.from_dict(
                {"key": "tenant:acme:*", "capacity": 100, "rate": 10, "precedence": 5, "limits": [self.DAILY]}
            ),
            "{acme}": Rule.from_dict(
                {"key": "{acme}", "capacity": 300, "rate": 300, "share": "strict", "level_weights": {"2": 4, "0": 1}}
            ),
            "{acme}:batch": Rule.from_dict(
                {"key": "{acme}:batch", "capacity": 50, "rate": 50, "parent": "{acme}", "weight": 2.5, "priority": 2}
            ),
            "trial": Rule.from_dict(
                {"key": "trial", "capacity": 10, "rate": 1, "shadow": True, "limits": [{"capacity": 3, "rate": 1}]}
            ),
        }

    def test_csv_policy_columns(self, tmp_path: Path) -> None:
        text = (
            "key,capacity,rate,precedence,parent,weight,priority,share,shadow,level_weights,limits\n"
            '"tenant:acme:*",100,10,5,,,,,,,"[{""name"": ""daily"", ""quota"": 250, ""per"": ""day"", '
            '""offset"": ""+02:00""}]"\n'
            '{acme},300,300,,,,,strict,no,"2=4,0=1",\n'
            "{acme}:batch,50,50,,{acme},2.5,2,,,,\n"
            'trial,10,1,,,,,,yes,,"capacity=3,rate=1"\n'
        )
        good, bad = split(write(tmp_path, "rules.csv", text))
        assert bad == {}
        assert {rule.key: rule for _, rule in good} == self.expected()
        assert [line for line, _ in good] == [2, 3, 4, 5]

    def test_csv_limits_as_field_value_text(self, tmp_path: Path) -> None:
        text = (
            'key,capacity,rate,limits\nk,10,10,"name=daily,quota=250,per=day,offset=+02:00;name=b,capacity=5,rate=1"\n'
        )
        (_, rule), *_ = split(write(tmp_path, "rules.csv", text))[0]
        assert [limit.to_dict() for limit in rule.limits] == [self.DAILY, {"name": "b", "capacity": 5, "rate": 1.0}]

    def test_csv_bad_policy_cells_are_reported_by_line(self, tmp_path: Path) -> None:
        text = (
            "key,capacity,rate,precedence,parent,priority,share,shadow,limits\n"  # 1
            "a,1,1,high,,,,,\n"  # 2
            "b,1,1,,,,,maybe,\n"  # 3
            'c,1,1,,,,,,"[{""quota"": 5}]"\n'  # 4
            'd,1,1,,,,,,"[{""quota"": 5,"\n'  # 5
            "e,1,1,,{other},,,,\n"  # 6
            "f,1,1,,,,fair,,\n"  # 7
            "g,1,1,,,999,,,\n"  # 8
            "h,1,1,,,,,,quota;per=day\n"  # 9
            "ok,1,1,-3,,,,false,\n"  # 10
        )
        good, bad = split(write(tmp_path, "rules.csv", text))
        assert good == [(10, Rule("ok", 1, 1, precedence=-3))]
        assert sorted(bad) == [2, 3, 4, 5, 6, 7, 8, 9]
        assert bad[2] == "precedence must be a whole number, got 'high'"
        assert bad[3] == "shadow must be true or false, got 'maybe'"
        assert bad[4] == "limits: a quota limit needs per"
        assert bad[5].startswith("limits: not valid JSON")
        assert "parent and child must share a routing key" in bad[6]
        assert "share must be one of weighted, strict" in bad[7]
        assert "priority must be a whole number from 0 to 255" in bad[8]
        assert "needs a value" in bad[9]

    def test_csv_without_policy_columns_reads_as_before(self, tmp_path: Path) -> None:
        path = write(tmp_path, "rules.csv", "key,capacity,rate,note\nalice,10,1,shadow\n")
        good, bad = split(path)
        assert (good, bad) == ([(2, Rule("alice", 10, 1))], {})
        assert good[0][1].is_plain

    def test_json_carries_the_fields_as_is(self, tmp_path: Path) -> None:
        rules = [rule.to_dict() for rule in self.expected().values()]
        good, bad = split(write(tmp_path, "rules.json", json.dumps({"rules": rules}, indent=1)))
        assert bad == {}
        assert {rule.key: rule for _, rule in good} == self.expected()

    def test_yaml_carries_the_fields_as_is(self, tmp_path: Path) -> None:
        text = """rules:
  - key: "tenant:acme:*"
    capacity: 100
    rate: 10
    precedence: 5
    limits:
      - {name: daily, quota: 250, per: day, offset: "+02:00"}
  - key: "{acme}"
    capacity: 300
    rate: 300
    share: strict
    level_weights: {2: 4, 0: 1}
  - key: "{acme}:batch"
    capacity: 50
    rate: 50
    parent: "{acme}"
    weight: 2.5
    priority: 2
  - key: trial
    capacity: 10
    rate: 1
    shadow: yes
    limits: [{capacity: 3, rate: 1}]
  - key: bad
    capacity: 1
    rate: 1
    limits: [{quota: 1, per: fortnight}]
"""
        good, bad = split(write(tmp_path, "rules.yaml", text))
        assert {rule.key: rule for _, rule in good} == self.expected()
        assert list(bad) == [24]
        assert "per must be one of" in bad[24]

    @pytest.mark.parametrize(("written", "minutes"), [("+10:00", 600), ("+05:30", 330), ("-08:00", -480)])
    def test_yaml_unquoted_offsets(self, tmp_path: Path, written: str, minutes: int) -> None:
        # YAML 1.1 reads +10:00 as the base-60 number 600, which is also its value in minutes.
        text = f"- key: k\n  capacity: 1\n  rate: 1\n  limits: [{{quota: 5, per: day, offset: {written}}}]\n"
        (_, rule), *_ = split(write(tmp_path, "rules.yaml", text))[0]
        assert rule.limits[0].offset_minutes == minutes
