from django.contrib import admin

from nexusflow.kernel.admin import ReadOnlyAdmin

from .models import IdentityTransfer, Record, RecordFieldHistory, RecordHistorySequence


@admin.register(Record)
class RecordAdmin(ReadOnlyAdmin):
    list_display = ("record_key", "object_name", "org_id", "version", "updated_at")
    list_filter = ("object_name",)
    search_fields = ("record_key",)


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
