"""Ingress REST endpoint (ARCHITECTURE.md section 5, seed 003 "Inbound facts").

``POST /api/v2/ingress/<account_key>/<channel>/`` takes the raw provider body.

- 202 ``{"receipt_id": n}``: admitted now; 200 with the same id: a redelivery;
- 200 ``{"receipt_id": null, "status": "already_accepted"}``: V1 accepted this
  exact delivery before the upgrade (a tombstone); nothing runs again;
- 401 ``signature_invalid`` / ``signature_stale`` / ``signature_missing``;
- 400 ``malformed_body``; 404 ``unknown_ingress`` (also for an account or channel in the path that is
  not a key); 409 ``admission_conflict``;
- 503 ``not_serving`` / ``credential_unavailable`` / ``temporarily_unavailable`` with ``Retry-After``;
- 503 ``ingress_shed`` with ``Retry-After``: the runtime policy sheds load now (the database is at the
  policy's ``ingress`` bounds); nothing was read or admitted, the provider redelivers later.

Nothing is acknowledged before its Receipt commits. The provider is not a
user: the view is open to anonymous callers (``AllowAny``, no authenticator)
and admission verifies the provider's signature of every request. The
errors are raised and answered by :func:`nexusflow.api_errors.exception_handler`;
the view only rewords what the provider may learn.
"""
from __future__ import annotations

import logging

from django.db import DatabaseError, DataError
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.parsers import BaseParser
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from connectors.contracts.signatures import SignatureInvalid, SignatureMissing, SignatureStale
from connectors.inbound.admission import AdmissionConflict, MalformedBody, UnknownIngress, admit
from connectors.models import AccountServingGate, ReceiptAdmissionKey
from connectors.selectors import database_answers
from connectors.serving.gates import CredentialUnavailable, NotServing, find_account_org
from nexusflow.api_errors import TEMPORARILY_UNAVAILABLE, error_response
from nexusflow.api_schema import error_responses, key_path
from nexusflow.kernel.errors import InvalidIdentity, NexusError
from nexusflow.kernel.identity import validate_key
from nexusflow.kernel.pressure import ingress_admission, ingress_queue_admission
from runtime_outbox.policy import runtime_policy

#: The code of a health probe whose database does not answer.
DATABASE_UNAVAILABLE = "database_unavailable"
#: The path of an ingress route, in the schema (V1 and V2 alike), as long as the columns that store it.
_ACCOUNT_KEY_LENGTH = AccountServingGate._meta.get_field("account_key").max_length
_CHANNEL_LENGTH = ReceiptAdmissionKey._meta.get_field("channel").max_length
INGRESS_PATH_PARAMETERS = [
    key_path("account_key", _ACCOUNT_KEY_LENGTH, "The provider account the route belongs to."),
    key_path("channel", _CHANNEL_LENGTH, "The account's inbound channel."),
]
#: The request body of an ingress route: the provider's bytes as sent, signed, read only after the signature
#: is verified. Its shape is the route's contract (the pack's), which this schema cannot state.
INGRESS_REQUEST = {"application/json": {"description": "the provider's request body, byte for byte; its shape is "
                                                       "the route's contract (malformed_body otherwise)"}}
#: The error answers both ingress versions share; a body the route's contract refuses is malformed_body.
INGRESS_VALID_REQUEST = {400: (MalformedBody,)}
INGRESS_ERRORS = {401: (SignatureMissing, SignatureInvalid, SignatureStale),
                  404: (UnknownIngress,), 409: (AdmissionConflict,),
                  503: (CredentialUnavailable, TEMPORARILY_UNAVAILABLE)}

log = logging.getLogger(__name__)


def ingress_route_keys(account_key: str, channel: str) -> None:
    """Refuse a route whose path keys cannot name one: a key that is not canonical (surrounding whitespace,
    control or invisible characters) or longer than its column is no route, whatever the body holds.

    Raises:
        UnknownIngress: 404 ``unknown_ingress`` (never ``malformed_body``: the body was not read).
    """
    for name, value, length in (("account_key", account_key, _ACCOUNT_KEY_LENGTH), ("channel", channel,
                                                                                   _CHANNEL_LENGTH)):
        try:
            validate_key(value, field=name, max_length=length)
        except InvalidIdentity:
            raise UnknownIngress(f"no ingress route: {name} is not a key") from None


class IngressShed(NexusError):
    """The runtime policy sheds ingress now (seed 004 section 16.2): retry after ``Retry-After`` seconds."""

    code = "ingress_shed"
    http_status = 503
    #: The policy's ``ingress.retry_after_seconds`` replaces it on each answer.
    retry_after = 5


class RawBodyParser(BaseParser):
    media_type = "*/*"

    def parse(self, stream, media_type=None, parser_context=None):
        return stream.read() if stream is not None else b""


class IngressAdmitApi(APIView):
    """Admit one signed provider request exactly once."""

    parser_classes = [RawBodyParser]
    # Open on purpose: the caller is the provider, authenticated by its signature of the request,
    # which admission verifies before anything is written (401 signature_*).
    authentication_classes: list = []
    permission_classes = [AllowAny]

    class OutputSerializer(serializers.Serializer):
        receipt_id = serializers.IntegerField(allow_null=True)
        status = serializers.ChoiceField(choices=["admitted", "redelivered", "already_accepted"])

        class Meta:
            ref_name = "IngressReceipt"

    @extend_schema(
        parameters=INGRESS_PATH_PARAMETERS,
        request=INGRESS_REQUEST,
        responses={202: OutputSerializer, 200: OutputSerializer,
                   **error_responses(INGRESS_ERRORS, {503: (NotServing, IngressShed)},
                                     valid_request=INGRESS_VALID_REQUEST)},
    )
    def post(self, request, account_key: str, channel: str):
        ingress_route_keys(account_key, channel)
        policy = runtime_policy()
        shed_for = ingress_admission(policy.ingress.as_pressure(policy.pressure.read_seconds))
        org_id = find_account_org(account_key) if not shed_for and policy.ingress.shed_queue_age_seconds else None
        if org_id is not None:  # the account's org alone sheds while its own backlog drains
            shed_for = ingress_queue_admission(org_id, bound_seconds=policy.ingress.shed_queue_age_seconds,
                                               read_seconds=policy.pressure.read_seconds)
        if shed_for:
            # Before any read or write: the delivery is refused whole and redelivered by the provider later.
            raise IngressShed(f"the service is shedding load ({shed_for}); retry later",
                              retry_after=policy.ingress.retry_after_seconds)
        body = request.body
        try:
            result = admit(account_key=account_key, channel=channel, method=request.method,
                           url=request.build_absolute_uri(), body=body, headers=request.headers)
        except InvalidIdentity as exc:
            # A key in the provider's body failed validation: the body is at fault.
            raise MalformedBody(str(exc)) from exc
        except NotServing as exc:
            # The gate's state is the operator's business: the provider learns only to retry.
            raise NotServing("the account is not admitting work now", code=exc.code) from exc
        except CredentialUnavailable as exc:
            # The detail names an internal secret locator: log it, never return it.
            log.error("ingress credential unavailable for %s/%s: %s", account_key, channel, exc,
                      extra={"code": getattr(exc, "code", None)})
            raise CredentialUnavailable("the account's credential is unavailable", code=exc.code) from exc
        except DataError as exc:
            # A value that does not fit its column: the input is at fault, retrying cannot help.
            log.warning("ingress data error for %s/%s: %s", account_key, channel, exc)
            raise MalformedBody("a value does not fit the route's schema") from exc
        if result.already_accepted:
            return Response({"receipt_id": None, "status": "already_accepted"}, status=status.HTTP_200_OK)
        code = status.HTTP_202_ACCEPTED if result.created else status.HTTP_200_OK
        return Response({"receipt_id": result.receipt_id, "status": "admitted" if result.created else "redelivered"},
                        status=code)


class HealthApi(APIView):
    """``GET /api/v2/health/``: 200 ``{"status": "ok"}`` when the database answers, else 503."""

    # Open on purpose: load balancers and the process supervisor probe it without credentials; it
    # reads nothing but the database's answer.
    authentication_classes: list = []
    permission_classes = [AllowAny]

    class OutputSerializer(serializers.Serializer):
        status = serializers.ChoiceField(choices=["ok"])

        class Meta:
            ref_name = "Health"

    @extend_schema(responses={200: OutputSerializer, **error_responses({503: (DATABASE_UNAVAILABLE,)})})
    def get(self, request):
        try:
            database_answers()
        except DatabaseError:
            return error_response(DATABASE_UNAVAILABLE, "the database does not answer", status.HTTP_503_SERVICE_UNAVAILABLE)
        return Response({"status": "ok"})
