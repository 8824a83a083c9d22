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
  (ints or canonical keys; anything else is dropped).
"""
from __future__ import annotations

import datetime as dt
import json
import logging
import re

#: The ``extra`` keys a line keeps: org, run, step, attempt, effect, execution, plan and trace identity, and the
#: worker unit that logged it.
CORRELATION_FIELDS = ("org_id", "run_id", "step_id", "attempt_id", "effect_id", "execution_id", "plan_id",
                      "trace_id", "unit")
_SAFE_CODE = re.compile(r"^[a-z][a-z0-9_.]{1,63}$")
_SAFE_ID = re.compile(r"^[A-Za-z0-9_.:\-]{1,128}$")


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
            "ts": dt.datetime.fromtimestamp(record.created, dt.timezone.utc).isoformat(timespec="milliseconds"),
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
