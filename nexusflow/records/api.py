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
from rest_framework.response import Response
from rest_framework.views import APIView

from connectors.replay_api import IsOperator
from nexusflow.api_errors import error_response
from nexusflow.kernel.errors import InvalidIdentity

from .edit_api import RecordUpdateApi
from .owner import OwnerConflict
from .selectors import operator_org_for_record
from .services import RecordNotFound, record_delete_by_key


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


class RecordDetailApi(RecordUpdateApi, RecordDeleteApi):
    """One record's route: ``PATCH`` updates its fields, ``DELETE`` deletes it (seed 000 owner protection)."""
