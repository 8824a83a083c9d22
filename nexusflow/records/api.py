"""Record REST endpoints: deletion through the installed lifecycle (seed 000).

Authenticated operators only (HTTP basic or session; active staff users,
:class:`nexusflow.kernel.permissions.IsOperator`). The org comes from the
operator's ``org:<id>`` groups, never from the payload or the URL.

``DELETE /api/v2/records/<object>/<record_key>/``:

- 204: the record is deleted (Runtime owner check passed; its active push
  links are suspended ``source_deleted``);
- 400 ``invalid_identity``: malformed object or record key (before any read);
- 404 ``record_not_found``: no live record with this identity in the operator's orgs;
- 409 ``owner_outbound_pending`` / ``owner_contended`` with ``Retry-After``:
  unfinished or committing Runtime outbound work; retry later;
- 403 ``access_denied``: the org's access policy refuses the caller the deletion (object permission or record
  access; :func:`nexusflow.records.edit_api.caller_principal`);
- 401 ``not_authenticated`` (with ``WWW-Authenticate``); 403 ``permission_denied``: not an operator.
"""
from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from nexusflow.api_schema import AUTH_ERRORS, DATABASE_ERRORS, error_responses
from nexusflow.kernel.errors import InvalidIdentity
from nexusflow.kernel.permissions import IsOperator

from .access import AccessDenied
from .edit_api import RECORD_PATH, RecordUpdateApi, caller_principal
from .edits import require_record_access
from .owner import OwnerContended, OwnerWorkPending
from .selectors import operator_org_for_record
from .services import RecordNotFound, record_delete_by_key


class RecordDeleteApi(APIView):
    """Delete one record through the installed deletion lifecycle (seed 000)."""

    permission_classes = [IsOperator]

    @extend_schema(
        parameters=RECORD_PATH,
        request=None,
        responses={204: OpenApiResponse(description="deleted"),
                   **error_responses({400: (InvalidIdentity,), 404: (RecordNotFound,),
                                      409: (OwnerWorkPending, OwnerContended)}, AUTH_ERRORS, DATABASE_ERRORS,
                                     valid_request={403: (AccessDenied,)})},
    )
    def delete(self, request, object_name: str, record_key: str):
        org = operator_org_for_record(request.user, object_name, record_key)
        principal = caller_principal(request, org)
        record_delete_by_key(org=org, object_name=object_name, record_key=record_key,
                             authorize=None if principal is None
                             else (lambda record: require_record_access(principal, record, "delete")))
        return Response(status=status.HTTP_204_NO_CONTENT)


class RecordDetailApi(RecordUpdateApi, RecordDeleteApi):
    """One record's route: ``PATCH`` updates its fields, ``DELETE`` deletes it (seed 000 owner protection)."""
