"""Local record edit REST endpoints (what an operator UI or API client does).

Authenticated operators only (HTTP basic or session; active staff users,
:class:`nexusflow.kernel.permissions.IsOperator`). The org is the operator's:
the one ``org:<id>`` group it acts for, or, for an operator of several orgs (or
a superuser), the ``org_id`` it names among them. An update finds the record in
the operator's orgs.

``POST /api/v2/records/<object>/`` ``{"fields": {...}, "org_id"?}``: 201
``{"object", "record_key", "version", "fields", "changed", "created"}``.

``PATCH /api/v2/records/<object>/<key>/`` ``{"fields": {...}}``: 200, same shape
(``changed`` empty for a no-op).

Errors: 400 ``invalid_request``, ``invalid_identity``, ``unknown_field``, ``invalid_field_value``,
``org_required``; 403 ``org_not_authorized``, ``access_denied`` (the org's access policy refuses the caller:
object permission, field-level security or record access; see :func:`caller_principal`); 404 ``unknown_object``, ``record_not_found``;
409 + ``Retry-After``: ``owner_contended`` (the record row is held by another transaction now),
``owner_outbound_pending``; 503 ``temporarily_unavailable`` with ``Retry-After``; 401 ``not_authenticated``
(with ``WWW-Authenticate``), 403 ``permission_denied`` for a user who is no operator. The errors are raised
and answered by :func:`nexusflow.api_errors.exception_handler`.
"""
from __future__ import annotations

from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from nexusflow.api_errors import INVALID_REQUEST, error_response
from nexusflow.api_schema import AUTH_ERRORS, DATABASE_ERRORS, JSON_BODY_ERRORS, error_responses, key_field, key_path
from nexusflow.kernel.errors import InvalidIdentity, NexusError
from nexusflow.kernel.identity import validate_key
from nexusflow.kernel.permissions import IsOperator, OrgNotAuthorized, operator_org_ids, require_operator_org
from nexusflow.kernel.scope import OrgScope

from .access import AccessDenied
from .edits import record_edit_create, record_edit_update
from .metadata import InvalidFieldValue, UnknownField, UnknownObject, current_view
from .models import Record
from .owner import OwnerContended, OwnerWorkPending
from .selectors import operator_org_for_record, operator_principal
from .services import RecordNotFound

#: The length of an org id, an object name and a record key (their columns).
ORG_ID_MAX_LENGTH = Record._meta.get_field("org_id").max_length
OBJECT_NAME_MAX_LENGTH = Record._meta.get_field("object_name").max_length
RECORD_KEY_MAX_LENGTH = Record._meta.get_field("record_key").max_length
#: The path of a record, in the schema.
OBJECT_PATH = key_path("object_name", OBJECT_NAME_MAX_LENGTH, "The object's API name in the metadata view.")
RECORD_PATH = [OBJECT_PATH, key_path("record_key", RECORD_KEY_MAX_LENGTH, "The record's stable key.")]


class OrgRequired(NexusError):
    """The operator acts for several orgs (or all) and named none (HTTP 400)."""

    code = "org_required"
    http_status = 400


def operator_org_for_create(user, org_id: str | None) -> OrgScope:
    """The org a new record is created in: the operator's only org, or ``org_id`` among the operator's orgs.

    Raises:
        InvalidIdentity: a malformed ``org_id``.
        OrgRequired: the operator acts for several orgs (or all) and named none.
        OrgNotAuthorized: ``org_id`` is not one of the operator's orgs.
    """
    if org_id is not None:
        validate_key(org_id, field="org_id", max_length=ORG_ID_MAX_LENGTH)
        require_operator_org(user, org_id)
        return OrgScope(org_id)
    orgs = operator_org_ids(user)
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


def caller_principal(request, org: OrgScope):
    """The access-policy principal the authenticated operator acts as in ``org`` (``None``: no policy).

    The org's access policy maps operator login names to its users (``operators``); an operator it does not
    map may do nothing (seed 004 section 17: the record REST endpoints enforce the policy for the caller).
    """
    return operator_principal(org_id=org.org_id, login=request.user.get_username())


class RecordEditOutputSerializer(serializers.Serializer):
    object = serializers.CharField()
    record_key = serializers.CharField()
    version = serializers.IntegerField()
    fields = serializers.DictField(child=serializers.CharField(allow_null=True))
    changed = serializers.ListField(child=serializers.CharField())
    created = serializers.BooleanField()

    class Meta:
        ref_name = "RecordEdit"


def _responses(ok: int, errors: dict, valid_request: dict) -> dict:
    """The answers of an edit: ``ok`` with the record, or the errors every edit shares plus ``errors``.

    Which field names and values an object takes is its metadata's (L2), not the schema's: a field the
    object does not have answers 400 ``unknown_field``, a value its type refuses ``invalid_field_value``
    (codes of valid requests, with ``valid_request``'s).
    """
    return {ok: RecordEditOutputSerializer, **error_responses(
        {400: (INVALID_REQUEST, InvalidIdentity), 404: (UnknownObject,), 409: (OwnerContended, OwnerWorkPending)},
        errors, JSON_BODY_ERRORS, AUTH_ERRORS, DATABASE_ERRORS,
        valid_request={400: (UnknownField, InvalidFieldValue, *valid_request.get(400, ())), 403: (AccessDenied,)})}


class _EditApi(APIView):
    permission_classes = [IsOperator]

    def _run(self, request, call, ok_status: int) -> Response:
        serializer = self.InputSerializer(data=request.data if isinstance(request.data, dict) else {})
        if not serializer.is_valid():
            return error_response(INVALID_REQUEST, serializer.errors, status.HTTP_400_BAD_REQUEST)
        result = call(serializer.validated_data)
        return Response(RecordEditOutputSerializer(result.as_dict()).data, status=ok_status)


class _Text(serializers.CharField):
    """Text as sent: a number or a boolean is refused, not coerced."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


@extend_schema_field({"type": "object", "minProperties": 1,
                      "description": "field API name -> text as sent, or null to clear; the object's metadata "
                                     "decides which names and values it takes",
                      "additionalProperties": {"type": "string", "nullable": True, "pattern": r"^[^\x00]*$"}})
class _FieldsField(serializers.DictField):
    def __init__(self, **kwargs):
        super().__init__(child=_Text(allow_null=True, allow_blank=True, trim_whitespace=False), allow_empty=False,
                         **kwargs)


class RecordCreateApi(_EditApi):
    """Create one record; its after-save Flows run in the same transaction."""

    class InputSerializer(serializers.Serializer):
        fields = _FieldsField()
        org_id = key_field(ORG_ID_MAX_LENGTH, required=False)

        class Meta:
            ref_name = "RecordCreateInput"

    @extend_schema(parameters=[OBJECT_PATH], request={"application/json": InputSerializer},
                   responses=_responses(201, {403: (OrgNotAuthorized,)}, {400: (OrgRequired,)}))
    def post(self, request, object_name: str):
        def call(values):
            org = operator_org_for_create(request.user, values.get("org_id"))
            return record_edit_create(org=org, object_name=object_name, fields=dict(values["fields"]),
                                      principal=caller_principal(request, org))
        return self._run(request, call, status.HTTP_201_CREATED)


class RecordUpdateApi(_EditApi):
    """Update fields of one live record; its after-save Flows run in the same transaction."""

    class InputSerializer(serializers.Serializer):
        fields = _FieldsField()

        class Meta:
            ref_name = "RecordUpdateInput"

    @extend_schema(parameters=RECORD_PATH, request={"application/json": InputSerializer},
                   responses=_responses(200, {404: (RecordNotFound,)}, {}))
    def patch(self, request, object_name: str, record_key: str):
        def call(values):
            org = operator_org_for_live_record(request.user, object_name, record_key)
            return record_edit_update(org=org, object_name=object_name, record_key=record_key,
                                      fields=dict(values["fields"]), principal=caller_principal(request, org))
        return self._run(request, call, status.HTTP_200_OK)
