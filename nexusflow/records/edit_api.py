"""Local record edit REST endpoints (what an operator UI or API client does).

Authenticated operators only (session or HTTP basic; staff users, as
``connectors/replay_api.py``). The org is the operator's: the one ``org:<id>``
group it acts for, or, for an operator of several orgs (or a superuser), the
``org_id`` it names among them. An update finds the record in the operator's orgs.

``POST /api/v2/records/<object>/`` ``{"fields": {...}, "org_id"?}``: 201
``{"object", "record_key", "version", "fields", "changed", "created"}``.

``PATCH /api/v2/records/<object>/<key>/`` ``{"fields": {...}}``: 200, same shape
(``changed`` empty for a no-op).

Errors: 400 ``invalid_request``, ``invalid_identity``, ``unknown_field``, ``invalid_field_value``,
``org_required``; 403 ``org_not_authorized``; 404 ``unknown_object``, ``record_not_found``;
409 + ``Retry-After``: ``owner_contended`` (the record row is held by another transaction now),
``owner_outbound_pending``; 503 ``temporarily_unavailable`` with ``Retry-After``.
"""
from __future__ import annotations

from django.db import DatabaseError
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.authentication import BasicAuthentication, SessionAuthentication
from rest_framework.response import Response
from rest_framework.views import APIView

from connectors.replay_api import IsOperator
from nexusflow.api_errors import error_response
from nexusflow.kernel.admin import operator_org_ids
from nexusflow.kernel.errors import InvalidIdentity
from nexusflow.kernel.identity import validate_key
from nexusflow.kernel.scope import OrgScope

from .edits import record_edit_create, record_edit_update
from .metadata import InvalidFieldValue, UnknownField, UnknownObject, current_view
from .owner import OwnerConflict
from .selectors import operator_org_for_record
from .services import RecordNotFound

UNAVAILABLE_RETRY_AFTER = "5"


class OrgNotAuthorized(Exception):
    code = "org_not_authorized"


class OrgRequired(Exception):
    code = "org_required"


def operator_org_for_create(user, org_id: str | None) -> OrgScope:
    """The org a new record is created in: the operator's only org, or ``org_id`` among the operator's orgs.

    Raises:
        InvalidIdentity: a malformed ``org_id``.
        OrgRequired: the operator acts for several orgs (or all) and named none.
        OrgNotAuthorized: ``org_id`` is not one of the operator's orgs.
    """
    orgs = operator_org_ids(user)
    if org_id is not None:
        validate_key(org_id, field="org_id", max_length=64)
        if orgs is not None and org_id not in orgs:
            raise OrgNotAuthorized(f"the operator does not act for org {org_id!r}")
        return OrgScope(org_id)
    if orgs is None or len(orgs) != 1:
        raise OrgRequired("name the org_id: the operator acts for several orgs")
    return OrgScope(next(iter(orgs)))


def operator_org_for_live_record(user, object_name: str, record_key: str) -> OrgScope:
    """The org holding the live record among the operator's orgs (an unknown object is ``unknown_object``).

    Raises:
        UnknownObject: no such object.
        InvalidIdentity: a malformed key.
        RecordNotFound: no such live record in the operator's orgs (or it is ambiguous).
    """
    current_view().object(object_name)
    return operator_org_for_record(user, object_name, record_key)


def _error(exc) -> Response:
    if isinstance(exc, OwnerConflict):
        return error_response(exc.code, str(exc), status.HTTP_409_CONFLICT,
                              headers={"Retry-After": str(exc.retry_after_seconds)})
    if isinstance(exc, (InvalidIdentity, UnknownField, InvalidFieldValue, OrgRequired)):
        return error_response(exc.code, str(exc), status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, OrgNotAuthorized):
        return error_response(exc.code, str(exc), status.HTTP_403_FORBIDDEN)
    if isinstance(exc, (UnknownObject, RecordNotFound)):
        return error_response(exc.code, str(exc), status.HTTP_404_NOT_FOUND)
    raise exc


_HANDLED = (OwnerConflict, InvalidIdentity, UnknownField, InvalidFieldValue, OrgRequired, OrgNotAuthorized,
            UnknownObject, RecordNotFound)


class RecordEditOutputSerializer(serializers.Serializer):
    object = serializers.CharField()
    record_key = serializers.CharField()
    version = serializers.IntegerField()
    fields = serializers.DictField(child=serializers.CharField(allow_null=True))
    changed = serializers.ListField(child=serializers.CharField())
    created = serializers.BooleanField()

    class Meta:
        ref_name = "RecordEdit"


def _responses(ok: int) -> dict:
    return {
        ok: RecordEditOutputSerializer,
        400: OpenApiResponse(description="invalid_request | invalid_identity | unknown_field | invalid_field_value"
                                         " | org_required"),
        403: OpenApiResponse(description="org_not_authorized"),
        404: OpenApiResponse(description="unknown_object | record_not_found"),
        409: OpenApiResponse(description="owner_contended | owner_outbound_pending (Retry-After)"),
        503: OpenApiResponse(description="temporarily_unavailable (Retry-After)"),
    }


class _EditApi(APIView):
    authentication_classes = [SessionAuthentication, BasicAuthentication]
    permission_classes = [IsOperator]

    def _run(self, request, call, ok_status: int) -> Response:
        serializer = self.InputSerializer(data=request.data if isinstance(request.data, dict) else {})
        if not serializer.is_valid():
            return error_response("invalid_request", serializer.errors, status.HTTP_400_BAD_REQUEST)
        try:
            result = call(serializer.validated_data)
        except _HANDLED as exc:
            return _error(exc)
        except DatabaseError:
            return error_response("temporarily_unavailable", "retry later", status.HTTP_503_SERVICE_UNAVAILABLE,
                                  headers={"Retry-After": UNAVAILABLE_RETRY_AFTER})
        return Response(RecordEditOutputSerializer(result.as_dict()).data, status=ok_status)


class _Text(serializers.CharField):
    """Text as sent: a number or a boolean is refused, not coerced."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class _FieldsField(serializers.DictField):
    def __init__(self, **kwargs):
        super().__init__(child=_Text(allow_null=True, allow_blank=True, trim_whitespace=False), allow_empty=False,
                         **kwargs)


class RecordCreateApi(_EditApi):
    """Create one record; its after-save Flows run in the same transaction."""

    class InputSerializer(serializers.Serializer):
        fields = _FieldsField()
        org_id = serializers.CharField(max_length=64, trim_whitespace=False, required=False)

        class Meta:
            ref_name = "RecordCreateInput"

    @extend_schema(request=InputSerializer, responses=_responses(201))
    def post(self, request, object_name: str):
        def call(values):
            org = operator_org_for_create(request.user, values.get("org_id"))
            return record_edit_create(org=org, object_name=object_name, fields=dict(values["fields"]))
        return self._run(request, call, status.HTTP_201_CREATED)


class RecordUpdateApi(_EditApi):
    """Update fields of one live record; its after-save Flows run in the same transaction."""

    class InputSerializer(serializers.Serializer):
        fields = _FieldsField()

        class Meta:
            ref_name = "RecordUpdateInput"

    @extend_schema(request=InputSerializer, responses=_responses(200))
    def patch(self, request, object_name: str, record_key: str):
        def call(values):
            org = operator_org_for_live_record(request.user, object_name, record_key)
            return record_edit_update(org=org, object_name=object_name, record_key=record_key,
                                      fields=dict(values["fields"]))
        return self._run(request, call, status.HTTP_200_OK)
