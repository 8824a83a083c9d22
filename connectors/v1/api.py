"""V1 webhook ingress endpoint, on its own route (seed 003 "V1 concepts to retire").

``POST /api/v1/ingress/<account_key>/<channel>/`` takes the raw provider body.

- 202 ``{"transport_id": n, "status": "accepted", "events": k}``: accepted now;
- 200 ``{"transport_id": n, "status": "redelivered", "events": 0}``: the same delivery again;
- 401 ``signature_invalid`` / ``signature_stale`` / ``signature_missing``;
- 400 ``malformed_body``; 404 ``unknown_ingress``; 409 ``admission_conflict``;
- 503 ``credential_unavailable`` / ``temporarily_unavailable`` with ``Retry-After``.

Nothing is acknowledged before its V1TransportKey and V1 events commit. Open to
anonymous callers: the provider authenticates by its signature, checked before
anything is written. Errors are answered by :func:`nexusflow.api_errors.exception_handler`.
"""
from __future__ import annotations

from django.db import DataError
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from connectors.inbound.admission import MalformedBody
from connectors.inbound.ingress_api import (
    INGRESS_ERRORS,
    INGRESS_PATH_PARAMETERS,
    INGRESS_REQUEST,
    INGRESS_VALID_REQUEST,
    RawBodyParser,
    ingress_route_keys,
)
from connectors.v1.barriers import V1MaintenanceClosed
from connectors.v1.ingress import v1_admit
from nexusflow.api_schema import error_responses
from nexusflow.kernel.errors import InvalidIdentity


class V1IngressAdmitApi(APIView):
    """Accept one signed provider request into the V1 runtime exactly once."""

    parser_classes = [RawBodyParser]
    # Open on purpose: the caller is the provider, authenticated by its signature of the request.
    authentication_classes: list = []
    permission_classes = [AllowAny]

    class OutputSerializer(serializers.Serializer):
        transport_id = serializers.IntegerField()
        status = serializers.ChoiceField(choices=["accepted", "redelivered"])
        events = serializers.IntegerField()

        class Meta:
            ref_name = "V1IngressReceipt"

    @extend_schema(
        parameters=INGRESS_PATH_PARAMETERS,
        request=INGRESS_REQUEST,
        responses={202: OutputSerializer, 200: OutputSerializer,
                   **error_responses(INGRESS_ERRORS, {503: (V1MaintenanceClosed,)},
                                     valid_request=INGRESS_VALID_REQUEST)},
    )
    def post(self, request, account_key: str, channel: str):
        ingress_route_keys(account_key, channel)
        try:
            result = v1_admit(account_key=account_key, channel=channel, method=request.method,
                              url=request.build_absolute_uri(), body=request.body, headers=request.headers)
        except (InvalidIdentity, DataError) as exc:
            # A key or value in the provider's body does not fit: the body is at fault, retrying cannot help.
            raise MalformedBody("a value in the body does not fit the route's schema") from exc
        body = {"transport_id": int(result.transport_id), "status": "accepted" if result.created else "redelivered",
                "events": result.events}
        return Response(body, status=status.HTTP_202_ACCEPTED if result.created else status.HTTP_200_OK)
