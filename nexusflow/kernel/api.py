"""``GET /metrics``: the Prometheus exposition of authoritative state (seed 004 section 19).

Operators only (``IsOperator``, HTTP basic first, like every other operator
endpoint): a Prometheus scrape job sends ``basic_auth`` (docs/operations.md
"Metrics"). Every value is computed from the database at the scrape
(:func:`nexusflow.kernel.metrics.scrape`), so any gunicorn process answers the
same. Errors: 401 ``not_authenticated`` / ``authentication_failed`` without
valid credentials, 403 ``permission_denied`` for a user who is no operator.
"""
from __future__ import annotations

from django.http import HttpResponse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from prometheus_client import CONTENT_TYPE_LATEST
from rest_framework.views import APIView

from nexusflow.api_schema import AUTH_ERRORS, DATABASE_ERRORS, error_responses

from .metrics import scrape
from .permissions import IsOperator


class MetricsApi(APIView):
    """The Prometheus text format (``text/plain; version=0.0.4``) of every ``nexusflow_*`` family."""

    permission_classes = [IsOperator]

    @extend_schema(responses={(200, CONTENT_TYPE_LATEST.split(";")[0]): OpenApiResponse(response={"type": "string"},
                                                   description="Prometheus text exposition format"),
                              **error_responses(AUTH_ERRORS, DATABASE_ERRORS)})
    def get(self, request):
        return HttpResponse(scrape(), content_type=CONTENT_TYPE_LATEST)
