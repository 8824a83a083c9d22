"""The loopback HTTP server both provider sandboxes run on (127.0.0.1 only).

A sandbox subclasses :class:`LoopbackSandbox` with its request handler and
its own state object (which must offer ``snapshot()`` and ``reset()``); the
server, the background thread and the context-manager protocol are here.
"""
from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HOST = "127.0.0.1"
logger = logging.getLogger(__name__)


class LoopbackServer(ThreadingHTTPServer):
    """A threading HTTP server whose handlers reach the sandbox state as ``self.server.state``."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], state: Any):
        super().__init__(address, handler)
        self.state = state


class LoopbackSandbox:
    """An in-process sandbox on ``127.0.0.1``, served from a daemon thread.

    Subclasses set :attr:`handler_class` and :attr:`thread_name` and pass their
    state object to ``__init__``.
    """

    handler_class: type[BaseHTTPRequestHandler]
    thread_name = "sandbox"

    def __init__(self, state: Any, *, port: int = 0):
        """``port`` 0 picks a free port.

        Raises:
            ValueError: a port outside 0-65535.
        """
        if not 0 <= port <= 65535:
            raise ValueError(f"port must be 0-65535, got {port}")
        self._state = state
        self._requested_port = port
        self._server: LoopbackServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound TCP port. Raises RuntimeError when not started."""
        if self._server is None:
            raise RuntimeError("sandbox is not running")
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>``, no trailing slash. Raises RuntimeError when not started."""
        return f"http://{HOST}:{self.port}"

    def start(self) -> str:
        """Bind, serve in a background thread and return the base URL.

        Raises:
            RuntimeError: already started.
            OSError: the port cannot be bound.
        """
        if self._server is not None:
            raise RuntimeError("sandbox already started")
        server = LoopbackServer((HOST, self._requested_port), self.handler_class, self._state)
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                                  name=self.thread_name, daemon=True)
        thread.start()
        self._server, self._thread = server, thread
        logger.info("%s listening on %s", self.thread_name, self.base_url)
        return self.base_url

    def stop(self) -> None:
        """Stop serving and close the listening socket; a no-op when not running."""
        server, thread = self._server, self._thread
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join(timeout=5)
        self._server, self._thread = None, None

    def state(self) -> dict[str, Any]:
        """Return the same document as ``GET /_sandbox/state``."""
        return self._state.snapshot()

    def reset(self) -> None:
        """Forget everything the sandbox holds (see the subclass)."""
        self._state.reset()

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
