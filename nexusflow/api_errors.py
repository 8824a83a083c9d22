"""One error body for every REST endpoint: ``{"error": <code>, "detail": <text>}``.

The one DRF exception handler (``REST_FRAMEWORK["EXCEPTION_HANDLER"]``): a view
raises, it never builds an error response by hand.

- a :class:`~nexusflow.kernel.errors.NexusError` answers with its ``code``, its
  message, its ``http_status`` and, when it has one, ``Retry-After: <retry_after>``;
- a database error (a lock wait timeout, a lost connection) answers 503
  ``temporarily_unavailable`` with ``Retry-After``: nothing was acknowledged;
- DRF's own errors keep their status and headers (401 carries ``WWW-Authenticate``)
  and answer with their code (``not_authenticated``, ``permission_denied``,
  ``method_not_allowed``, ...); a text detail stays text, a validation error's
  field map stays a map.

Nothing a client sends produces a 500.
"""
from __future__ import annotations

import logging

from django.core.exceptions import PermissionDenied
from django.db import DatabaseError
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_handler
from rest_framework.views import set_rollback

from nexusflow.kernel.errors import NexusError

log = logging.getLogger(__name__)

#: Seconds a client waits before retrying after a database error (``Retry-After``).
UNAVAILABLE_RETRY_AFTER = 5
#: The code of a request body that fails its view's input serializer (``detail`` is the field map).
INVALID_REQUEST = "invalid_request"
#: The code of a database error during a request: nothing was acknowledged, retry later.
TEMPORARILY_UNAVAILABLE = "temporarily_unavailable"


def error_response(code: str, detail, http_status: int, headers: dict | None = None) -> Response:
    """The error body ``{"error": code, "detail": detail}`` with ``http_status`` and ``headers``."""
    return Response({"error": code, "detail": detail}, status=http_status, headers=headers)


def nexus_error_response(exc: NexusError) -> Response:
    """The REST answer for ``exc``: its code and message, ``exc.http_status``, ``Retry-After`` when it has one."""
    headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after is not None else None
    return error_response(exc.code, str(exc), exc.http_status, headers=headers)


def exception_handler(exc, context):
    """Map ``exc`` raised by a view to the stable error body; ``None`` lets Django answer (a programming error)."""
    if isinstance(exc, NexusError):
        set_rollback()
        return nexus_error_response(exc)
    if isinstance(exc, DatabaseError):
        # Lock timeouts or a lost connection: the transaction rolled back; the client retries.
        view = context.get("view")
        log.warning("%s %s: database error: %s", type(view).__name__ if view else "api", context.get("kwargs"), exc)
        set_rollback()
        return error_response(TEMPORARILY_UNAVAILABLE, "retry later", status.HTTP_503_SERVICE_UNAVAILABLE,
                              headers={"Retry-After": str(UNAVAILABLE_RETRY_AFTER)})
    if isinstance(exc, Http404):
        exc = exceptions.NotFound(*exc.args)
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied(*exc.args)
    response = drf_handler(exc, context)
    if response is not None:
        code = getattr(exc, "default_code", INVALID_REQUEST)
        detail = response.data
        if isinstance(detail, dict) and set(detail) == {"detail"}:
            detail = detail["detail"]
        response.data = {"error": code, "detail": detail}
    return response
