"""Container health check: the partition answers a STATS datagram on loopback.

Exit status 0 when it answers within about a second (three tries), else 1,
as ECS and Docker health checks expect. Run as ``python /app/healthcheck.py``.
"""

from __future__ import annotations

import os
import random
import socket
import sys

from sluicegate import codec

TRIES = 3
WAIT_S = 0.3


def partition_answers(port: int) -> bool:
    request_id = random.getrandbits(64)
    request = codec.encode_stats_request(request_id)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(WAIT_S)
        for _ in range(TRIES):
            sock.sendto(request, ("127.0.0.1", port))
            try:
                while True:
                    reply = sock.recv(65535)
                    try:
                        answered_id, _ = codec.decode_stats_reply(reply)
                    except codec.MalformedDatagram:
                        continue
                    if answered_id == request_id:
                        return True
            except TimeoutError:
                continue
            except OSError:  # connection refused (ICMP): nothing listens yet
                continue
    return False


def main() -> int:
    port = int(os.environ.get("SLUICEGATE_PARTITION_PORT", "7000"))
    if partition_answers(port):
        return 0
    print(f"partition on udp 127.0.0.1:{port} did not answer", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
