"""TCP ports on 127.0.0.1 for the servers a test starts (and for one that nothing answers)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port nothing listens on now (bound, then let go)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_ports(n: int) -> list[int]:
    """`n` distinct ports free on 127.0.0.1 now (held open together, so none repeats)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
