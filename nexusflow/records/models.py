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


class RecordHistorySequence(GuardedModel):
    """The history sequence of one record: the last number its field history used (seed 004 section 13.1).

    Reserved (row-locked and advanced) by each write of a record whose object tracks history, after the
    record's business row and before any Flow lifecycle row: the history-sequence lock class.
    """

    org_id = IdentityField(max_length=64)
    object_name = IdentityField(max_length=80)
    record_key = IdentityField(max_length=64)
    last_sequence = models.PositiveBigIntegerField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["org_id", "object_name", "record_key"],
                                               name="record_history_sequence_uniq")]

    def __str__(self) -> str:
        return f"{self.object_name}:{self.record_key} #{self.last_sequence}"


class RecordFieldHistory(GuardedModel):
    """One field change of a record whose object tracks history; immutable once written.

    ``sequence`` is the record's history sequence of the write (every field it changed shares it);
    ``change`` is ``create``, ``update`` or ``delete`` (a deletion has one row, field ``*``).
    """

    org_id = IdentityField(max_length=64)
    object_name = IdentityField(max_length=80)
    record_key = IdentityField(max_length=64)
    sequence = models.PositiveBigIntegerField()
    field = IdentityField(max_length=80)
    change = models.CharField(max_length=8)
    old_value = models.TextField(null=True)
    new_value = models.TextField(null=True)
    record_version = models.PositiveBigIntegerField()
    created_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["org_id", "object_name", "record_key", "sequence", "field"],
                                               name="record_field_history_uniq")]

    def __str__(self) -> str:
        return f"{self.object_name}:{self.record_key} #{self.sequence} {self.field}"


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
