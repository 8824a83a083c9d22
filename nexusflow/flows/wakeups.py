"""Wake hints: committed Flow work wakes an idle ``flow`` worker on this host instead of its next poll.

A hint is a one-byte datagram to the Unix socket of one listening worker process (each sender takes them in
turn), in a directory named for the database (host, port, name). It carries no work and no authority: a
woken worker still discovers and claims through the durable rows under their fences (seed 004 section
12.1), and a lost hint (a worker on another host, a full socket buffer, a crash between commit and hint)
only leaves the work to the next poll (ARCHITECTURE.md section 8: roles may wake each other when work is
committed). docs/performance.md "Flow runs: wake hints and fewer round trips".

- :func:`hint_after_commit`: once the current transaction commits, hint one listening worker, the next in
  turn (once per transaction and kind).
- :func:`listener`: this process's listener, bound at first use; :meth:`Listener.wait`.
"""
from __future__ import annotations

import atexit
import hashlib
import os
import secrets
import select
import socket
import tempfile

from django.db import connections, transaction

#: A root became ``Runnable`` (a start, a resumed wait, a committed step with a next step).
RUNNABLE = b"r"
#: A wake signal was accepted (``flow.wake`` has a dependency to resolve).
SIGNAL = b"s"
KINDS = (RUNNABLE, SIGNAL)


def directory(using: str = "default") -> str:
    """The hint directory of the database behind ``using``: ``<tmp>/nexusflow-wake-<uid>/<digest>``.

    Two databases (test workers, a bench beside a dev database) never share one, so their workers never
    wake each other.
    """
    cfg = connections[using].settings_dict
    name = f"{cfg.get('HOST') or '127.0.0.1'}:{cfg.get('PORT') or 3306}/{cfg.get('NAME')}"
    return os.path.join(tempfile.gettempdir(), f"nexusflow-wake-{os.getuid()}",
                        hashlib.sha256(name.encode()).hexdigest()[:20])


_sender: socket.socket | None = None
#: Hints this process sent: the next one goes to the next listener in turn.
_turn = 0


def _send(kind: bytes) -> bool:
    """Hint one listening worker other than this process, the next in turn; ``True`` when one took it.

    One worker per commit: waking every idle worker for one run would have all but one discover and claim
    nothing. A worker that is busy finds the work in its next round anyway; a listener whose process ended
    without removing its socket is removed and the next one is tried. Errors are dropped (a hint is only
    an optimization).
    """
    global _sender, _turn
    folder = directory()
    try:
        names = sorted(name for name in os.listdir(folder) if name.endswith(".sock"))
    except OSError:
        return False
    own = os.path.basename(_listener.path) if _listener is not None else None
    names = [name for name in names if name != own]
    if not names:
        return False
    if _sender is None:
        _sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        _sender.setblocking(False)
    _turn += 1
    for offset in range(len(names)):
        path = os.path.join(folder, names[(_turn + offset) % len(names)])
        try:
            _sender.sendto(kind, path)
            return True
        except (BlockingIOError, InterruptedError):
            return True  # its buffer is full: it has hints to read already
        except (ConnectionRefusedError, FileNotFoundError):
            try:
                os.unlink(path)  # nobody is bound to it: its process ended without removing it
            except OSError:
                pass
        except OSError:
            pass
    return False


def hint_after_commit(kind: bytes = RUNNABLE, using: str = "default") -> None:
    """Hint one listening ``flow`` worker once the current transaction commits (now, outside one).

    Registered once per transaction and kind; a rolled-back transaction hints nothing.

    Args:
        kind: :data:`RUNNABLE` or :data:`SIGNAL`.

    Raises:
        ValueError: another ``kind``.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown wake hint {kind!r}")
    conn = connections[using]
    send = _SENDERS[kind]
    if conn.in_atomic_block and any(entry[1] is send for entry in conn.run_on_commit):
        return
    transaction.on_commit(send, using=using, robust=True)


_SENDERS = {kind: (lambda kind=kind: _send(kind)) for kind in KINDS}


class Listener:
    """This process's hint socket (bound by :func:`listener`, removed at exit)."""

    def __init__(self, path: str, sock: socket.socket):
        self.path = path
        self.sock = sock

    def wait(self, seconds: float) -> frozenset[bytes]:
        """Block until a hint arrives or ``seconds`` pass; return the kinds read (every pending hint is read).

        Returns:
            The hint kinds received (empty: none within ``seconds``).
        """
        ready, _w, _x = select.select([self.sock], [], [], max(0.0, seconds))
        if not ready:
            return frozenset()
        return self.drain()

    def drain(self) -> frozenset[bytes]:
        """Read every pending hint without blocking; return their kinds."""
        kinds = set()
        while True:
            try:
                kinds.add(self.sock.recv(16)[:1])
            except (BlockingIOError, InterruptedError):
                return frozenset(kinds)
            except OSError:
                return frozenset(kinds)

    def close(self) -> None:
        try:
            self.sock.close()
        finally:
            try:
                os.unlink(self.path)
            except OSError:
                pass


_listener: Listener | None = None


def listener() -> Listener | None:
    """This process's listener, bound at first call (``None`` when no Unix socket can be bound here)."""
    global _listener
    if _listener is None:
        folder = directory()
        path = os.path.join(folder, f"{os.getpid()}-{secrets.token_hex(4)}.sock")
        try:
            os.makedirs(folder, mode=0o700, exist_ok=True)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sock.bind(path)
            sock.setblocking(False)
        except OSError:
            return None
        _listener = Listener(path, sock)
        atexit.register(_listener.close)
    return _listener
