"""CRM record store schema (ARCHITECTURE.md section 3: records.Record).

Objects and fields are defined by metadata files (``metadata/objects``), not
by code. A record keeps its field values and its compatibility mirror fields
as JSON documents validated against that metadata.
"""
from django.db import models

from nexusflow.kernel.identity import IdentityField
from nexusflow.kernel.models import GuardedModel


class Record(GuardedModel):
    """A CRM record of one object, versioned; its owner fence, deletion tombstone and compatibility mirror fields."""

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


class IdentityTransfer(GuardedModel):
    """One completed identity transfer (merge or conversion): a durable, immutable fact.

    Keyed by the caller's ``transfer_id``; ``request_digest`` binds the inputs
    so the same id with other inputs is refused. ``moves`` lists, per admitted
    connector owner, the remote authority that moved (owner, destination slot,
    remote scope, remote id, old and new link keys, mirror field).
    Seed 000, "Transfer".
    """

    org_id = IdentityField(max_length=64)
    transfer_id = IdentityField(max_length=120)
    kind = models.CharField(max_length=16, help_text="merge | convert")
    request_digest = IdentityField(max_length=64)
    source_object = IdentityField(max_length=80)
    source_record_key = IdentityField(max_length=64)
    target_object = IdentityField(max_length=80)
    target_record_key = IdentityField(max_length=64)
    target_created = models.BooleanField(default=False, help_text="The conversion created the target record.")
    moves = models.JSONField(help_text="Remote authority moved, one entry per link, grouped by connector owner.")
    owner_intents = models.JSONField(help_text="Terminal outbound intents of source and target at the check.")
    actor = models.CharField(max_length=120)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["org_id", "transfer_id"], name="identity_transfer_uniq"),
        ]

    def __str__(self) -> str:
        return f"{self.kind}:{self.transfer_id}"
