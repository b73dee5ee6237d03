"""Configuration from SLUICEGATE_* environment variables."""

from __future__ import annotations

import dataclasses

import pytest

from sluicegate.config import Config, ConfigError
from sluicegate.rules import DENY_ALL, default_rule


def test_defaults_when_nothing_is_set() -> None:
    config = Config.from_env({})
    assert config == Config()
    assert (config.host, config.port, config.partitions) == ("127.0.0.1", 8080, 4)
    assert (config.store, config.db) == ("sqlite", "sluicegate.db")
    assert config.default_rule == default_rule(100, 10.0)
    assert config.fail_open is True
    assert (config.timeout_ms, config.attempts, config.max_datagram) == (50.0, 3, 8192)
    assert config.admin_token == ""


def test_every_variable_is_read_and_typed() -> None:
    env = {
        "SLUICEGATE_HOST": "0.0.0.0",
        "SLUICEGATE_PORT": "9000",
        "SLUICEGATE_PARTITIONS": "8",
        "SLUICEGATE_STORE": "sqlite",
        "SLUICEGATE_DB": "/var/lib/sluicegate/rules.db",
        "SLUICEGATE_DEFAULT_CAPACITY": "500",
        "SLUICEGATE_DEFAULT_RATE": "2.5",
        "SLUICEGATE_FALLBACK": "deny",
        "SLUICEGATE_TIMEOUT_MS": "12.5",
        "SLUICEGATE_ATTEMPTS": "5",
        "SLUICEGATE_MAX_DATAGRAM": "1400",
        "SLUICEGATE_REPLY_CACHE_MS": "500",
        "SLUICEGATE_ADMIN_TOKEN": "s3cret",
        "SLUICEGATE_POSTGRES_DSN": "host=127.0.0.1 dbname=q",
        "SLUICEGATE_DYNAMODB_RULES_TABLE": "r",
        "SLUICEGATE_DYNAMODB_CHECKPOINTS_TABLE": "c",
        "SLUICEGATE_DYNAMODB_ENDPOINT": "http://127.0.0.1:5000",
        "SLUICEGATE_SYNC_INTERVAL_MS": "250",
        "SLUICEGATE_CHECKPOINT_INTERVAL_MS": "750",
        "SLUICEGATE_NAMESPACE": "sg.internal",
        "SLUICEGATE_PARTITION_ADDRESSES": "10.0.0.1:7000",
        "SLUICEGATE_PARTITION_PORT": "7100",
        "SLUICEGATE_PARTITION": "7",
        "SLUICEGATE_DNS_TTL_S": "2.5",
        "SLUICEGATE_POSTGRES_SECRET": '{"host": "h", "username": "u", "password": "p"}',
    }
    config = Config.from_env(env)
    assert config == Config(
        host="0.0.0.0",
        port=9000,
        partitions=8,
        store="sqlite",
        db="/var/lib/sluicegate/rules.db",
        default_capacity=500,
        default_rate=2.5,
        fallback="deny",
        timeout_ms=12.5,
        attempts=5,
        max_datagram=1400,
        reply_cache_ms=500,
        admin_token="s3cret",
        postgres_dsn="host=127.0.0.1 dbname=q",
        dynamodb_rules_table="r",
        dynamodb_checkpoints_table="c",
        dynamodb_endpoint="http://127.0.0.1:5000",
        sync_interval_ms=250,
        checkpoint_interval_ms=750,
        namespace="sg.internal",
        partition_addresses="10.0.0.1:7000",
        partition_port=7100,
        partition=7,
        dns_ttl_s=2.5,
        postgres_secret='{"host": "h", "username": "u", "password": "p"}',
    )
    assert config.fail_open is False
    assert config.default_rule == default_rule(500, 2.5)
    assert {f"SLUICEGATE_{f.name.upper()}" for f in dataclasses.fields(Config)} == set(env)


def test_empty_values_and_other_variables_are_ignored() -> None:
    config = Config.from_env({"SLUICEGATE_PORT": "", "SLUICEGATE_PARTITIONS": "", "PORT": "1", "sluicegate_port": "2"})
    assert config == Config()


def test_reads_the_process_environment_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLUICEGATE_PARTITIONS", "6")
    monkeypatch.setenv("SLUICEGATE_ADMIN_TOKEN", "from-env")
    config = Config.from_env()
    assert (config.partitions, config.admin_token) == (6, "from-env")


def test_integer_with_surrounding_spaces_is_accepted() -> None:
    assert Config.from_env({"SLUICEGATE_PARTITIONS": " 3 "}).partitions == 3


def test_deny_all_default_rule_is_accepted() -> None:
    config = Config.from_env({"SLUICEGATE_DEFAULT_CAPACITY": "0", "SLUICEGATE_DEFAULT_RATE": "0"})
    assert config.default_rule == DENY_ALL
    assert config.default_rule.admits_anything is False


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("PORT", "http"),
        ("PORT", "80.5"),
        ("PORT", "-1"),
        ("PORT", "65536"),
        ("PARTITIONS", "four"),
        ("PARTITIONS", "0"),
        ("PARTITIONS", "-2"),
        ("DEFAULT_CAPACITY", "1.5"),
        ("DEFAULT_CAPACITY", "-1"),
        ("DEFAULT_CAPACITY", str(2**32)),
        ("DEFAULT_RATE", "fast"),
        ("DEFAULT_RATE", "-0.5"),
        ("DEFAULT_RATE", "nan"),
        ("DEFAULT_RATE", "inf"),
        ("FALLBACK", "maybe"),
        ("STORE", "redis"),
        ("SYNC_INTERVAL_MS", "0"),
        ("FALLBACK", "ALLOW "),
        ("TIMEOUT_MS", "0"),
        ("TIMEOUT_MS", "-5"),
        ("TIMEOUT_MS", "nan"),
        ("TIMEOUT_MS", "inf"),
        ("TIMEOUT_MS", "50ms"),
        ("ATTEMPTS", "0"),
        ("ATTEMPTS", "3.0"),
        ("MAX_DATAGRAM", "511"),
        ("MAX_DATAGRAM", "65508"),
        ("REPLY_CACHE_MS", "2s"),
    ],
)
def test_bad_value_names_the_variable(name: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        Config.from_env({f"SLUICEGATE_{name}": value})
    assert f"SLUICEGATE_{name}" in str(info.value)


@pytest.mark.parametrize(
    ("name", "value"), [("PORT", "0"), ("PORT", "65535"), ("MAX_DATAGRAM", "512"), ("MAX_DATAGRAM", "65507")]
)
def test_boundary_values_are_accepted(name: str, value: str) -> None:
    config = Config.from_env({f"SLUICEGATE_{name}": value})
    assert getattr(config, name.lower()) == int(value)


def test_config_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Config().port = 1  # type: ignore[misc]


def test_reply_cache_must_outlast_the_retry_budget() -> None:
    with pytest.raises(ConfigError, match="SLUICEGATE_REPLY_CACHE_MS"):
        Config.from_env(
            {"SLUICEGATE_TIMEOUT_MS": "100", "SLUICEGATE_ATTEMPTS": "5", "SLUICEGATE_REPLY_CACHE_MS": "500"}
        )
    assert Config.from_env({"SLUICEGATE_REPLY_CACHE_MS": "151"}).reply_cache_ms == 151
