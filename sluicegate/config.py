"""Configuration from ``SLUICEGATE_*`` environment variables, read once, frozen.

Example:
    >>> cfg = Config.from_env({"SLUICEGATE_PARTITIONS": "8", "SLUICEGATE_FALLBACK": "deny"})
    >>> cfg.partitions, cfg.fail_open
    (8, False)
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields

from sluicegate.rules import Rule, RuleError, default_rule

PREFIX = "SLUICEGATE_"


class ConfigError(ValueError):
    """A ``SLUICEGATE_*`` variable has a value we cannot use."""


@dataclass(frozen=True, slots=True)
class Config:
    """Every setting, with its default. The env name is ``SLUICEGATE_`` + upper-case field."""

    host: str = "127.0.0.1"  # where `sluicegate local` serves HTTP
    port: int = 8080
    partitions: int = 4
    store: str = "sqlite"  # sqlite | dynamodb | postgres
    db: str = "sluicegate.db"  # sqlite: the file
    postgres_dsn: str = ""  # postgres: e.g. "host=127.0.0.1 port=5432 dbname=sluicegate user=sluicegate"
    dynamodb_rules_table: str = "sluicegate-rules"
    dynamodb_checkpoints_table: str = "sluicegate-checkpoints"
    dynamodb_endpoint: str = ""  # dynamodb: empty for AWS itself; a URL for a local DynamoDB/moto server
    sync_interval_ms: int = 1000  # how often a bucket server reads the rules that changed
    checkpoint_interval_ms: int = 1000  # how often a bucket server writes the credit of spent buckets
    default_capacity: int = 100  # the rule unknown keys get; 0 and 0 deny all
    default_rate: float = 10.0
    fallback: str = "allow"  # answer when no partition replies: allow | deny
    timeout_ms: float = 50.0  # one UDP attempt; loopback/VPC round trips are well under 1 ms
    attempts: int = 3
    max_datagram: int = 8192  # bytes; larger batches are split
    reply_cache_ms: int = 1000  # how long a partition remembers a reply for retries
    admin_token: str = ""  # the rules admin API answers 401 without it
    # In the cloud: partitions are found as p<i>.<namespace> (Cloud Map private DNS) on partition_port.
    namespace: str = ""
    partition_addresses: str = ""  # instead of a namespace: "host:port,host:port,..." in partition order
    partition_port: int = 7000
    partition: int = 0  # a bucket-server container: the partition it owns
    dns_ttl_s: float = 10.0  # how long the router trusts a resolved partition address
    postgres_secret: str = ""  # postgres: a Secrets Manager JSON (host, port, dbname, username, password)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Config:
        environ = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for spec in fields(cls):
            raw = environ.get(PREFIX + spec.name.upper())
            if raw is None or raw == "":
                continue
            kind = type(spec.default)
            try:
                values[spec.name] = kind(raw)
            except ValueError as exc:
                raise ConfigError(f"{PREFIX}{spec.name.upper()}={raw!r} is not a valid {kind.__name__}") from exc
        config = cls(**values)  # type: ignore[arg-type]
        config.validate()
        return config

    def validate(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError("SLUICEGATE_PORT must be 0 to 65535")
        if self.store not in ("sqlite", "dynamodb", "postgres"):
            raise ConfigError("SLUICEGATE_STORE must be sqlite, dynamodb or postgres")
        if self.store == "postgres" and not (self.postgres_dsn or self.postgres_secret):
            raise ConfigError("SLUICEGATE_STORE=postgres needs SLUICEGATE_POSTGRES_DSN or SLUICEGATE_POSTGRES_SECRET")
        if self.postgres_secret:
            self.postgres_conninfo  # noqa: B018 (validates the secret's JSON now, not at first use)
        if not 1 <= self.partition_port <= 65535:
            raise ConfigError("SLUICEGATE_PARTITION_PORT must be 1 to 65535")
        if not 0 <= self.partition < self.partitions:
            raise ConfigError("SLUICEGATE_PARTITION must be 0 to SLUICEGATE_PARTITIONS - 1")
        if not (math.isfinite(self.dns_ttl_s) and self.dns_ttl_s >= 0):
            raise ConfigError("SLUICEGATE_DNS_TTL_S must be a finite number >= 0")
        if self.reply_cache_ms <= self.timeout_ms * self.attempts:
            # A retry arriving after its reply was forgotten would be charged again.
            raise ConfigError(
                "SLUICEGATE_REPLY_CACHE_MS must exceed SLUICEGATE_TIMEOUT_MS x SLUICEGATE_ATTEMPTS (the retry budget)"
            )
        if self.sync_interval_ms <= 0 or self.checkpoint_interval_ms <= 0:
            raise ConfigError("SLUICEGATE_SYNC_INTERVAL_MS and SLUICEGATE_CHECKPOINT_INTERVAL_MS must be > 0")
        if self.partitions < 1:
            raise ConfigError("SLUICEGATE_PARTITIONS must be at least 1")
        if self.fallback not in ("allow", "deny"):
            raise ConfigError("SLUICEGATE_FALLBACK must be 'allow' or 'deny'")
        if not (math.isfinite(self.timeout_ms) and self.timeout_ms > 0):
            raise ConfigError("SLUICEGATE_TIMEOUT_MS must be a finite number > 0")
        if self.attempts < 1:
            raise ConfigError("SLUICEGATE_ATTEMPTS must be at least 1")
        if not 512 <= self.max_datagram <= 65507:
            raise ConfigError("SLUICEGATE_MAX_DATAGRAM must be 512 to 65507")
        for name, capacity, rate in (("CAPACITY", self.default_capacity, 0), ("RATE", 0, self.default_rate)):
            try:
                default_rule(capacity, rate)
            except RuleError as exc:
                raise ConfigError(f"SLUICEGATE_DEFAULT_{name}: {exc}") from exc

    @property
    def postgres_conninfo(self) -> str:
        """The libpq connection string: SLUICEGATE_POSTGRES_DSN, else one built from the secret.

        The secret is the JSON Secrets Manager keeps for an RDS/Aurora cluster
        (ECS injects it whole into the container's environment).
        """
        if self.postgres_dsn or not self.postgres_secret:
            return self.postgres_dsn
        try:
            secret = json.loads(self.postgres_secret)
            parts = {
                "host": secret["host"],
                "port": secret.get("port", 5432),
                "dbname": secret.get("dbname", "postgres"),
                "user": secret["username"],
                "password": secret["password"],
            }
        except (ValueError, TypeError, KeyError) as exc:
            raise ConfigError(
                "SLUICEGATE_POSTGRES_SECRET must be JSON with host, username and password "
                "(and optionally port and dbname)"
            ) from exc
        return " ".join(f"{name}={_conninfo_quote(value)}" for name, value in parts.items())

    def partition_endpoints(self) -> list[tuple[str, int]]:
        """Where the router finds the partitions: the explicit list, else ``p<i>.<namespace>``."""
        if self.partition_addresses:
            endpoints = []
            for entry in self.partition_addresses.split(","):
                host, _, port = entry.strip().rpartition(":")
                if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
                    raise ConfigError(f"SLUICEGATE_PARTITION_ADDRESSES: expected HOST:PORT, got {entry.strip()!r}")
                endpoints.append((host.strip("[]"), int(port)))
            return endpoints
        if not self.namespace:
            raise ConfigError("set SLUICEGATE_NAMESPACE (Cloud Map) or SLUICEGATE_PARTITION_ADDRESSES")
        return [(f"p{index}.{self.namespace}", self.partition_port) for index in range(self.partitions)]

    @property
    def fail_open(self) -> bool:
        return self.fallback == "allow"

    @property
    def default_rule(self) -> Rule:
        return default_rule(self.default_capacity, self.default_rate)


def _conninfo_quote(value: object) -> str:
    """One libpq conninfo value, quoted so spaces, quotes and backslashes survive."""
    text = str(value).replace("\\", "\\\\").replace("'", "\\'")
    return f"'{text}'"
