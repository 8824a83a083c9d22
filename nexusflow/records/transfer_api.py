"""Identity transfer REST endpoints (seed 000, "Transfer").

Authenticated operators only (HTTP basic or session; active staff users,
:class:`nexusflow.kernel.permissions.IsOperator`). The org is the one of the
operator's ``org:<id>`` groups holding the source record, never a payload value.

``POST /api/v2/records/<object>/<key>/merge/`` ``{"transfer_id", "target_key"}`` and
``POST /api/v2/records/<object>/<key>/convert/`` ``{"transfer_id", "target_object", "target_key"?}``:

- 201: transferred now; 200: the same transfer id and inputs, target authority still valid (nothing written);
- 400 ``invalid_request``, ``invalid_identity``, ``transfer_invalid``, ``transfer_conversion_undeclared``;
- 404 ``transfer_record_not_found``, ``unknown_object``;
- 409 + ``Retry-After``: ``owner_outbound_pending``, ``owner_contended`` (retry later);
- 409: ``transfer_mismatch``, ``transfer_identity_conflict``, ``transfer_authority_inactive``,
  ``transfer_mirror_mismatch``, ``transfer_target_slot_missing``;
- 503 ``temporarily_unavailable`` with ``Retry-After``;
- 401 ``not_authenticated`` (with ``WWW-Authenticate``); 403 ``permission_denied``: not an operator.

The errors are raised and answered by :func:`nexusflow.api_errors.exception_handler`.
"""
from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from nexusflow.api_errors import INVALID_REQUEST, error_response
from nexusflow.api_schema import AUTH_ERRORS, DATABASE_ERRORS, JSON_BODY_ERRORS, error_responses, key_field
from nexusflow.kernel.errors import InvalidIdentity
from nexusflow.kernel.permissions import IsOperator
from nexusflow.kernel.scope import OrgScope

from .edit_api import OBJECT_NAME_MAX_LENGTH, RECORD_KEY_MAX_LENGTH, RECORD_PATH
from .metadata import UnknownObject
from .models import IdentityTransfer
from .owner import OwnerContended, OwnerWorkPending
from .selectors import operator_org_for_record
from .transfer import (
    CONVERT,
    MERGE,
    TransferAuthorityInactive,
    TransferConversionUndeclared,
    TransferIdentityConflict,
    TransferInvalid,
    TransferMirrorMismatch,
    TransferMismatch,
    TransferRecordNotFound,
    TransferTargetSlotMissing,
    record_convert,
    record_merge,
)

#: The length of a caller's transfer id (its column).
TRANSFER_ID_MAX_LENGTH = IdentityTransfer._meta.get_field("transfer_id").max_length


def _operator_org(user, object_name: str, record_key: str) -> OrgScope:
    """The org holding ``object_name/record_key`` (live or transferred) among the operator's orgs.

    Raises:
        InvalidIdentity: a malformed object name or key.
        TransferRecordNotFound: no such record in the operator's orgs (or it is ambiguous).
    """
    return operator_org_for_record(user, object_name, record_key, live=False, not_found=TransferRecordNotFound)


class TransferOutputSerializer(serializers.Serializer):
    transfer_id = serializers.CharField()
    kind = serializers.ChoiceField(choices=[MERGE, CONVERT])
    source_object = serializers.CharField()
    source_record_key = serializers.CharField()
    target_object = serializers.CharField()
    target_record_key = serializers.CharField()
    target_created = serializers.BooleanField()
    owners = serializers.ListField(child=serializers.CharField())
    moves = serializers.ListField(child=serializers.DictField())
    created = serializers.BooleanField()

    class Meta:
        ref_name = "IdentityTransfer"


_RESPONSES = {
    201: TransferOutputSerializer, 200: TransferOutputSerializer,
    **error_responses(
        {400: (INVALID_REQUEST, InvalidIdentity), 404: (TransferRecordNotFound, UnknownObject),
         409: (OwnerWorkPending, OwnerContended, TransferMismatch, TransferIdentityConflict,
               TransferAuthorityInactive, TransferMirrorMismatch, TransferTargetSlotMissing)},
        JSON_BODY_ERRORS, AUTH_ERRORS, DATABASE_ERRORS,
        # Whether the target is the source itself, or the object declares that conversion, is stored state.
        valid_request={400: (TransferInvalid, TransferConversionUndeclared)}),
}


class _TransferApi(APIView):
    permission_classes = [IsOperator]

    def _run(self, request, object_name: str, record_key: str, call) -> Response:
        serializer = self.InputSerializer(data=request.data if isinstance(request.data, dict) else {})
        if not serializer.is_valid():
            return error_response(INVALID_REQUEST, serializer.errors, status.HTTP_400_BAD_REQUEST)
        org = _operator_org(request.user, object_name, record_key)
        result = call(org, serializer.validated_data, request.user.get_username())
        return Response(TransferOutputSerializer(result.as_dict()).data,
                        status=status.HTTP_201_CREATED if result.created else status.HTTP_200_OK)


class RecordMergeApi(_TransferApi):
    """Merge this record into another record of the same object (remote authority moves; no provider call)."""

    class InputSerializer(serializers.Serializer):
        transfer_id = key_field(TRANSFER_ID_MAX_LENGTH)
        target_key = key_field(RECORD_KEY_MAX_LENGTH)

        class Meta:
            ref_name = "RecordMergeInput"

    @extend_schema(parameters=RECORD_PATH, request={"application/json": InputSerializer}, responses=_RESPONSES)
    def post(self, request, object_name: str, record_key: str):
        return self._run(request, object_name, record_key, lambda org, values, actor: record_merge(
            org=org, transfer_id=values["transfer_id"], object_name=object_name, source_key=record_key,
            target_key=values["target_key"], actor=actor))


class RecordConvertApi(_TransferApi):
    """Convert this record into a new (or an existing) record of its declared target object."""

    class InputSerializer(serializers.Serializer):
        transfer_id = key_field(TRANSFER_ID_MAX_LENGTH)
        target_object = key_field(OBJECT_NAME_MAX_LENGTH)
        target_key = key_field(RECORD_KEY_MAX_LENGTH, required=False)

        class Meta:
            ref_name = "RecordConvertInput"

    @extend_schema(parameters=RECORD_PATH, request={"application/json": InputSerializer}, responses=_RESPONSES)
    def post(self, request, object_name: str, record_key: str):
        return self._run(request, object_name, record_key, lambda org, values, actor: record_convert(
            org=org, transfer_id=values["transfer_id"], source_object=object_name, source_key=record_key,
            target_object=values["target_object"], target_key=values.get("target_key"), actor=actor))
