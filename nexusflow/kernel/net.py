"""Local network helpers for the processes a command starts (test servers bind to 127.0.0.1 only)."""
from __future__ import annotations

import socket

__all__ = ["free_local_port"]


def free_local_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it; the caller binds it next)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
