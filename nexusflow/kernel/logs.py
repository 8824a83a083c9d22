"""Structured JSON log lines carrying correlation ids and safe codes only (seed 004 sections 17.3 and 19).

``NEXUS_LOG_FORMAT=json`` (``nexusflow/settings.py`` ``LOGGING``) writes every
record as one JSON object per line through :class:`JsonFormatter`:

- ``ts`` (UTC, ISO 8601), ``level``, ``logger``;
- ``event``: the call's message template as written in the code (``"flow step
  fenced: %s"``), never its arguments: arguments may carry record data,
  provider payloads or credential material, so they are dropped;
- ``code``: the ``code`` passed in ``extra`` or, for a logged exception, the
  exception's ``code`` attribute (a :class:`nexusflow.kernel.errors.NexusError`),
  kept only when it is a lower snake case code; ``error``: the exception's
  class name (never its text or traceback);
- the correlation ids of :data:`CORRELATION_FIELDS` a call passes in ``extra``
  (ints or canonical keys; anything else is dropped), or that the code around
  it set with :func:`log_context` (a worker around the step, execution or
  effect it runs; :class:`TraceMiddleware` around an HTTP request): every line
  inside carries them without each call passing them. :class:`ContextFilter`
  (installed on the handlers in ``settings.LOGGING``) copies them onto the
  record; an ``extra`` value wins.

A request's ``trace_id`` is the trace id of its W3C ``traceparent`` header when
it sends a valid one, else a new random one; the response carries it as
``X-Trace-Id``. The trace crosses the durable boundaries: a row that starts or
carries durable work (a Receipt, an inbound Execution, a FlowRun, an
OutboundCommand, a RemoteEffect) records the trace id open when it was inserted
(``trace_id``, :func:`nexusflow.kernel.models.insert`), and the worker that runs
it opens that trace again around the unit (:func:`log_context`), so the
execution a webhook admitted, the Flow run its record write started, the intent
that run authored and the provider call that effect made all log under the
webhook request's trace id; the provider call sends it on as its own
``traceparent`` (:func:`traceparent_for`).
"""
from __future__ import annotations

import datetime as dt
import json
import logging
import re
import secrets
from collections.abc import Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from types import MappingProxyType

#: The ``extra`` keys a line keeps: org, run, step, attempt, effect, execution, plan and trace identity, and the
#: worker unit that logged it.
CORRELATION_FIELDS = ("org_id", "run_id", "step_id", "attempt_id", "effect_id", "execution_id", "plan_id",
                      "trace_id", "unit")
_SAFE_CODE = re.compile(r"^[a-z][a-z0-9_.]{1,63}$")
_SAFE_ID = re.compile(r"^[A-Za-z0-9_.:\-]{1,128}$")


_CONTEXT: ContextVar[Mapping[str, str]] = ContextVar("nexusflow_log_context", default=MappingProxyType({}))
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")


@contextmanager
def log_context(**ids):
    """Within the block, every log line carries ``ids`` (keys of :data:`CORRELATION_FIELDS`; ``None`` values
    are left out) beside those of enclosing blocks; the previous context returns after it.

    Raises:
        ValueError: a key outside :data:`CORRELATION_FIELDS` (a programming error, before anything is set).
    """
    unknown = sorted(set(ids) - set(CORRELATION_FIELDS))
    if unknown:
        raise ValueError(f"not correlation fields: {unknown}")
    token = _CONTEXT.set({**_CONTEXT.get(), **{k: v for k, v in ids.items() if v is not None}})
    try:
        yield
    finally:
        _CONTEXT.reset(token)


def current_trace_id() -> str:
    """The trace id of the enclosing :func:`log_context` blocks (``""``: none open)."""
    return _CONTEXT.get().get("trace_id", "")


def traceparent_for(trace_id: str) -> str | None:
    """A W3C ``traceparent`` header continuing ``trace_id`` with a new span id (``None`` for an empty or
    malformed trace id)."""
    if not re.fullmatch(r"[0-9a-f]{32}", trace_id or "") or trace_id == "0" * 32:
        return None
    return f"00-{trace_id}-{secrets.token_hex(8)}-01"


def current_log_context() -> dict:
    """The ids the enclosing :func:`log_context` blocks set (a copy)."""
    return dict(_CONTEXT.get())


class ContextFilter(logging.Filter):
    """Copy the :func:`log_context` ids onto each record (a value the call passed in ``extra`` wins)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in _CONTEXT.get().items():
            if getattr(record, name, None) is None:
                setattr(record, name, value)
        return True


def trace_id_of(traceparent: str | None) -> str:
    """The trace id of a W3C ``traceparent`` header (``00-<32 hex>-<16 hex>-<2 hex>``, not all zeros), else a
    new random 32-hex trace id."""
    match = _TRACEPARENT.match((traceparent or "").strip().lower())
    if match and match.group(1) != "0" * 32:
        return match.group(1)
    return secrets.token_hex(16)


class TraceMiddleware:
    """Django middleware: the request's ``trace_id`` (module docstring) in the log context of everything the
    request runs, and in the response's ``X-Trace-Id`` header."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        trace_id = trace_id_of(request.headers.get("traceparent"))
        with log_context(trace_id=trace_id):
            response = self.get_response(request)
        response["X-Trace-Id"] = trace_id
        return response


def _safe_id(value):
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    text = str(value)
    return text if _SAFE_ID.match(text) else None


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``{"ts", "level", "logger", "event"[, "code", "error", <ids>]}``."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "event": record.msg if isinstance(record.msg, str) else type(record.msg).__name__,
        }
        exc = record.exc_info[1] if record.exc_info else None
        code = getattr(record, "code", None)
        if code is None and exc is not None:
            code = getattr(exc, "code", None)
        if isinstance(code, str) and _SAFE_CODE.match(code):
            out["code"] = code
        if exc is not None:
            out["error"] = type(exc).__name__
        for name in CORRELATION_FIELDS:
            value = getattr(record, name, None)
            if value is not None and (safe := _safe_id(value)) is not None:
                out[name] = safe
        return json.dumps(out, sort_keys=True, separators=(",", ":"))
