from django.contrib import admin

from nexusflow.kernel.admin import ReadOnlyAdmin

from .models import IdentityTransfer, Record


@admin.register(Record)
class RecordAdmin(ReadOnlyAdmin):
    list_display = ("record_key", "object_name", "org_id", "version", "updated_at")
    list_filter = ("object_name",)
    search_fields = ("record_key",)


@admin.register(IdentityTransfer)
class IdentityTransferAdmin(ReadOnlyAdmin):
    list_display = ("transfer_id", "kind", "source_object", "source_record_key", "target_object",
                    "target_record_key", "org_id", "created_at")
    list_filter = ("kind",)
    search_fields = ("transfer_id", "source_record_key", "target_record_key")
