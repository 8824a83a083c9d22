from django.contrib import admin

from nexusflow.kernel.admin import ReadOnlyAdmin

from . import models
from .models import (
    AccessPolicyGeneration,
    IdentityTransfer,
    Record,
    RecordFieldHistory,
    RecordHistorySequence,
    RecordShare,
)


@admin.register(Record)
class RecordAdmin(ReadOnlyAdmin):
    list_display = ("record_key", "object_name", "org_id", "owner_id", "version", "updated_at")
    list_filter = ("object_name",)
    search_fields = ("record_key", "owner_id")


@admin.register(RecordFieldHistory)
class RecordFieldHistoryAdmin(ReadOnlyAdmin):
    """The field history of records whose object tracks history: one row per field a write changed."""

    list_display = ("object_name", "record_key", "sequence", "field", "change", "old_value", "new_value",
                    "record_version", "org_id", "created_at")
    list_filter = ("object_name", "change")
    search_fields = ("record_key", "field")


@admin.register(RecordHistorySequence)
class RecordHistorySequenceAdmin(ReadOnlyAdmin):
    list_display = ("object_name", "record_key", "last_sequence", "org_id")
    search_fields = ("record_key",)


@admin.register(IdentityTransfer)
class IdentityTransferAdmin(ReadOnlyAdmin):
    list_display = ("transfer_id", "kind", "source_object", "source_record_key", "target_object",
                    "target_record_key", "org_id", "created_at")
    list_filter = ("kind",)
    search_fields = ("transfer_id", "source_record_key", "target_record_key")


@admin.register(AccessPolicyGeneration)
class AccessPolicyGenerationAdmin(ReadOnlyAdmin):
    """Who may do what: each org's immutable access policy generations (users, permission sets, sharing)."""

    list_display = ("org_id", "generation", "digest", "authored_by", "reason", "created_at")
    search_fields = ("digest",)


@admin.register(RecordShare)
class RecordShareAdmin(ReadOnlyAdmin):
    """Explicit record shares: one immutable entry per grant or revocation; the latest entry is in force."""

    list_display = ("object_name", "record_key", "user_id", "sequence", "access", "authored_by", "reason",
                    "org_id", "created_at")
    list_filter = ("object_name", "access")
    search_fields = ("record_key", "user_id")


@admin.register(models.OperatorToken)
class OperatorTokenAdmin(ReadOnlyAdmin):
    """Operator API tokens: only their digest is stored (``manage.py operator_tokens``)."""

    list_display = ("id", "user", "name", "issued_by", "created_at")
    search_fields = ("name",)


@admin.register(models.OperatorTokenRevocation)
class OperatorTokenRevocationAdmin(ReadOnlyAdmin):
    list_display = ("id", "token", "revoked_by", "reason", "created_at")
