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
