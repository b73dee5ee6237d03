"""Sluicegate's Python SDK: ask "may key K spend C units now?" from an application.

* :class:`Client` / :class:`AsyncClient`: over the HTTP API (kept-alive connections).
* :class:`DirectClient` / :class:`AsyncDirectClient`: straight to the partitions over UDP
  (inside the VPC, or against ``sluicegate local``), skipping the router.
* Every client also takes concurrency leases: ``acquire``, ``release`` (a decision or a
  :class:`Lease`), ``with client.lease(key) as decision:``, and checks that may wait (``max_wait``).
* :mod:`sluicegate_sdk.wsgi`, :mod:`sluicegate_sdk.asgi`: ``RateLimitMiddleware``;
  :func:`sluicegate_sdk.decorators.rate_limited`; :mod:`sluicegate_sdk.keys`: key functions.

Example::

    from sluicegate_sdk import Client

    client = Client("http://127.0.0.1:8080", timeout=0.5, on_error="allow")
    decision = client.check("alice", cost=1)
    decision.allowed, decision.remaining, decision.retry_after, decision.fallback
    with client.lease("db", max_wait=0.25) as seat:
        if seat.allowed:
            ...  # at most the key's concurrency limit of these blocks run at once
"""

from sluicegate.decision import Decision
from sluicegate_sdk.aio import AsyncClient
from sluicegate_sdk.checks import CheckError
from sluicegate_sdk.client import Client
from sluicegate_sdk.direct import DirectClient
from sluicegate_sdk.direct_async import AsyncDirectClient
from sluicegate_sdk.leases import Lease

__all__ = ["AsyncClient", "AsyncDirectClient", "CheckError", "Client", "Decision", "DirectClient", "Lease"]
__version__ = "0.1.0"
