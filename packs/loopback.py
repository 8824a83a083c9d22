"""The loopback HTTP server both provider sandboxes run on (127.0.0.1 only).

A sandbox subclasses :class:`LoopbackSandbox` with its request handler and
its own state object (which must offer ``snapshot()`` and ``reset()``); the
server, the background thread and the context-manager protocol are here.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from pathlib import Path
from typing import Callable, Sequence
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


def serve_process(argv: Sequence[str] | None, *, description: str, secret_flag: str, secret_help: str,
                  build: Callable[[str, int], "LoopbackSandbox"]) -> int:
    """Run one sandbox as a process until SIGTERM/SIGINT; return the exit status (0).

    Command line: ``--port N`` (0 picks a free port on 127.0.0.1), ``<secret_flag> VALUE``
    (required), ``--port-file PATH`` (the bound port is written there atomically once
    listening) and ``--log-level``. ``build(secret, port)`` returns the unstarted sandbox.
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1; 0 picks a free one")
    parser.add_argument(secret_flag, dest="secret", required=True, help=secret_help)
    parser.add_argument("--port-file", type=Path, help="write the bound port here once listening")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    sandbox = build(args.secret, args.port)
    sandbox.start()
    if args.port_file is not None:
        partial = args.port_file.with_name(args.port_file.name + ".partial")
        partial.write_text(f"{sandbox.port}\n", encoding="ascii")
        os.replace(partial, args.port_file)
    try:
        stop.wait()
    finally:
        sandbox.stop()
        logging.getLogger(__name__).info("%s stopped", description)
    return 0


class DispatchingHandler(BaseHTTPRequestHandler):
    """An HTTP/1.1 handler that sends every method to ``self._dispatch(method)``; requests log at DEBUG."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 (http.server naming)
        self._dispatch("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")

    def do_PUT(self) -> None:  # noqa: N802
        self._dispatch("PUT")

    def do_PATCH(self) -> None:  # noqa: N802
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:  # noqa: N802
        self._dispatch("DELETE")

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (stdlib signature)
        logging.getLogger(type(self).__module__).debug("%s %s", self.address_string(), format % args)

    def _dispatch(self, method: str) -> None:
        raise NotImplementedError
