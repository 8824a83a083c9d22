"""Read-only support views for Runtime facts."""
from django.contrib import admin

from nexusflow.kernel.admin import ReadOnlyAdmin

from . import models


@admin.register(models.OutboundCommand)
class OutboundCommandAdmin(ReadOnlyAdmin):
    list_display = ("id", "org_id", "contract_key", "source_object", "source_record_key", "source_record_version",
                    "created_at")
    search_fields = ("source_record_key", "idempotency_key")


@admin.register(models.ApplicationResult)
class ApplicationResultAdmin(ReadOnlyAdmin):
    list_display = ("id", "org_id", "command_id", "outcome", "created_at")
    list_filter = ("outcome",)


@admin.register(models.OutboxMessage)
class OutboxMessageAdmin(ReadOnlyAdmin):
    list_display = ("id", "org_id", "family", "message_key", "command", "state", "delivery_attempts",
                    "reconcile_attempts", "next_attempt_at", "delivered_at")
    list_filter = ("state", "family")
    search_fields = ("message_key", "payload_digest")


@admin.register(models.InboxAcceptance)
class InboxAcceptanceAdmin(ReadOnlyAdmin):
    list_display = ("id", "org_id", "family", "message_key", "state", "consumer", "accepted_ref",
                    "outbox_message_id", "created_at")
    list_filter = ("state", "family")
    search_fields = ("message_key", "accepted_ref")


@admin.register(models.IntentResultReceipt)
class IntentResultReceiptAdmin(ReadOnlyAdmin):
    list_display = ("id", "command", "outcome", "remote_id", "created_at")
    list_filter = ("outcome",)


@admin.register(models.ReplayRecordWrite)
class ReplayRecordWriteAdmin(ReadOnlyAdmin):
    list_display = ("id", "org_id", "object_name", "record_key", "record_version", "command_id", "created_at")
    search_fields = ("record_key", "command_id")


@admin.register(models.RuntimePolicyGeneration)
class RuntimePolicyGenerationAdmin(ReadOnlyAdmin):
    list_display = ("id", "scope", "generation", "policy_version", "authored_by", "reason", "created_at")
    list_filter = ("scope",)
    search_fields = ("digest", "policy_version")
