"""A UDP relay between a client and one partition that counts datagrams and can lose some."""

from __future__ import annotations

import select
import socket
import threading
from collections import Counter

from sluicegate import codec


class Relay:
    """Forwards datagrams to ``target`` and replies back; ``drop_first_request`` / ``drop_first_reply``
    lose the first copy of each request id in that direction (the client must retry with the same id).
    """

    def __init__(self, target: tuple[str, int], *, drop_first_request: bool = False, drop_first_reply: bool = False):
        self.target = target
        self.drop_first_request = drop_first_request
        self.drop_first_reply = drop_first_reply
        self.requests: Counter[int] = Counter()  # request id -> copies received from the client
        self.replies: Counter[int] = Counter()  # request id -> replies received from the partition
        self.items = 0  # checks carried by the requests forwarded
        self.front = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.front.bind(("127.0.0.1", 0))
        self.back = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.back.bind(("127.0.0.1", 0))
        self.address = self.front.getsockname()
        self._client: tuple[str, int] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @property
    def datagrams(self) -> int:
        return sum(self.requests.values())

    def _run(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self.front, self.back], [], [], 0.05)
            for sock in ready:
                data, sender = sock.recvfrom(65535)
                _, request_id, count = codec.decode_header(data)
                if sock is self.front:
                    self._client = sender
                    self.requests[request_id] += 1
                    if self.drop_first_request and self.requests[request_id] == 1:
                        continue
                    self.items += count
                    self.back.sendto(data, self.target)
                else:
                    self.replies[request_id] += 1
                    if self.drop_first_reply and self.replies[request_id] == 1:
                        continue
                    if self._client is not None:
                        self.front.sendto(data, self._client)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.front.close()
        self.back.close()
