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


class _CertificateAdmin(ReadOnlyAdmin):
    """A certificate's exact stored bytes shown as text (its binary ``document`` column is not editable)."""

    search_fields = ("attempt_key", "digest")
    exclude = ("document",)

    def get_readonly_fields(self, request, obj=None):
        return [f for f in super().get_readonly_fields(request, obj) if f != "document"] + ["certified_document"]

    @admin.display(description="document (canonical JSON)")
    def certified_document(self, obj) -> str:
        return bytes(obj.document).decode("utf-8")


@admin.register(models.CutoverReadinessCertificate)
class CutoverReadinessCertificateAdmin(_CertificateAdmin):
    list_display = ("attempt_key", "org_id", "epoch_id", "configuration_id", "digest", "created_at")


@admin.register(models.V1ShutdownCertificate)
class V1ShutdownCertificateAdmin(_CertificateAdmin):
    list_display = ("attempt_key", "org_id", "readiness_digest", "digest", "created_at")


@admin.register(models.OrderingBaseline)
class OrderingBaselineAdmin(ReadOnlyAdmin):
    list_display = ("attempt_key", "account_key", "route_key", "partition_key", "origin", "created_at")
    list_filter = ("origin",)
    search_fields = ("attempt_key", "account_key", "route_key")
    exclude = ("position",)

    def get_readonly_fields(self, request, obj=None):
        return [f for f in super().get_readonly_fields(request, obj) if f != "position"] + ["position_text"]

    @admin.display(description="position (canonical JSON or stream cursor bytes)")
    def position_text(self, obj) -> str:
        return "" if obj.position is None else bytes(obj.position).decode("utf-8", "replace")


@admin.register(models.V1RestorePoint)
class V1RestorePointAdmin(ReadOnlyAdmin):
    list_display = ("attempt_key", "org_id", "certificate_digest", "manifest_digest", "created_at")
    search_fields = ("attempt_key", "manifest_digest")
    exclude = ("manifest",)

    def get_readonly_fields(self, request, obj=None):
        return [f for f in super().get_readonly_fields(request, obj) if f != "manifest"] + ["manifest_text"]

    @admin.display(description="manifest (canonical JSON)")
    def manifest_text(self, obj) -> str:
        return bytes(obj.manifest).decode("utf-8")


@admin.register(models.RestoreAttempt)
class RestoreAttemptAdmin(ReadOnlyAdmin):
    list_display = ("attempt_key", "org_id", "state", "holder_fence", "holder", "restore_point_id", "updated_at")
    list_filter = ("state",)
    search_fields = ("attempt_key", "manifest_digest")
