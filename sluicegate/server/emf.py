"""CloudWatch Embedded Metric Format lines for a bucket server's counters. Pure.

CloudWatch Logs turns a JSON log line in this shape into metrics, so a
Fargate task needs no agent and no API calls to publish them: print the line.

Example:
    >>> line = encode_emf("Sluicegate", {"Partition": "3"}, {"PartitionChecks": 120}, timestamp_ms=0)
    >>> json.loads(line)["PartitionChecks"]
    120
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

# The partition's counters published as metrics, by metric name.
PUBLISHED = {"PartitionChecks": "checks", "StoreErrors": "store_errors", "WouldDeny": "would_deny", "Keys": "keys"}
# Counters that only grow: publish what they grew by since the previous line. "keys" is a level.
GROWING = frozenset({"checks", "store_errors", "would_deny"})
MAX_ADAPTIVE_LINES = 50  # keys with an adaptive concurrency limit published per interval


def encode_emf(namespace: str, dimensions: Mapping[str, str], values: Mapping[str, float], *, timestamp_ms: int) -> str:
    """One EMF log line: every metric in ``values`` (unit Count) under one dimension set."""
    document: dict[str, object] = {
        "_aws": {
            "Timestamp": timestamp_ms,
            "CloudWatchMetrics": [
                {
                    "Namespace": namespace,
                    "Dimensions": [list(dimensions)],
                    "Metrics": [{"Name": name, "Unit": "Count"} for name in values],
                }
            ],
        },
        **dimensions,
        **values,
    }
    return json.dumps(document, separators=(",", ":"))


def partition_metrics(counters: Mapping[str, int], previous: Mapping[str, int]) -> dict[str, int]:
    """The published values: growth since ``previous`` for growing counters, else the level."""
    values = {}
    for metric, counter in PUBLISHED.items():
        now = counters.get(counter, 0)
        values[metric] = now - previous.get(counter, 0) if counter in GROWING else now
    return values


def adaptive_limits(adaptive: Mapping[bytes, Any], most: int) -> Iterator[tuple[str, int]]:
    """``(key, L)`` of up to ``most`` keys' adaptive concurrency limits (``AdaptiveLimit.limit``)."""
    for count, (key, limit) in enumerate(sorted(adaptive.items())):
        if count == most:
            return
        yield key.decode("utf-8", "replace"), limit.limit
