"""The router: the HTTP check API in front of the partitions.

``client`` talks UDP to the partitions (hashing, coalescing, retries,
fallback); ``api`` is the HTTP-agnostic check and rules API; ``http`` is a
small asyncio HTTP/1.1 server for ``sluicegate local``. The Lambda entry point
(``functions/router``) reuses ``client`` and ``api``.
"""
