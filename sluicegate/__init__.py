"""Sluicegate: a partitioned leaky-bucket quota service.

The core package. Pure modules (``bucket``, ``rules``, ``routing``, ``codec``)
use the standard library only and take time as an argument; the store
backends, the bucket server, the router and the CLI build on them.
"""

__version__ = "0.1.0"
