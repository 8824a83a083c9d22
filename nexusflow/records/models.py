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
    owner_id = IdentityField(max_length=64, null=True, default=None,
                             help_text="The user who owns the record (record access); empty: no owner.")
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


class AccessPolicyGeneration(GuardedModel):
    """One immutable generation of an org's access policy: users, permission sets and sharing (seed 004 17).

    ``document`` is the canonical validated document (:func:`nexusflow.records.access.validate_access_document`):
    ``users`` (id, active, email, name, permission sets, ``$User`` fields), ``permission_sets`` (object
    permissions, field-level security, view all / modify all), ``sharing`` (the org-wide default of each
    object) and the integration users inbound application runs as (the org's, and per connector account).
    ``digest`` is its digest: the authorization-context digest decisions made under it carry. Authored by
    ``manage.py records access publish``; the org's latest generation is in force; no generation means no
    restriction.
    """

    org_id = IdentityField(max_length=64)
    generation = models.PositiveIntegerField()
    document = models.JSONField()
    digest = IdentityField(max_length=64)
    authored_by = models.CharField(max_length=120)
    reason = models.CharField(max_length=240)
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["org_id", "generation"], name="access_policy_generation_uniq"),
        ]

    def __str__(self) -> str:
        return f"{self.org_id} access generation {self.generation}"


class RecordShare(GuardedModel):
    """One immutable entry of a record's explicit share to a user (record access, seed 004 section 17).

    Shares are an append-only log per ``(org, object, record, user)``: ``sequence`` counts its entries,
    ``access`` is ``read`` or ``edit`` (a grant) or ``none`` (a revocation); the entry with the highest
    sequence is the share in force. A share never grants deletion.
    """

    org_id = IdentityField(max_length=64)
    object_name = IdentityField(max_length=80)
    record_key = IdentityField(max_length=64)
    user_id = IdentityField(max_length=64)
    sequence = models.PositiveIntegerField()
    access = models.CharField(max_length=8, help_text="read | edit | none (revoked)")
    authored_by = models.CharField(max_length=120)
    reason = models.CharField(max_length=240)
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["org_id", "object_name", "record_key", "user_id", "sequence"],
                                    name="record_share_sequence_uniq"),
        ]

    def __str__(self) -> str:
        return f"{self.object_name}:{self.record_key} -> {self.user_id} {self.access} #{self.sequence}"


class OperatorToken(GuardedModel):
    """One API token of an operator (REST ``Authorization: Bearer <token>``), stored only as its digest.

    Issued by ``manage.py operator_tokens issue`` (the token is printed once and never stored); a token ends
    with one :class:`OperatorTokenRevocation` (append-only: a token row never changes). Authenticates as its
    user, who must still be an active staff operator.
    """

    user = models.ForeignKey("auth.User", on_delete=models.PROTECT, related_name="+")
    name = models.CharField(max_length=80, help_text="What the token is for (e.g. the client's name).")
    token_digest = IdentityField(max_length=64, unique=True, help_text="SHA-256 (hex) of the token.")
    issued_by = models.CharField(max_length=120)
    created_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"token {self.pk} of {self.user_id}: {self.name}"


class OperatorTokenRevocation(GuardedModel):
    """The end of one OperatorToken (immutable; at most one per token)."""

    token = models.OneToOneField(OperatorToken, on_delete=models.PROTECT, related_name="revocation")
    revoked_by = models.CharField(max_length=120)
    reason = models.CharField(max_length=240)
    created_at = models.DateTimeField()
