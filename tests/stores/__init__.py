"""One pytest plugin per store backend, each giving a ``<backend>_opener`` fixture.

An opener fixture returns a function that opens a new handle on one fresh,
empty store (the same store every time it is called within a test). The
contract suite (``tests/functional/test_store_contract.py``) runs against
every backend listed in ``BACKENDS``.
"""

BACKENDS = ["sqlite", "postgres", "dynamodb"]
