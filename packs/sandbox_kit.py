"""The kit every loopback provider sandbox is built from (127.0.0.1 only, no provider knowledge).

A sandbox is three pieces, each subclassing one class here:

- its state, a :class:`SandboxState` dataclass: the shared secret, one lock,
  a :class:`FaultScript` (the scripted faults the next requests meet) and a
  :class:`RequestLog` (every API request, counted and logged one by one),
  plus whatever the provider remembers (``snapshot()`` and ``forget()``);
- its request handler, a :class:`SandboxHandler`: it reads the body, answers
  the control routes under ``/_sandbox/`` (state, reset, faults and, when
  :attr:`SandboxHandler.request_log_control` is set, the request log),
  counts every other request and hands it to ``serve()``; a
  :class:`Rejected` raised anywhere becomes that one response, any other
  error a 500;
- its in-process server, a :class:`LoopbackSandbox`: bind, serve from a
  daemon thread, stop, the context-manager protocol and ``set_faults``.

:func:`serve_process` runs any sandbox as a process (``python -m ...``).
The provider's answers (its error bodies, what a fault looks like on the
wire) stay in the sandbox; this module only says when a fault fires.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, urlsplit

HOST = "127.0.0.1"
#: The path prefix of the test controls; requests under it are never counted or logged.
CONTROL_PREFIX = "/_sandbox/"
#: The longest ``delay_seconds`` the write faults accept.
MAX_DELAY_SECONDS = 60.0
logger = logging.getLogger(__name__)


class Rejected(Exception):
    """A request error that maps to one HTTP response.

    Args:
        status: the HTTP status.
        body: the JSON payload, already in the provider's error shape (``None``: no body).
        headers: extra response headers.
        message: the human text (``str(exc)``), for callers that turn it into a ``ValueError``.
    """

    def __init__(self, status: int, body: Any, headers: dict[str, str] | None = None, *, message: str = ""):
        super().__init__(message)
        self.status = status
        self.body = body
        self.headers = headers or {}


class FaultError(ValueError):
    """A faults document that names an unknown fault or holds an out-of-range value."""


# --- scripted faults -----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Count:
    """A fault armed for the next ``N`` requests it applies to (``{name: N}``, N >= 0)."""

    name: str

    def initial(self) -> int:
        return 0

    def parse(self, value: Any) -> int:
        return _count(value, self.name)

    def render(self, value: int) -> int:
        return value


@dataclass(frozen=True, slots=True)
class StatusCount:
    """The next ``N`` requests it applies to answer status ``S`` (``{name: {"status": S, "count": N}}``).

    ``S`` is 400-599; ``count`` defaults to 1; ``status`` is required unless
    ``default_status`` is given. An optional ``"headers": {name: value}``
    (text) is sent with each such answer (a ``Retry-After``, a rate-limit scope).
    """

    name: str
    default_status: int | None = None

    def initial(self) -> tuple[int, int, dict[str, str]]:
        return (503, 0, {})

    def parse(self, value: Any) -> tuple[int, int, dict[str, str]]:
        if not isinstance(value, dict) or set(value) - {"status", "count", "headers"} or (
                self.default_status is None and "status" not in value):
            raise FaultError(f'{self.name} must be {{"status": S, "count": N}}')
        status = value.get("status", self.default_status)
        if isinstance(status, bool) or not isinstance(status, int) or not 400 <= status <= 599:
            raise FaultError(f"{self.name}.status must be an HTTP status 400-599")
        headers = value.get("headers", {})
        if not isinstance(headers, dict) or not all(isinstance(k, str) and isinstance(v, str) and k and v.isprintable()
                                                    for k, v in headers.items()):
            raise FaultError(f"{self.name}.headers must map header names to text values")
        return (status, _count(value.get("count", 1), f"{self.name}.count"), dict(headers))

    def render(self, value: tuple[int, int, dict[str, str]]) -> dict[str, Any]:
        rendered: dict[str, Any] = {"status": value[0], "count": value[1]}
        if value[2]:
            rendered["headers"] = dict(value[2])
        return rendered


@dataclass(frozen=True, slots=True)
class Seconds:
    """A delay in force until changed (``{name: X}``, 0 <= X <= ``maximum``, seconds)."""

    name: str
    maximum: float = MAX_DELAY_SECONDS

    def initial(self) -> float:
        return 0.0

    def parse(self, value: Any) -> float:
        if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
                or not 0 <= value <= self.maximum):
            raise FaultError(f"{self.name} must be 0-{self.maximum:g}")
        return float(value)

    def render(self, value: float) -> float:
        return value


Fault = Count | StatusCount | Seconds


class FaultScript:
    """The faults a sandbox declares and the values in force; guard it with the state's lock.

    ``as_dict()`` is the ``GET /_sandbox/faults`` document (one key per
    declared fault, in declaration order); ``apply(document)`` merges a
    ``POST /_sandbox/faults`` document all or nothing.
    """

    def __init__(self, *faults: Fault):
        self._faults: dict[str, Fault] = {fault.name: fault for fault in faults}
        self._values: dict[str, Any] = {}
        self.reset()

    def reset(self) -> None:
        """Disarm every fault."""
        self._values = {name: fault.initial() for name, fault in self._faults.items()}

    def as_dict(self) -> dict[str, Any]:
        return {name: fault.render(self._values[name]) for name, fault in self._faults.items()}

    def apply(self, document: Any) -> dict[str, Any]:
        """Validate ``document`` and merge it; return :meth:`as_dict`.

        Raises:
            FaultError: not an object, an unknown fault or a bad value (nothing is changed).
        """
        if not isinstance(document, dict):
            raise FaultError("faults must be a JSON object")
        unknown = sorted(set(document) - set(self._faults))
        if unknown:
            raise FaultError(f"unknown fault(s): {', '.join(unknown)}")
        parsed = {name: self._faults[name].parse(value) for name, value in document.items()}
        self._values.update(parsed)
        return self.as_dict()

    def take(self, name: str) -> bool:
        """Consume one arming of the :class:`Count` fault ``name``; ``False`` when it is not armed."""
        if self._values[name] > 0:
            self._values[name] -= 1
            return True
        return False

    def take_all(self, name: str) -> int:
        """Return the :class:`Count` fault ``name``'s value and disarm it (0: not armed)."""
        value, self._values[name] = self._values[name], 0
        return value

    def take_status(self, name: str) -> int | None:
        """Consume one arming of the :class:`StatusCount` fault ``name``: its status, or ``None``."""
        status, count, headers = self._values[name]
        if count <= 0:
            return None
        self._values[name] = (status, count - 1, headers)
        return status

    def status_headers(self, name: str) -> dict[str, str]:
        """The headers the :class:`StatusCount` fault ``name`` sends with its answers (``{}``: none)."""
        return dict(self._values[name][2])

    def seconds(self, name: str) -> float:
        """The :class:`Seconds` fault ``name`` in force (0.0: none)."""
        return self._values[name]

    def wait(self, name: str) -> None:
        """Sleep for the :class:`Seconds` fault ``name`` (a slow provider); call it without the state lock."""
        delay = self._values[name]
        if delay:
            time.sleep(delay)


def write_faults() -> FaultScript:
    """The faults of a sandbox whose writes commit: what the next create/update requests meet.

    ``drop_response_after_commit``: the next N executed writes are performed,
    then the connection is closed without a response; ``fail_before_commit``
    ``{"status": S, "count": N}``: the next N writes answer S and are not
    executed; ``delay_seconds``: every write waits X seconds (0-60) before it
    is executed, until changed.
    """
    return FaultScript(Count("drop_response_after_commit"), StatusCount("fail_before_commit"),
                       Seconds("delay_seconds"))


# --- request counters ----------------------------------------------------------------------------------------
class RequestLog:
    """Every API request in arrival order; guard it with the state's lock.

    An entry is ``{"seq": n (1, 2, ...), "method", "path" (without the query),
    "body_sha256": hex SHA-256 of the exact body bytes (of b"" when none)}``;
    ``by_route()`` counts the same requests by ``"<METHOD> <path>"``.
    """

    def __init__(self) -> None:
        self._entries: list[dict[str, Any]] = []
        self._by_route: dict[str, int] = {}

    def record(self, method: str, path: str, body: bytes) -> None:
        self._entries.append({"seq": len(self._entries) + 1, "method": method, "path": path,
                              "body_sha256": hashlib.sha256(body).hexdigest()})
        route = f"{method} {path}"
        self._by_route[route] = self._by_route.get(route, 0) + 1

    @property
    def count(self) -> int:
        return len(self._entries)

    def by_route(self) -> dict[str, int]:
        return dict(self._by_route)

    def entries(self) -> list[dict[str, Any]]:
        return [dict(entry) for entry in self._entries]

    def clear(self) -> None:
        self._entries.clear()
        self._by_route.clear()


@dataclass(slots=True)
class SandboxState:
    """What every sandbox remembers; a subclass adds the provider's rows and guards them with ``lock``.

    Subclasses implement ``snapshot()`` (the ``GET /_sandbox/state`` document,
    taking the lock) and ``forget()`` (drop the provider's rows; the lock is held).
    """

    secret: str
    faults: FaultScript
    lock: threading.Lock = field(default_factory=threading.Lock)
    requests: RequestLog = field(default_factory=RequestLog)

    def snapshot(self) -> dict[str, Any]:
        raise NotImplementedError

    def forget(self) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        """Forget the provider's rows, disarm every fault and clear the request log."""
        with self.lock:
            self.forget()
            self.faults.reset()
            self.requests.clear()

    def apply_faults(self, document: Any) -> dict[str, Any]:
        """Merge a faults document (see :meth:`FaultScript.apply`). Raises FaultError."""
        with self.lock:
            return self.faults.apply(document)

    def faults_in_force(self) -> dict[str, Any]:
        with self.lock:
            return self.faults.as_dict()

    def log(self) -> list[dict[str, Any]]:
        """A copy of the request log, oldest first."""
        with self.lock:
            return self.requests.entries()


# --- the HTTP side -------------------------------------------------------------------------------------------
class LoopbackServer(ThreadingHTTPServer):
    """A threading HTTP server whose handlers reach the sandbox state as ``self.server.state``."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], state: Any):
        super().__init__(address, handler)
        self.state = state


class SandboxHandler(BaseHTTPRequestHandler):
    """An HTTP/1.1 handler: body, control routes, request counting and error mapping; ``serve()`` does the rest.

    Subclasses implement ``serve(method, url, body)`` (the provider's API),
    ``invalid(message)`` (the provider's 400 body), ``unknown_control(method,
    path)`` (a :class:`Rejected` for an unknown control route) and
    ``internal_error()`` (the 500 body), and may set the class attributes below.
    """

    protocol_version = "HTTP/1.1"
    server: LoopbackServer
    #: ``Content-Type`` of every response with a body.
    content_type = "application/json"
    #: The largest ``Content-Length`` accepted (bytes); a larger one is a 400 and closes the connection.
    max_body_bytes = 1_000_000
    #: Refuse a ``Transfer-Encoding`` body with 411 (else it is read as empty).
    refuse_chunked = True
    #: Count and log every request outside the control routes in ``state.requests``.
    counts_requests = True
    #: Serve ``GET /_sandbox/requests`` -> ``{"requests": [<request log entry>, ...]}``.
    request_log_control = False

    def do_GET(self) -> None:  # http.server naming
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def log_message(self, format: str, *args: Any) -> None:  # stdlib signature
        self._logger().debug("%s %s", self.address_string(), format % args)

    # -- what a sandbox provides ----------------------------------------------------------------------------
    def serve(self, method: str, url: SplitResult, body: bytes) -> None:
        raise NotImplementedError

    def invalid(self, message: str) -> Any:
        raise NotImplementedError

    def unknown_control(self, method: str, path: str) -> Rejected:
        raise NotImplementedError

    def internal_error(self) -> Any:
        raise NotImplementedError

    def extra_control(self, method: str, path: str, body: bytes) -> Any:
        """The payload of a sandbox's own control route; by default every other route is unknown."""
        raise self.unknown_control(method, path)

    def reset_answer(self) -> Any:
        """The payload ``POST /_sandbox/reset`` answers."""
        return {"reset": True}

    def extra_headers(self) -> dict[str, str]:
        """Headers sent on every response (after ``Content-Length``)."""
        return {}

    def parse_json(self, body: bytes) -> Any:
        """A control route's JSON body (empty: ``{}``). Raises Rejected 400."""
        try:
            return json.loads(body.decode("utf-8")) if body else {}
        except ValueError as exc:
            raise Rejected(400, self.invalid(f"Invalid JSON body: {exc}")) from exc

    # -- the request cycle ----------------------------------------------------------------------------------
    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        try:
            body = self.read_body()
            if url.path.startswith(CONTROL_PREFIX):
                self.send_json(200, self.control(method, url.path, body))
                return
            if self.counts_requests:
                with self.server.state.lock:
                    self.server.state.requests.record(method, url.path, body)
            self.serve(method, url, body)
        except Rejected as exc:
            self.send_json(exc.status, exc.body, headers=exc.headers)
        except Exception:
            self._logger().exception("unexpected sandbox error on %s %s", method, self.path)
            self.close_connection = True
            self.send_json(500, self.internal_error())

    def control(self, method: str, path: str, body: bytes) -> Any:
        """Answer one control route; return its payload. Raises Rejected (400, 404)."""
        state: SandboxState = self.server.state
        route = (method, path)
        if route == ("GET", "/_sandbox/state"):
            return state.snapshot()
        if route == ("POST", "/_sandbox/reset"):
            state.reset()
            return self.reset_answer()
        if route == ("GET", "/_sandbox/faults"):
            return state.faults_in_force()
        if route == ("POST", "/_sandbox/faults"):
            try:
                return state.apply_faults(self.parse_json(body))
            except FaultError as exc:
                raise Rejected(400, self.invalid(str(exc))) from exc
        if route == ("GET", "/_sandbox/requests") and self.request_log_control:
            return {"requests": state.log()}
        return self.extra_control(method, path, body)

    def read_body(self) -> bytes:
        """The request body by ``Content-Length``. Raises Rejected 411 (chunked) or 400 (bad length)."""
        if self.refuse_chunked and self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            raise Rejected(411, self.invalid("Send a Content-Length; chunked bodies are not supported."))
        length_text = self.headers.get("Content-Length") or "0"
        if not length_text.isdigit() or int(length_text) > self.max_body_bytes:
            self.close_connection = True
            raise Rejected(400, self.invalid("Invalid or too large Content-Length."))
        length = int(length_text)
        return self.rfile.read(length) if length else b""

    def send_json(self, status: int, payload: Any, *, headers: dict[str, str] | None = None) -> None:
        """Send one response: ``payload`` as JSON (``None``: no body), then ``headers``."""
        data = b"" if payload is None else json.dumps(payload, ensure_ascii=False).encode("utf-8")
        self.send_response(status, reason_phrase(status))
        if payload is not None:
            self.send_header("Content-Type", self.content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in {**self.extra_headers(), **(headers or {})}.items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if data:
            self.wfile.write(data)

    def drop_response(self) -> None:
        """Close the connection without writing a response (an ambiguous outcome for the client)."""
        self.close_connection = True
        self._logger().info("dropped the response to %s %s", self.command, self.path)

    def _logger(self) -> logging.Logger:
        return logging.getLogger(type(self).__module__)


class LoopbackSandbox:
    """An in-process sandbox on ``127.0.0.1``, served from a daemon thread.

    Subclasses set :attr:`handler_class` and :attr:`thread_name` and pass their
    :class:`SandboxState` to ``__init__``.
    """

    handler_class: type[BaseHTTPRequestHandler]
    thread_name = "sandbox"

    def __init__(self, state: SandboxState, *, port: int = 0):
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
        """Forget everything the sandbox holds, as ``POST /_sandbox/reset`` does."""
        self._state.reset()

    def set_faults(self, **faults: Any) -> dict[str, Any]:
        """Merge faults as ``POST /_sandbox/faults`` does; return the faults in force.

        Raises:
            ValueError: an unknown fault or an out-of-range value (:class:`FaultError`).
        """
        return self._state.apply_faults(faults)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def serve_process(argv: Sequence[str] | None, *, description: str, secret_flag: str, secret_help: str,
                  build: Callable[..., LoopbackSandbox]) -> int:
    """Run one sandbox as a process until SIGTERM/SIGINT; return the exit status (0).

    Command line: ``--port N`` (0 picks a free port on 127.0.0.1), ``<secret_flag> VALUE``
    or ``--secret-env NAME`` (one is required; the variable keeps the secret out of the
    process list), ``--port-file PATH`` (the bound port is written there atomically once
    listening) and ``--log-level``. ``build(secret, port=port)`` returns the unstarted sandbox.
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1; 0 picks a free one")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(secret_flag, dest="secret", help=secret_help)
    source.add_argument("--secret-env", metavar="NAME", help=f"read {secret_flag}'s value from this environment variable")
    parser.add_argument("--port-file", type=Path, help="write the bound port here once listening")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    if args.secret_env is not None:
        args.secret = os.environ.get(args.secret_env, "")
        if not args.secret:
            parser.error(f"--secret-env: the environment variable {args.secret_env} is not set or empty")
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    sandbox = build(args.secret, port=args.port)
    sandbox.start()
    if args.port_file is not None:
        partial = args.port_file.with_name(args.port_file.name + ".partial")
        partial.write_text(f"{sandbox.port}\n", encoding="ascii")
        os.replace(partial, args.port_file)
    try:
        stop.wait()
    finally:
        sandbox.stop()
        logger.info("%s stopped", description)
    return 0


def reason_phrase(status: int) -> str:
    """The standard reason phrase of ``status``, or ``"Error"`` for a code without one."""
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def _count(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise FaultError(f"{name} must be a non-negative integer")
    return value
