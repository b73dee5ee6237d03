"""Partition names resolved with a TTL (a warm router Lambda follows moved tasks)."""

from __future__ import annotations

import json
import socket

import pytest
from psycopg.conninfo import conninfo_to_dict

from sluicegate.config import Config, ConfigError
from sluicegate.directory import UNREACHABLE, PartitionDirectory


class Dns:
    def __init__(self, records: dict[str, str]) -> None:
        self.records = records
        self.lookups = 0

    def __call__(self, host: str, port: int) -> tuple[str, int]:
        self.lookups += 1
        if host not in self.records:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return self.records[host], port


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


ENDPOINTS = [("p0.ns", 7000), ("p1.ns", 7000)]


def test_names_are_looked_up_again_only_after_the_ttl() -> None:
    dns, clock = Dns({"p0.ns": "10.0.0.1", "p1.ns": "10.0.0.2"}), Clock()
    directory = PartitionDirectory(ENDPOINTS, ttl_s=10, resolve=dns, clock=clock)
    assert directory.addresses() == [("10.0.0.1", 7000), ("10.0.0.2", 7000)]
    clock.now += 9.9
    dns.records["p1.ns"] = "10.0.0.9"  # the task was replaced
    assert directory.addresses()[1] == ("10.0.0.2", 7000) and dns.lookups == 2
    clock.now += 0.1
    assert directory.addresses()[1] == ("10.0.0.9", 7000) and dns.lookups == 4


def test_expire_forces_a_lookup_at_once() -> None:
    dns = Dns({"p0.ns": "10.0.0.1", "p1.ns": "10.0.0.2"})
    directory = PartitionDirectory(ENDPOINTS, ttl_s=60, resolve=dns, clock=Clock())
    directory.addresses()
    dns.records["p0.ns"] = "10.0.0.7"
    directory.expire()
    assert directory.addresses()[0] == ("10.0.0.7", 7000)


def test_a_failed_lookup_keeps_the_last_good_address_and_a_never_resolved_name_is_unreachable() -> None:
    dns, clock = Dns({"p0.ns": "10.0.0.1"}), Clock()
    directory = PartitionDirectory(ENDPOINTS, ttl_s=1, resolve=dns, clock=clock)
    assert directory.addresses() == [("10.0.0.1", 7000), UNREACHABLE]
    assert directory.unresolved() == 1 and directory.failures == 1
    del dns.records["p0.ns"]
    clock.now += 1
    assert directory.addresses()[0] == ("10.0.0.1", 7000)
    assert directory.failures == 3


def test_config_names_partitions_in_the_namespace_or_takes_a_list() -> None:
    config = Config.from_env({"SLUICEGATE_NAMESPACE": "sg.internal", "SLUICEGATE_PARTITIONS": "3"})
    assert config.partition_endpoints() == [(f"p{i}.sg.internal", 7000) for i in range(3)]
    listed = Config.from_env({"SLUICEGATE_PARTITION_ADDRESSES": "10.0.0.1:7001, [::1]:7002"})
    assert listed.partition_endpoints() == [("10.0.0.1", 7001), ("::1", 7002)]
    with pytest.raises(ConfigError, match="SLUICEGATE_NAMESPACE"):
        Config.from_env({}).partition_endpoints()
    with pytest.raises(ConfigError, match="expected HOST:PORT"):
        Config.from_env({"SLUICEGATE_PARTITION_ADDRESSES": "10.0.0.1:99999"}).partition_endpoints()


def test_postgres_settings_from_a_secrets_manager_secret() -> None:
    fields = {"host": "db.cluster", "port": 5432, "dbname": "sg", "username": "app", "password": "p'w d\\"}
    config = Config.from_env({"SLUICEGATE_STORE": "postgres", "SLUICEGATE_POSTGRES_SECRET": json.dumps(fields)})
    # What libpq will read back from the connection string.
    assert conninfo_to_dict(config.postgres_conninfo) == {
        "host": "db.cluster",
        "port": "5432",
        "dbname": "sg",
        "user": "app",
        "password": "p'w d\\",
    }
    with pytest.raises(ConfigError, match="SLUICEGATE_POSTGRES_SECRET must be JSON"):
        Config.from_env({"SLUICEGATE_STORE": "postgres", "SLUICEGATE_POSTGRES_SECRET": '{"host": "x"}'})
    with pytest.raises(ConfigError, match="POSTGRES_DSN or SLUICEGATE_POSTGRES_SECRET"):
        Config.from_env({"SLUICEGATE_STORE": "postgres"})
