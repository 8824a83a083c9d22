"""Read-only support views for every Flow Runtime model (CONVENTIONS.md "Admin")."""
from django.contrib import admin

from nexusflow.kernel.admin import ReadOnlyAdmin, ReasonClassFilter

from .models import (
    FlowActionCatalogGeneration,
    FlowActivation,
    FlowAuditEvent,
    FlowCheckpoint,
    FlowDependency,
    FlowDeploymentSource,
    FlowEffectLink,
    FlowExecutionPlan,
    FlowRun,
    FlowRuntimeMetadataView,
    FlowScheduleOccurrence,
    FlowStepAttempt,
    FlowStepExecution,
    FlowWakeSignal,
)


@admin.register(FlowActionCatalogGeneration)
class FlowActionCatalogGenerationAdmin(ReadOnlyAdmin):
    list_display = ("generation_id", "org_id", "app_installation_id", "runtime_capability_id", "digest", "created_at")
    search_fields = ("generation_id", "digest")


@admin.register(FlowRuntimeMetadataView)
class FlowRuntimeMetadataViewAdmin(ReadOnlyAdmin):
    list_display = ("view_digest", "org_id", "created_at")
    search_fields = ("view_digest",)


@admin.register(FlowExecutionPlan)
class FlowExecutionPlanAdmin(ReadOnlyAdmin):
    list_display = ("plan_id", "flow_api_name", "org_id", "execution_profile", "trigger_object_name", "created_at")
    list_filter = ("execution_profile", "trigger_object_name")
    search_fields = ("plan_id", "flow_api_name", "plan_digest")


@admin.register(FlowDeploymentSource)
class FlowDeploymentSourceAdmin(ReadOnlyAdmin):
    list_display = ("flow_api_name", "org_id", "plan", "requested_profile", "source_digest", "created_at")
    search_fields = ("flow_api_name", "source_digest")


@admin.register(FlowActivation)
class FlowActivationAdmin(ReadOnlyAdmin):
    list_display = ("flow_api_name", "org_id", "plan", "state", "created_at", "superseded_at")
    list_filter = ("state",)
    search_fields = ("flow_api_name",)


@admin.register(FlowScheduleOccurrence)
class FlowScheduleOccurrenceAdmin(ReadOnlyAdmin):
    """A schedule-triggered flow's occurrences: when, how far the admission walk got, how many runs it admitted."""

    list_display = ("id", "org_id", "flow_api_name", "occurrence_at", "state", "considered", "admitted",
                    "cursor_record_key", "created_at", "completed_at")
    list_filter = ("state",)
    search_fields = ("flow_api_name",)


@admin.register(FlowRun)
class FlowRunAdmin(ReadOnlyAdmin):
    """The run support page (seed 004 section 19): canonical state, legacy projection, soft delete."""

    list_display = ("id", "org_id", "plan", "state", "legacy_status", "trigger_object_name", "record_key",
                    "record_version", "save_depth", "triggered_by_run", "parent_run", "reason_code", "reason_class",
                    "is_deleted",
                    "updated_at")
    list_filter = ("state", "legacy_status", "reason_code", ReasonClassFilter, "save_depth", "is_deleted")
    search_fields = ("record_key",)


@admin.register(FlowStepExecution)
class FlowStepExecutionAdmin(ReadOnlyAdmin):
    list_display = ("id", "org_id", "run", "plan_step_key", "step_kind", "state", "reason_code", "reason_class",
                    "attempt_count", "lease_owner", "lease_expires_at")
    list_filter = ("state", "reason_code", ReasonClassFilter, "step_kind")
    search_fields = ("plan_step_key",)


@admin.register(FlowStepAttempt)
class FlowStepAttemptAdmin(ReadOnlyAdmin):
    list_display = ("id", "org_id", "step", "attempt_number", "state", "failure_class", "safe_error_code",
                    "retry_decision", "started_at", "finished_at")
    list_filter = ("state", "failure_class")


@admin.register(FlowCheckpoint)
class FlowCheckpointAdmin(ReadOnlyAdmin):
    """The checkpoint's context is shown as its support projection: sensitive fields redacted to a digest
    (:mod:`nexusflow.flows.redaction`, seed 004 section 17.3)."""

    list_display = ("id", "org_id", "run", "sequence", "plan_cursor", "context_digest", "created_at")
    exclude = ("context_payload",)

    def get_readonly_fields(self, request, obj=None):
        return [f for f in super().get_readonly_fields(request, obj) if f != "context_payload"] + ["context"]

    @admin.display(description="context (support projection: sensitive fields redacted)")
    def context(self, obj) -> str:
        return _projected(obj.context_payload)


@admin.register(FlowDependency)
class FlowDependencyAdmin(ReadOnlyAdmin):
    list_display = ("id", "org_id", "run", "step", "producer_kind", "dependency_key", "state", "reason_code",
                    "reason_class", "deadline", "expiry_policy", "resolved_at")
    list_filter = ("state", "reason_code", ReasonClassFilter, "producer_kind")
    search_fields = ("dependency_key",)
    exclude = ("condition", "resolution")

    def get_readonly_fields(self, request, obj=None):
        hidden = {"condition", "resolution"}
        return [f for f in super().get_readonly_fields(request, obj) if f not in hidden] + [
            "condition_projection", "resolution_projection"]

    @admin.display(description="condition (sensitive fields redacted)")
    def condition_projection(self, obj) -> str:
        return _projected(obj.condition)

    @admin.display(description="resolution (sensitive fields redacted)")
    def resolution_projection(self, obj) -> str:
        return _projected(obj.resolution)


def _projected(value) -> str:
    import json

    from .redaction import support_projection

    return json.dumps(support_projection(value), indent=2, sort_keys=True, ensure_ascii=False)


@admin.register(FlowWakeSignal)
class FlowWakeSignalAdmin(ReadOnlyAdmin):
    list_display = ("id", "org_id", "flow_run_id", "producer_kind", "dependency_key", "wake_version", "receipt_id",
                    "state", "received_at", "consumed_at")
    list_filter = ("state", "producer_kind")
    search_fields = ("dependency_key",)


@admin.register(FlowEffectLink)
class FlowEffectLinkAdmin(ReadOnlyAdmin):
    list_display = ("id", "org_id", "run", "step", "effect_owner_kind", "outbound_command_id", "created_at")
    search_fields = ("effect_handoff_key",)


@admin.register(FlowAuditEvent)
class FlowAuditEventAdmin(ReadOnlyAdmin):
    list_display = ("id", "org_id", "run", "step", "attempt", "event", "created_at")
    list_filter = ("event",)
