"""DynamoDB store for tests: moto in-process, or a moto server on 127.0.0.1 for other processes.

* ``dynamodb_opener``: a fresh pair of tables per test under ``moto.mock_aws``
  (in-process, no sockets), for the contract suite.
* ``moto_server`` (session): moto's threaded HTTP server on 127.0.0.1, for a
  process that must reach DynamoDB through a real endpoint, and for outages:
  ``stop()`` closes the port (clients get "connection refused" at once),
  ``start()`` reopens it on the same port with the data intact.
* ``dynamodb_server_tables``: a fresh pair of tables on that server, with the
  environment a child process needs (:meth:`ServerTables.env`).

The moto server keeps its data in this process's moto backends, which a
``mock_aws`` started with ``reset=True`` (its default) wipes; so create tables
per test (``dynamodb_server_tables``) rather than once per session.
``dynamodb_opener`` starts its mock with ``reset=False`` and deletes its own
tables, so it never wipes a server's data.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from moto import mock_aws

from sluicegate.store import RuleStore, StoreError
from sluicegate.store.dynamodb import DynamoRuleStore

REGION = "us-east-1"
#: Placeholder credentials: moto checks the shape of a signature, never the keys.
AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": REGION,
    "AWS_REGION": REGION,
    "AWS_EC2_METADATA_DISABLED": "true",  # never look for an instance role
    "AWS_CONFIG_FILE": "/nonexistent/aws-config",  # ignore the developer's ~/.aws
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials",
}
_AWS_UNSET = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_DYNAMODB")


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Fake AWS credentials and region in this process's environment, for this test."""
    for name in _AWS_UNSET:
        monkeypatch.delenv(name, raising=False)
    for name, value in AWS_ENV.items():
        monkeypatch.setenv(name, value)
    return dict(AWS_ENV)


def _table_names() -> tuple[str, str]:
    suffix = uuid.uuid4().hex[:12]
    return f"rules-{suffix}", f"checkpoints-{suffix}"


def _drop_tables(store: DynamoRuleStore) -> None:
    for table in (store.rules_table, store.checkpoints_table):
        with contextlib.suppress(Exception):
            store._call("delete_table", TableName=table)
    with contextlib.suppress(StoreError):
        store.close()


@pytest.fixture
def dynamodb_opener(aws_env: dict[str, str]) -> Iterator[Callable[[], RuleStore]]:
    """Opens handles on one fresh pair of moto tables (in-process ``mock_aws``)."""
    mock = mock_aws()
    mock.start(reset=False)
    rules_table, checkpoints_table = _table_names()
    admin = DynamoRuleStore(rules_table=rules_table, checkpoints_table=checkpoints_table)
    handles: list[DynamoRuleStore] = []

    def open_() -> RuleStore:
        handles.append(DynamoRuleStore(rules_table=rules_table, checkpoints_table=checkpoints_table))
        return handles[-1]

    try:
        admin.migrate()
        yield open_
    finally:
        for handle in handles:
            with contextlib.suppress(StoreError):
                handle.close()
        _drop_tables(admin)
        mock.stop(remove_data=False)


#: The rules table of the release before policies: no pattern index (tests/stores/contract.py: ``legacy``).
OLD_RULES_INDEX = {
    "IndexName": "by-updated-at",
    "KeySchema": [{"AttributeName": "shard", "KeyType": "HASH"}, {"AttributeName": "updated_at", "KeyType": "RANGE"}],
    "Projection": {"ProjectionType": "INCLUDE", "NonKeyAttributes": ["capacity", "rate", "deleted"]},
}


def _old_rule_item(key: str, capacity: int, rate: float, updated_at: float, deleted: bool) -> dict[str, Any]:
    return {
        "key": {"S": key},
        "capacity": {"N": str(capacity)},
        "rate": {"N": repr(rate)},
        "updated_at": {"N": repr(updated_at)},
        "deleted": {"BOOL": deleted},
        "shard": {"S": "rules"},
    }


@pytest.fixture
def dynamodb_legacy(aws_env: dict[str, str]) -> Iterator[Callable[..., Callable[[], RuleStore]]]:
    """Seeds moto tables laid out as in the release before policies; returns an opener on them."""
    mock = mock_aws()
    mock.start(reset=False)
    rules_table, checkpoints_table = _table_names()
    admin = DynamoRuleStore(rules_table=rules_table, checkpoints_table=checkpoints_table)

    def seed(rules: list[tuple], checkpoints: list[tuple]) -> Callable[[], RuleStore]:
        client = admin._client
        client.create_table(
            TableName=rules_table,
            BillingMode="PAY_PER_REQUEST",
            AttributeDefinitions=[
                {"AttributeName": "key", "AttributeType": "S"},
                {"AttributeName": "shard", "AttributeType": "S"},
                {"AttributeName": "updated_at", "AttributeType": "N"},
            ],
            KeySchema=[{"AttributeName": "key", "KeyType": "HASH"}],
            GlobalSecondaryIndexes=[OLD_RULES_INDEX],
        )
        client.create_table(
            TableName=checkpoints_table,
            BillingMode="PAY_PER_REQUEST",
            AttributeDefinitions=[{"AttributeName": "key", "AttributeType": "S"}],
            KeySchema=[{"AttributeName": "key", "KeyType": "HASH"}],
        )
        client.update_time_to_live(
            TableName=checkpoints_table, TimeToLiveSpecification={"Enabled": True, "AttributeName": "ttl"}
        )
        for rule in rules:
            client.put_item(TableName=rules_table, Item=_old_rule_item(*rule))
        for key, credit, at_ns, expires_ns in checkpoints:
            item = {"key": {"S": key}, "credit": {"N": str(credit)}, "at_ns": {"N": str(at_ns)}}
            client.put_item(TableName=checkpoints_table, Item={**item, "expires_ns": {"N": str(expires_ns)}})
        return lambda: DynamoRuleStore(rules_table=rules_table, checkpoints_table=checkpoints_table)

    try:
        yield seed
    finally:
        _drop_tables(admin)
        mock.stop(remove_data=False)


class MotoEndpoint:
    """moto's ``ThreadedMotoServer`` on 127.0.0.1 that can be stopped and started again on its port."""

    def __init__(self) -> None:
        self.host = "127.0.0.1"
        self.port = 0  # chosen by the first start, kept by the later ones
        self._server: Any = None  # moto.server.ThreadedMotoServer while running

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._server is not None

    def start(self) -> None:
        """Serve (again) on the same port; the data of before a stop() is still there."""
        if self._server is not None:
            return
        if self.port:
            # ThreadedMotoServer binds in its thread and would wait forever on a clash: check here.
            with socket.socket() as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind((self.host, self.port))
        from moto.server import ThreadedMotoServer  # imports Flask: only when a test needs it

        server = ThreadedMotoServer(self.host, self.port, verbose=False)
        server.start()
        self.port = server.get_host_and_port()[1]
        self._server = server

    def stop(self) -> None:
        """Close the port: new calls fail at once with "connection refused", like a store that is down."""
        server, self._server = self._server, None
        if server is None:
            return
        server.stop()
        # stop() leaves the listening socket open (calls would hang, and the port stay taken).
        listener = getattr(server, "_server", None)
        if listener is not None:
            listener.server_close()

    def env(self) -> dict[str, str]:
        """Environment for a child process that talks to this server (fake AWS credentials)."""
        return {**AWS_ENV, "SLUICEGATE_STORE": "dynamodb", "SLUICEGATE_DYNAMODB_ENDPOINT": self.url}


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoEndpoint]:
    """One moto server for the session (see :class:`MotoEndpoint`); started, and left started after each use."""
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    endpoint = MotoEndpoint()
    endpoint.start()
    yield endpoint
    endpoint.stop()


@dataclass
class ServerTables:
    """A fresh pair of tables on the moto server."""

    server: MotoEndpoint
    rules_table: str
    checkpoints_table: str

    def open(self, **options: object) -> DynamoRuleStore:
        """A new handle on these tables (``options``: DynamoRuleStore keyword arguments)."""
        return DynamoRuleStore(
            rules_table=self.rules_table,
            checkpoints_table=self.checkpoints_table,
            endpoint=self.server.url,
            **options,  # type: ignore[arg-type]
        )

    def env(self) -> dict[str, str]:
        """``SLUICEGATE_*`` and ``AWS_*`` variables that point a child process at these tables."""
        return {
            **self.server.env(),
            "SLUICEGATE_DYNAMODB_RULES_TABLE": self.rules_table,
            "SLUICEGATE_DYNAMODB_CHECKPOINTS_TABLE": self.checkpoints_table,
        }


@pytest.fixture
def dynamodb_server_tables(moto_server: MotoEndpoint, aws_env: dict[str, str]) -> Iterator[ServerTables]:
    """Fresh tables on the session's moto server; the server is running again after the test."""
    moto_server.start()
    tables = ServerTables(moto_server, *_table_names())
    admin = tables.open()
    admin.migrate()
    yield tables
    moto_server.start()  # a test that stopped it
    _drop_tables(admin)
