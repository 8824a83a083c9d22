"""Replay REST endpoints (seed 003 "Replay identity and predecessor", "Replay and external effects").

Authenticated operators only (HTTP basic or session; active staff users,
:class:`nexusflow.kernel.permissions.IsOperator`). The org comes from the operator's ``org:<id>`` groups, never from the payload, and the
authorizing principal is the authenticated user.

``POST /api/v2/replays/`` ``{"account_key", "replay_id", "predecessor_event_id", "reason", "external_effects"}``:

- 201: admitted and materialized now; 200: the same ReplayRequest ID with the
  same bytes, converged on the same descendants; 202: admitted, but the gate
  left ``v2_serving`` before materialization (submit again to resume);
- 400 ``replay_mode_unsupported`` (before anything is read or written),
  ``replay_invalid``, ``invalid_identity``, ``invalid_request``;
- 404 ``unknown_account``, ``unknown_predecessor``;
- 409 ``replay_mismatch``, ``replay_predecessor_not_terminal``, ``replay_route_not_served``;
- 503 ``not_serving`` / ``replay_target_not_serving`` with ``Retry-After``.

``GET /api/v2/replays/<account_key>/<replay_id>/``: read-only lookup, also
while the gate is halted; 404 ``replay_not_found``.

Both answer 401 ``not_authenticated`` (with ``WWW-Authenticate``) without
credentials and 403 ``permission_denied`` for a user who is no operator. The
errors are raised and answered by :func:`nexusflow.api_errors.exception_handler`.
"""
from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from connectors.inbound.replay import (
    LIVE_GENERATION,
    MAX_REASON_LENGTH,
    PREDECESSOR_PROTOCOL,
    ReplayInvalid,
    ReplayMismatch,
    ReplayNotFound,
    ReplayPredecessorNotTerminal,
    ReplayRouteNotServed,
    ReplayTargetNotServing,
    ReplayUnknownAccount,
    ReplayUnknownPredecessor,
    replay_lookup,
    replay_submit,
)
from connectors.models import AccountServingGate, ReplayRequest
from connectors.serving.gates import NotServing
from connectors.transitions import EXECUTION
from nexusflow.api_errors import INVALID_REQUEST, error_response
from nexusflow.api_schema import (
    AUTH_ERRORS,
    DATABASE_ERRORS,
    JSON_BODY_ERRORS,
    error_responses,
    key_field,
    key_path,
    text_field,
)
from nexusflow.kernel.errors import InvalidIdentity
from nexusflow.kernel.identity import validate_key
from nexusflow.kernel.permissions import IsOperator, operator_org_ids
from nexusflow.kernel.scope import OrgScope
from runtime_outbox.replay_guard import REPLAY_MODES, ReplayModeUnsupported, require_replay_mode

#: The length of an account key and of a ReplayRequest ID (their columns).
ACCOUNT_KEY_MAX_LENGTH = ReplayRequest._meta.get_field("account_key").max_length
REPLAY_ID_MAX_LENGTH = ReplayRequest._meta.get_field("replay_id").max_length


def operator_org_for_account(user, account_key: str) -> OrgScope:
    """The org of ``account_key`` among the orgs the operator may act for.

    Raises:
        InvalidIdentity: malformed ``account_key``.
        ReplayUnknownAccount: no such account in the operator's orgs (or it is ambiguous).
    """
    validate_key(account_key, field="account_key", max_length=ACCOUNT_KEY_MAX_LENGTH)
    orgs = operator_org_ids(user)
    gates = AccountServingGate.objects.filter(account_key=account_key)
    if orgs is not None:
        gates = gates.filter(org_id__in=sorted(orgs))
    found = list(gates.values_list("org_id", flat=True)[:2])
    if len(found) != 1:
        raise ReplayUnknownAccount(f"unknown account {account_key!r}")
    return OrgScope(found[0])


class _PredecessorSerializer(serializers.Serializer):
    protocol = serializers.ChoiceField(choices=[PREDECESSOR_PROTOCOL])
    receipt_id = serializers.IntegerField()
    event_id = serializers.IntegerField()
    epoch_id = serializers.IntegerField()
    epoch_digest = serializers.CharField()
    payload_digest = serializers.CharField()
    result_digest = serializers.CharField(allow_blank=True)
    route_key = serializers.CharField()
    source_event_key = serializers.CharField()

    class Meta:
        ref_name = "ReplayPredecessor"


class _ExecutionSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    state = serializers.ChoiceField(choices=sorted(EXECUTION.transitions))
    reason_code = serializers.CharField(allow_blank=True)
    execution_ref_digest = serializers.CharField()

    class Meta:
        ref_name = "ReplayExecution"


class ReplayOutputSerializer(serializers.Serializer):
    replay_id = serializers.CharField()
    account_key = serializers.CharField()
    request_digest = serializers.CharField()
    target_epoch_id = serializers.IntegerField()
    target_epoch_digest = serializers.CharField()
    external_effects = serializers.ChoiceField(choices=sorted(REPLAY_MODES))
    receipt_id = serializers.IntegerField()
    predecessor = _PredecessorSerializer()
    reason = serializers.CharField()
    principal = serializers.CharField()
    created = serializers.BooleanField()
    materialized = serializers.BooleanField()
    event_ids = serializers.ListField(child=serializers.IntegerField())
    executions = _ExecutionSerializer(many=True)

    class Meta:
        ref_name = "ReplayRequest"


class ReplayCreateApi(APIView):
    """Admit one operator-authorized replay of a terminal predecessor Event and materialize it."""

    permission_classes = [IsOperator]

    class InputSerializer(serializers.Serializer):
        account_key = key_field(ACCOUNT_KEY_MAX_LENGTH)
        # The live EventGeneration's name is no ReplayRequest ID (replay_invalid).
        replay_id = key_field(REPLAY_ID_MAX_LENGTH, schema={"not": {"enum": [LIVE_GENERATION]}})
        predecessor_event_id = serializers.IntegerField(min_value=1)
        reason = text_field(MAX_REASON_LENGTH)
        # Checked before the serializer (require_replay_mode); the choices document the same set.
        external_effects = serializers.ChoiceField(choices=sorted(REPLAY_MODES))

        class Meta:
            ref_name = "ReplayCreateInput"

    @extend_schema(
        request={"application/json": InputSerializer},
        responses={201: ReplayOutputSerializer, 200: ReplayOutputSerializer, 202: ReplayOutputSerializer,
                   **error_responses(
                       {400: (ReplayModeUnsupported, ReplayInvalid, InvalidIdentity, INVALID_REQUEST),
                        404: (ReplayUnknownAccount, ReplayUnknownPredecessor),
                        409: (ReplayMismatch, ReplayPredecessorNotTerminal, ReplayRouteNotServed),
                        503: (NotServing, ReplayTargetNotServing)},
                       JSON_BODY_ERRORS, AUTH_ERRORS, DATABASE_ERRORS)},
    )
    def post(self, request):
        data = request.data if isinstance(request.data, dict) else {}
        # The mode is refused before any other check, read or write.
        if "external_effects" in data:
            require_replay_mode(data["external_effects"])
        serializer = self.InputSerializer(data=data)
        if not serializer.is_valid():
            return error_response(INVALID_REQUEST, serializer.errors, status.HTTP_400_BAD_REQUEST)
        values = serializer.validated_data
        org = operator_org_for_account(request.user, values["account_key"])
        result = replay_submit(org=org, account_key=values["account_key"], replay_id=values["replay_id"],
                               predecessor_event_id=values["predecessor_event_id"], reason=values["reason"],
                               principal=request.user.get_username(), external_effects=values["external_effects"])
        if not result.materialized:
            code = status.HTTP_202_ACCEPTED
        else:
            code = status.HTTP_201_CREATED if result.created else status.HTTP_200_OK
        return Response(ReplayOutputSerializer(result.as_dict()).data, status=code)


class ReplayDetailApi(APIView):
    """Read one ReplayRequest and its descendants; never creates or repairs anything."""

    permission_classes = [IsOperator]

    @extend_schema(parameters=[key_path("account_key", ACCOUNT_KEY_MAX_LENGTH),
                               key_path("replay_id", REPLAY_ID_MAX_LENGTH)],
                   responses={200: ReplayOutputSerializer,
                              **error_responses({400: (InvalidIdentity,), 404: (ReplayUnknownAccount, ReplayNotFound)},
                                                AUTH_ERRORS, DATABASE_ERRORS)})
    def get(self, request, account_key: str, replay_id: str):
        org = operator_org_for_account(request.user, account_key)
        result = replay_lookup(org=org, account_key=account_key, replay_id=replay_id)
        return Response(ReplayOutputSerializer(result.as_dict()).data)
