"""The C load generator and reflector of `make bench` speak the codec's current wire format."""

from __future__ import annotations

import re
from pathlib import Path

from sluicegate import codec

BENCH = Path(__file__).resolve().parents[2] / "bench"


def define(source: str, name: str) -> int:
    match = re.search(rf"^#define {name} (\d+)", source, re.MULTILINE)
    assert match, f"#define {name} not found"
    return int(match.group(1))


def test_udpload_builds_requests_of_this_version_padded_to_this_reply_size() -> None:
    source = (BENCH / "udpload.c").read_text()
    assert define(source, "ITEM_REPLY") == codec.RESULT_ITEM.size
    assert define(source, "HDR") == codec.HEADER_SIZE
    assert re.search(rf"buf\[2\] = {codec.VERSION};", source), "udpload must write the codec's VERSION"


def test_udpecho_answers_items_of_this_reply_size() -> None:
    source = (BENCH / "udpecho.c").read_text()
    assert define(source, "ITEM") == codec.RESULT_ITEM.size
