"""CRM record store schema (ARCHITECTURE.md section 3: records.Record).

Objects and fields are defined by metadata files (``metadata/objects``), not
by code. A record keeps its field values and its compatibility mirror fields
as JSON documents validated against that metadata.
"""
from django.db import models

from nexusflow.kernel.identity import IdentityField
from nexusflow.kernel.models import GuardedModel


class Record(GuardedModel):
    org_id = IdentityField(max_length=64)
    object_name = IdentityField(max_length=80)
    record_key = IdentityField(max_length=64, help_text="Stable record id, e.g. 003000000000001.")
    fields = models.JSONField(default=dict)
    mirrors = models.JSONField(default=dict, help_text="Compatibility mirror fields; never PATCH authority.")
    version = models.PositiveBigIntegerField(default=1)
    is_deleted = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["org_id", "object_name", "record_key"], name="record_identity_uniq"),
        ]

    def __str__(self) -> str:
        return f"{self.object_name}:{self.record_key}"
