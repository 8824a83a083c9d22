from django.contrib import admin

from nexusflow.kernel.admin import ReadOnlyAdmin

from .models import Record


@admin.register(Record)
class RecordAdmin(ReadOnlyAdmin):
    list_display = ("record_key", "object_name", "org_id", "version", "updated_at")
    list_filter = ("object_name",)
    search_fields = ("record_key",)
