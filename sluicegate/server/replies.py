"""Reply cache: answers a repeated request id without charging again. Pure.

Entries expire one by one, oldest first, as new ones arrive: expiry never
frees a whole window of replies at once (which stalled the loop for
milliseconds at high rates).

Example:
    >>> cache = ReplyCache(ttl_ns=1_000)
    >>> ident = (("10.0.0.1", 5000), 7)  # (sender, request id)
    >>> cache.put(ident, b"reply", now_ns=0)
    >>> cache.get(ident, now_ns=999)
    b'reply'
    >>> cache.get(ident, now_ns=1_000) is None
    True
"""

from __future__ import annotations

from collections import deque
from typing import Any

Ident = tuple[Any, int]  # (sender address, request id)


class ReplyCache:
    """Replies by (address, request id), kept ``ttl_ns`` after they were sent."""

    def __init__(self, ttl_ns: int) -> None:
        self.ttl_ns = ttl_ns
        self._replies: dict[Ident, bytes] = {}
        self._expiry: deque[tuple[int, Ident]] = deque()  # in insertion (= expiry) order

    def __len__(self) -> int:
        return len(self._replies)

    def get(self, ident: Ident, now_ns: int) -> bytes | None:
        """The reply sent to ``ident`` within the last ``ttl_ns``, else None."""
        reply = self._replies.get(ident)
        if reply is not None and self._expiry[0][0] <= now_ns:
            self._expire(now_ns)  # the entry may be one of the expired ones
            reply = self._replies.get(ident)
        return reply

    def put(self, ident: Ident, reply: bytes, now_ns: int) -> None:
        expiry = self._expiry
        if expiry and expiry[0][0] <= now_ns:
            self._expire(now_ns)
        self._replies[ident] = reply
        expiry.append((now_ns + self.ttl_ns, ident))

    def _expire(self, now_ns: int) -> None:
        # Amortised O(1): each entry is appended once and expired once.
        expiry = self._expiry
        replies = self._replies
        while expiry and expiry[0][0] <= now_ns:
            _, ident = expiry.popleft()
            replies.pop(ident, None)
