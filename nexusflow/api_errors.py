"""One error body for every REST endpoint: ``{"error": <code>, "detail": <text>}``.

Kernel errors map to stable codes; nothing a client sends produces a 5xx.
"""
from __future__ import annotations

from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_handler

from nexusflow.kernel.errors import InvalidIdentity, NexusError, RetryableConflict


def error_response(code: str, detail: str, http_status: int, headers: dict | None = None) -> Response:
    return Response({"error": code, "detail": detail}, status=http_status, headers=headers)


def exception_handler(exc, context):
    if isinstance(exc, InvalidIdentity):
        return error_response(exc.code, str(exc), status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, RetryableConflict):
        return error_response(exc.code, str(exc), status.HTTP_409_CONFLICT)
    if isinstance(exc, NexusError):
        return error_response(exc.code, str(exc), status.HTTP_409_CONFLICT)
    response = drf_handler(exc, context)
    if response is not None:
        code = getattr(exc, "default_code", "invalid_request")
        response.data = {"error": code, "detail": response.data}
    return response
