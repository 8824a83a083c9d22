"""Flow support read REST endpoint (seed 004 section 19).

Authenticated operators only (HTTP basic or session; active staff users,
:class:`nexusflow.kernel.permissions.IsOperator`). The trusted org is the path's org **and** must be one of the operator's
``org:<id>`` groups (superusers: any org); a FlowRunId-only read is refused.

``GET /api/v2/flows/orgs/<org_id>/runs/<run_id>/[?include_deleted=1]``:

- 200: the support read (plan, canonical state and legacy projection, current
  step, checkpoint metadata, attempt history, dependency/effect correlation,
  safe terminal cause);
- 400 ``invalid_identity`` (malformed org or run id), ``invalid_request``
  (``include_deleted`` not ``0``/``1``);
- 403 ``org_not_authorized``: the operator may not read that org;
- 404 ``flow_run_not_found``: no visible run with that id in that org.

``GET /api/v2/flows/runs/<run_id>/``: always 400 ``flow_run_org_required``.

Both answer 401 ``not_authenticated`` (with ``WWW-Authenticate``) without
credentials and 403 ``permission_denied`` for a user who is no operator. The
errors are raised and answered by :func:`nexusflow.api_errors.exception_handler`.
"""
from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from nexusflow.api_errors import INVALID_REQUEST, error_response
from nexusflow.api_schema import AUTH_ERRORS, DATABASE_ERRORS, error_responses, id_path, key_path
from nexusflow.kernel.errors import InvalidIdentity
from nexusflow.kernel.identity import validate_key
from nexusflow.kernel.ids import id_from_text
from nexusflow.kernel.permissions import IsOperator, OrgNotAuthorized, require_operator_org
from nexusflow.kernel.scope import OrgScope

from .errors import FlowRunNotFound
from .models import FlowRun
from .services import flow_run_support_read
from .transitions import FLOW_RUN, FLOW_STEP_EXECUTION, LEGACY_STATUS

#: The length of an org id (its column).
ORG_ID_MAX_LENGTH = FlowRun._meta.get_field("org_id").max_length
#: ``include_deleted``: "0" (default) hides a run of a deleted record, "1" shows it.
INCLUDE_DELETED_VALUES = ("0", "1")
#: The code of a FlowRunId-only read.
FLOW_RUN_ORG_REQUIRED = "flow_run_org_required"


class _PlanSerializer(serializers.Serializer):
    plan_id = serializers.CharField()
    plan_digest = serializers.CharField()
    flow_api_name = serializers.CharField()
    flow_version = serializers.CharField(help_text="the metadata digest")
    execution_profile = serializers.CharField()

    class Meta:
        ref_name = "FlowRunPlan"


class _CheckpointSerializer(serializers.Serializer):
    checkpoint_id = serializers.IntegerField()
    sequence = serializers.IntegerField()
    plan_cursor = serializers.CharField(allow_null=True, help_text="the next compiled step key; null at the end")
    context_digest = serializers.CharField()
    context_schema_version = serializers.IntegerField()

    class Meta:
        ref_name = "FlowRunCheckpoint"


class _TriggerSerializer(serializers.Serializer):
    object = serializers.CharField()
    record_key = serializers.CharField()
    record_version = serializers.IntegerField()
    save_depth = serializers.IntegerField()
    triggered_by_run_id = serializers.IntegerField(allow_null=True)

    class Meta:
        ref_name = "FlowRunTrigger"


class _StepSerializer(serializers.Serializer):
    step_id = serializers.IntegerField()
    plan_step_key = serializers.CharField()
    step_kind = serializers.CharField()
    state = serializers.ChoiceField(choices=sorted(FLOW_STEP_EXECUTION.transitions))
    version = serializers.IntegerField()
    attempt_count = serializers.IntegerField()
    run_after = serializers.DateTimeField(allow_null=True)
    reason_code = serializers.CharField(allow_blank=True)
    wait_outcome = serializers.DictField(allow_null=True, help_text="what a committed wait step decided")
    attempts = serializers.ListField(child=serializers.DictField(), help_text="the step's attempts, oldest first")

    class Meta:
        ref_name = "FlowRunStep"


class FlowRunSupportReadSerializer(serializers.Serializer):
    """The section 19 support read (:func:`nexusflow.flows.services.flow_run_support_read`)."""

    run_id = serializers.IntegerField()
    org_id = serializers.CharField()
    plan = _PlanSerializer()
    execution_owner = serializers.CharField()
    state = serializers.ChoiceField(choices=sorted(FLOW_RUN.transitions))
    legacy_status = serializers.ChoiceField(choices=sorted(set(LEGACY_STATUS.values())))
    state_version = serializers.IntegerField()
    ownership_epoch = serializers.IntegerField()
    current_step_id = serializers.IntegerField(allow_null=True)
    current_checkpoint = _CheckpointSerializer(allow_null=True)
    terminal_cause = serializers.CharField(allow_blank=True, help_text="the run's reason code; empty unless halted")
    is_deleted = serializers.BooleanField()
    delete_requested_at = serializers.DateTimeField(allow_null=True)
    started_at = serializers.DateTimeField(allow_null=True)
    completed_at = serializers.DateTimeField(allow_null=True)
    trigger = _TriggerSerializer()
    parent_run_id = serializers.IntegerField(allow_null=True)
    subflow_run_ids = serializers.ListField(child=serializers.IntegerField())
    steps = _StepSerializer(many=True)
    dependencies = serializers.ListField(child=serializers.DictField(), help_text="the run's waits, by id")
    effects = serializers.ListField(child=serializers.DictField(), help_text="the run's effect links, by id")

    class Meta:
        ref_name = "FlowRunSupportRead"


class FlowRunSupportReadApi(APIView):
    """Read one run of one trusted org; never writes."""

    permission_classes = [IsOperator]

    @extend_schema(
        parameters=[key_path("org_id", ORG_ID_MAX_LENGTH, "The trusted org; one of the operator's orgs."),
                    id_path("run_id", "The FlowRun."),
                    OpenApiParameter("include_deleted", str, OpenApiParameter.QUERY, enum=INCLUDE_DELETED_VALUES,
                                     default=INCLUDE_DELETED_VALUES[0],
                                     description="1: also a run whose triggering record is deleted")],
        responses={200: OpenApiResponse(response=FlowRunSupportReadSerializer,
                                        description="the section 19 support read"),
                   **error_responses({400: (InvalidIdentity, INVALID_REQUEST), 403: (OrgNotAuthorized,),
                                      404: (FlowRunNotFound,)}, AUTH_ERRORS, DATABASE_ERRORS)})
    def get(self, request, org_id: str, run_id: str):
        include = request.query_params.get("include_deleted", INCLUDE_DELETED_VALUES[0])
        if include not in INCLUDE_DELETED_VALUES:
            return error_response(INVALID_REQUEST, "include_deleted is 0 or 1", status.HTTP_400_BAD_REQUEST)
        validate_key(org_id, field="org_id", max_length=ORG_ID_MAX_LENGTH)
        run = id_from_text(run_id, FlowRun, field="run id")
        require_operator_org(request.user, org_id, detail="the operator may not read this org")
        body = flow_run_support_read(org=OrgScope(org_id), run_id=run, include_deleted=include == "1")
        return Response(body)


class FlowRunIdOnlyReadApi(APIView):
    """Refuses a FlowRunId-only support read (seed 004 section 19)."""

    permission_classes = [IsOperator]

    @extend_schema(parameters=[OpenApiParameter("run_id", str, OpenApiParameter.PATH,
                                                description="Any text: the read is refused whatever it names.")],
                   responses=error_responses(AUTH_ERRORS, valid_request={400: (FLOW_RUN_ORG_REQUIRED,)}),
                   description="Refuses a FlowRunId-only support read (seed 004 section 19): every request "
                               "answers 400 flow_run_org_required; read /api/v2/flows/orgs/{org_id}/runs/{run_id}/.")
    def get(self, request, run_id: str):
        return error_response(FLOW_RUN_ORG_REQUIRED, "a flow run is read within its trusted org: "
                              "/api/v2/flows/orgs/<org_id>/runs/<run_id>/", status.HTTP_400_BAD_REQUEST)
