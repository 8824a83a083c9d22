"""Read-only support views for every Connector fact."""
from django.contrib import admin

from connectors import models
from nexusflow.kernel.admin import ReadOnlyAdmin, ReasonClassFilter


@admin.register(models.AccountServingGate)
class AccountServingGateAdmin(ReadOnlyAdmin):
    list_display = ("account_key", "org_id", "state", "reason_code", "reason_class", "fence_token", "epoch",
                    "updated_at")
    list_filter = ("state", "reason_code", ReasonClassFilter)


@admin.register(models.ServingEpoch)
class ServingEpochAdmin(ReadOnlyAdmin):
    list_display = ("id", "org_id", "state", "reason_code", "reason_class", "digest", "activated_at")
    list_filter = ("state", "reason_code", ReasonClassFilter)


@admin.register(models.Receipt)
class ReceiptAdmin(ReadOnlyAdmin):
    list_display = ("id", "account_key", "channel", "route_key", "component_count", "quarantined_count", "received_at")
    exclude = ("body",)


@admin.register(models.ReceiptComponent)
class ReceiptComponentAdmin(ReadOnlyAdmin):
    list_display = ("receipt", "ordinal", "disposition", "reason_code", "reason_class", "event")
    list_filter = ("disposition", "reason_code", ReasonClassFilter)


@admin.register(models.Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = ("id", "account_key", "canonical_kind", "source_event_key", "source_locator", "occurred_at_ms")
    search_fields = ("source_event_key", "source_locator")


@admin.register(models.Execution)
class ExecutionAdmin(ReadOnlyAdmin):
    list_display = ("id", "org_id", "state", "reason_code", "reason_class", "lane", "command_id", "updated_at")
    list_filter = ("state", "reason_code", ReasonClassFilter)


@admin.register(models.OrderingLane)
class OrderingLaneAdmin(ReadOnlyAdmin):
    list_display = ("id", "account_key", "route_key", "partition", "active_execution_id", "baseline_origin")


@admin.register(models.ProjectionWindow)
class ProjectionWindowAdmin(ReadOnlyAdmin):
    list_display = ("id", "org_id", "account_key", "route_key", "policy", "state", "reason_code", "reason_class",
                    "member_count", "close_at", "opened_at")
    list_filter = ("state", "policy", "reason_code", ReasonClassFilter)


@admin.register(models.ExecutionDependency)
class ExecutionDependencyAdmin(ReadOnlyAdmin):
    list_display = ("id", "org_id", "execution", "requirement", "disposition", "state", "deadline_at", "created_at")
    list_filter = ("state", "requirement", "disposition")
@admin.register(models.OrderingHandoff)
class OrderingHandoffAdmin(ReadOnlyAdmin):
    list_display = ("id", "org_id", "state", "predecessor_epoch", "successor_epoch", "account_key",
                    "route_key", "predecessor_lane", "successor_lane", "created_at")
    list_filter = ("state",)
    exclude = ("high_water_position",)


@admin.register(models.RemoteEffect)
class RemoteEffectAdmin(ReadOnlyAdmin):
    list_display = ("id", "org_id", "contract_key", "state", "reason_code", "reason_class", "dispatch_lane",
                    "attempt_count", "attempt_ordinal", "create_slot", "remote_id", "updated_at")
    list_filter = ("state", "reason_code", ReasonClassFilter, "dispatch_lane")
    search_fields = ("link_key", "remote_id")


@admin.register(models.RemoteEffectEvidence)
class RemoteEffectEvidenceAdmin(ReadOnlyAdmin):
    list_display = ("id", "org_id", "effect", "kind", "actor", "from_state", "to_state", "created_at")
    list_filter = ("kind",)


@admin.register(models.DispatchPermit)
class DispatchPermitAdmin(ReadOnlyAdmin):
    list_display = ("id", "attempt", "state", "holder_id", "io_may_have_started_at")
    list_filter = ("state",)


@admin.register(models.CredentialGenerationDispatchGate)
class CredentialGenerationDispatchGateAdmin(ReadOnlyAdmin):
    list_display = ("id", "org_id", "credential_generation", "state", "reason_code", "reason_class", "fence_token",
                    "paused_until", "pause_kind", "pause_status")
    list_filter = ("state", "reason_code", ReasonClassFilter, "pause_kind")


@admin.register(models.RemoteLink)
class RemoteLinkAdmin(ReadOnlyAdmin):
    list_display = ("id", "source_object", "source_record_key", "destination_slot_id", "remote_id", "state",
                    "reason_code", "reason_class", "last_validated_install_id", "mirror_status", "last_pushed_version")
    list_filter = ("state", "reason_code", ReasonClassFilter, "action_type")
    search_fields = ("remote_id", "source_record_key")


@admin.register(models.CatalogBinding)
class CatalogBindingAdmin(ReadOnlyAdmin):
    list_display = ("pack_generation", "ordinal", "kind", "business_key", "owner_pack", "definition_version",
                    "definition_digest")
    list_filter = ("kind",)
    search_fields = ("business_key", "row_id")


@admin.register(models.StreamCursor)
class StreamCursorAdmin(ReadOnlyAdmin):
    list_display = ("id", "org_id", "account_key", "route_key", "state", "cursor_text", "batches", "last_receipt_id",
                    "updated_at")
    list_filter = ("state",)

    @admin.display(description="cursor")
    def cursor_text(self, obj):
        return bytes(obj.cursor).decode("utf-8", "replace") if obj.cursor is not None else "(start)"


for model in (models.PackGeneration, models.ConnectorServiceConfigurationGeneration, models.CredentialGeneration,
              models.GateTransitionEvidence, models.ReceiptAdmissionKey,
              models.Projection, models.ExecutionAttempt, models.OrderingDecision, models.RemoteEffectAttempt):
    admin.site.register(model, type(f"{model.__name__}Admin", (ReadOnlyAdmin,), {}))


@admin.register(models.ReplayRequest)
class ReplayRequestAdmin(ReadOnlyAdmin):
    list_display = ("id", "org_id", "account_key", "replay_id", "target_epoch", "predecessor_event_id",
                    "external_effects", "principal", "created_at")
    search_fields = ("replay_id", "source_event_key")


@admin.register(models.WorkerProcess)
class WorkerProcessAdmin(ReadOnlyAdmin):
    """The holder registry: worker process generations and, once proven, their termination."""

    list_display = ("worker_id", "role", "host", "pid", "started_at", "terminated_at")
    list_filter = ("role", "host")


@admin.register(models.RemoteLinkEvidence)
class RemoteLinkEvidenceAdmin(ReadOnlyAdmin):
    list_display = ("id", "org_id", "link", "kind", "from_state", "to_state", "actor", "created_at")
    list_filter = ("kind", "to_state")


@admin.register(models.PushLinkRevalidationReceipt)
class PushLinkRevalidationReceiptAdmin(ReadOnlyAdmin):
    """Append-only mapping revalidation receipts (seed 002 CARVE_DOWN): read-only like every support view."""

    list_display = ("id", "org_id", "operation_id", "link", "old_mapping_fingerprint", "new_mapping_fingerprint",
                    "approved_by", "created_at")
    search_fields = ("operation_id", "link_key")


# The V1 runtime being retired: its support views (connectors/v1/admin.py).
from connectors.v1 import admin as _v1_admin  # noqa: F401 - importing registers the admin views


@admin.register(models.ServingPublicationBarrierSet)
class ServingPublicationBarrierSetAdmin(ReadOnlyAdmin):
    """Which activation attempt holds an org's publication barriers, under which holder fence."""

    list_display = ("id", "org_id", "attempt_key", "epoch_id", "state", "holder_fence", "holder", "release_reason",
                    "updated_at")
    list_filter = ("state",)
