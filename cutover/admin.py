"""Read-only support views for cutover evidence and decisions."""
from django.contrib import admin

from nexusflow.kernel.admin import ReadOnlyAdmin

from . import models


@admin.register(models.CutoverDecision)
class CutoverDecisionAdmin(ReadOnlyAdmin):
    list_display = ("attempt_key", "org_id", "mode", "state", "epoch_id", "updated_at")


@admin.register(models.CutoverEvidence)
class CutoverEvidenceAdmin(ReadOnlyAdmin):
    list_display = ("attempt_key", "kind", "account_key", "digest", "created_at")
    list_filter = ("kind",)


@admin.register(models.CutoverReadinessCertificate)
class CutoverReadinessCertificateAdmin(ReadOnlyAdmin):
    list_display = ("attempt_key", "org_id", "epoch_id", "configuration_id", "digest", "created_at")
    search_fields = ("attempt_key", "digest")
    exclude = ("document",)

    def get_readonly_fields(self, request, obj=None):
        return [f for f in super().get_readonly_fields(request, obj) if f != "document"] + ["certified_document"]

    @admin.display(description="document (canonical JSON)")
    def certified_document(self, obj) -> str:
        return bytes(obj.document).decode("utf-8")
