"""Record REST endpoints: deletion through the installed lifecycle (seed 000).

Authenticated operators only (session or HTTP basic; active staff users). The
org comes from the operator's ``org:<id>`` groups, never from the payload or
the URL.

``DELETE /api/v2/records/<object>/<record_key>/``:

- 204: the record is deleted (Runtime owner check passed; its active push
  links are suspended ``source_deleted``);
- 400 ``invalid_identity``: malformed object or record key (before any read);
- 404 ``record_not_found``: no live record with this identity in the operator's orgs;
- 409 ``owner_outbound_pending`` / ``owner_contended`` with ``Retry-After``:
  unfinished or committing Runtime outbound work; retry later.
"""
from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.authentication import BasicAuthentication, SessionAuthentication
from rest_framework.permissions import BasePermission
from rest_framework.response import Response
from rest_framework.views import APIView

from nexusflow.api_errors import error_response
from nexusflow.kernel.admin import operator_org_ids
from nexusflow.kernel.errors import InvalidIdentity
from nexusflow.kernel.identity import validate_key
from nexusflow.kernel.scope import OrgScope

from .models import Record
from .services import RecordNotFound, record_delete_by_key


class IsOperator(BasePermission):
    """An active staff user."""

    def has_permission(self, request, view):
        user = request.user
        return bool(user and user.is_authenticated and user.is_active and user.is_staff)


def operator_org_for_record(user, object_name: str, record_key: str) -> OrgScope:
    """The org, among the operator's orgs, that holds the live record ``object_name``/``record_key``.

    Raises:
        InvalidIdentity: malformed ``object_name`` or ``record_key``.
        RecordNotFound: no such live record in the operator's orgs (or it is ambiguous).
    """
    validate_key(object_name, field="object", max_length=80)
    validate_key(record_key, field="record_key", max_length=64)
    orgs = operator_org_ids(user)
    rows = Record.objects.filter(object_name=object_name, record_key=record_key, is_deleted=False)
    if orgs is not None:
        rows = rows.filter(org_id__in=sorted(orgs))
    found = list(rows.values_list("org_id", flat=True)[:2])
    if len(found) != 1:
        raise RecordNotFound(f"no live {object_name} record {record_key!r}")
    return OrgScope(found[0])


class RecordDeleteApi(APIView):
    """Delete one record through the installed deletion lifecycle (seed 000)."""

    authentication_classes = [SessionAuthentication, BasicAuthentication]
    permission_classes = [IsOperator]

    @extend_schema(
        request=None,
        responses={204: OpenApiResponse(description="deleted"),
                   400: OpenApiResponse(description="invalid_identity"),
                   404: OpenApiResponse(description="record_not_found"),
                   409: OpenApiResponse(description="owner_outbound_pending | owner_contended (Retry-After)")},
    )
    def delete(self, request, object_name: str, record_key: str):
        from runtime_outbox.owner import OwnerConflict

        try:
            org = operator_org_for_record(request.user, object_name, record_key)
            record_delete_by_key(org=org, object_name=object_name, record_key=record_key)
        except InvalidIdentity as exc:
            return error_response(exc.code, str(exc), status.HTTP_400_BAD_REQUEST)
        except RecordNotFound as exc:
            return error_response(exc.code, str(exc), status.HTTP_404_NOT_FOUND)
        except OwnerConflict as exc:
            return error_response(exc.code, str(exc), status.HTTP_409_CONFLICT,
                                  headers={"Retry-After": str(exc.retry_after_seconds)})
        return Response(status=status.HTTP_204_NO_CONTENT)
