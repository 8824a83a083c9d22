"""Connector V2 schema (seed 003 "Compressed durable model").

Schema only. Rows are written by ``connectors/store.py``; stateful rows change
only by compare-and-swap. Identity columns use binary collation.
"""
from django.db import models

from connectors import transitions
from nexusflow.kernel.identity import IdentityField
from nexusflow.kernel.models import (
    GuardedModel,
    TypedIdReference,
    reason_code_constraint,
    reason_code_field,
    trace_id_field,
)

DIGEST = {"max_length": 64}
PROFILE = {"max_length": 64}


# --- Generations (immutable) ----------------------------------------------
class PackGeneration(GuardedModel):
    """One immutable L1 pack definition generation (seed 003 "Existing foundations and schema ownership").

    Published by ``manage.py connector_pack_publish``; unique by pack key and
    version and by payload digest. ``digest`` is the pack owner's payload digest
    of the canonical document; the owner receipt is rebuilt by
    :func:`connectors.serving.generations.pack_generation_read`, never stored.
    """

    pack_key = IdentityField(max_length=80)
    owner_key = IdentityField(max_length=120, help_text="ConnectorOwnerKey: immutable pack lineage.")
    version = IdentityField(max_length=40)
    document = models.JSONField()
    digest = IdentityField(**DIGEST, help_text="PackPayloadDigest of the canonical document.")
    installation_id = IdentityField(max_length=120, blank=True, default="",
                                    help_text="PackInstallationID: owner key, version and payload digest prefix.")
    profile_id = IdentityField(**PROFILE)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["pack_key", "digest"], name="pack_generation_uniq"),
            models.UniqueConstraint(fields=["pack_key", "version"], name="pack_generation_version_uniq"),
        ]


class CatalogBinding(GuardedModel):
    """One immutable Catalog binding of a pack generation (seed 003 "Ownership boundaries").

    Kinds: ``inbound_route``, ``callout_profile``, ``field_mapping``,
    ``push_contract``. Derived once at publication from the exact pack
    generation; the binding-owner receipt is rebuilt by the owner reader.
    """

    pack_generation = models.ForeignKey(PackGeneration, on_delete=models.PROTECT, related_name="bindings")
    ordinal = models.PositiveIntegerField()
    row_id = IdentityField(**DIGEST, help_text="Derived binding row id.")
    identity_digest = IdentityField(**DIGEST)
    kind = IdentityField(max_length=32)
    owner_pack = IdentityField(max_length=120)
    installation_id = IdentityField(max_length=120)
    payload_digest = IdentityField(**DIGEST, help_text="PackPayloadDigest of the owning generation.")
    business_key = IdentityField(max_length=120)
    definition_version = IdentityField(max_length=40)
    credential_refs = models.BinaryField(help_text="Canonical CredentialRefs blob (sorted JSON list).")
    runtime_command = IdentityField(max_length=80, blank=True, default="")
    runtime_version = IdentityField(max_length=20, blank=True, default="")
    definition = models.JSONField()
    definition_digest = IdentityField(**DIGEST)
    profile_id = IdentityField(**PROFILE)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["pack_generation", "ordinal"], name="catalog_binding_ordinal_uniq"),
            models.UniqueConstraint(fields=["pack_generation", "kind", "business_key"], name="catalog_binding_key_uniq"),
        ]


class ConnectorServiceConfigurationGeneration(GuardedModel):
    """L2: the exhaustive ordered account set, routes, mappings and credential relation.

    ``document`` is the owner's frozen form (accounts in order, exact pack
    generation ids, enabled routes, push contracts, mapping selections and the
    ``(account, CredentialRef) -> CredentialGeneration id`` relation); ``digest``
    is the generation digest of its canonical bytes.
    """

    org_id = IdentityField(max_length=64)
    generation = models.PositiveIntegerField()
    document = models.JSONField()
    digest = IdentityField(**DIGEST)
    profile_id = IdentityField(**PROFILE)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["org_id", "generation"], name="service_config_generation_uniq"),
            models.UniqueConstraint(fields=["org_id", "digest"], name="service_config_digest_uniq"),
        ]


class CredentialGeneration(GuardedModel):
    """An immutable credential generation: a secret-backend version reference, never secret bytes.

    The secret lives at ``NEXUS_SECRETS_DIR/<org>/<account>/<credential_ref>/<secret_version>``
    and is read only at use, by this exact version (seed 003 "Existing
    foundations and schema ownership").
    """

    org_id = IdentityField(max_length=64)
    account_key = IdentityField(max_length=80)
    credential_ref = IdentityField(max_length=80)
    secret_version = IdentityField(max_length=80, help_text="Immutable secret-backend version reference.")
    transport = models.JSONField(default=dict, help_text="Non-secret transport configuration.")
    transport_digest = IdentityField(**DIGEST)
    digest = IdentityField(**DIGEST, help_text="Generation digest over identity, scope, version and transport digest.")
    profile_id = IdentityField(**PROFILE)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["org_id", "account_key", "credential_ref", "secret_version"],
                                    name="credential_generation_version_uniq"),
        ]


class CredentialGenerationDispatchGate(GuardedModel):
    """Whether one credential generation may still authorize provider I/O (seed 003 credential dispatch gate)."""

    org_id = IdentityField(max_length=64)
    credential_generation = models.OneToOneField(CredentialGeneration, on_delete=models.PROTECT)
    state = models.CharField(max_length=16)
    version = models.PositiveBigIntegerField(default=1)
    fence_token = models.PositiveBigIntegerField(default=1)
    reason_code = reason_code_field()
    paused_until = models.DateTimeField(
        null=True, blank=True,
        help_text="The provider's rate-limit window on this credential's dispatch lane (database clock): no Permit "
                  "is granted before it (seed 004 section 16, issue 22 item 3).")
    pause_kind = models.CharField(max_length=16, blank=True, default="",
                                  help_text="'rate_limited' (a Retry-After window) or 'daily_limit' (the profile's "
                                            "declared daily limit, until its reset); empty when never paused.")
    pause_status = models.PositiveSmallIntegerField(null=True, blank=True,
                                                    help_text="The HTTP status of the answer that paused the lane.")

    class Meta:
        constraints = [reason_code_constraint(transitions.CREDENTIAL_DISPATCH_GATE, name="credential_gate_reason_chk")]


class ServingEpoch(GuardedModel):
    """One verified execution generation of an account: the fence every admission and dispatch names (seed 003)."""

    org_id = IdentityField(max_length=64)
    state = models.CharField(max_length=16)
    version = models.PositiveBigIntegerField(default=1)
    reason_code = reason_code_field()
    configuration = models.ForeignKey(ConnectorServiceConfigurationGeneration, on_delete=models.PROTECT)
    document = models.JSONField(help_text="Reader index of the frozen routes, ordering contracts, pack and credential "
                                          "generations; rebuilt and compared on verification.")
    epoch_key = IdentityField(max_length=80, null=True, blank=True, unique=True,
                              help_text="The epoch id named in the V2 preimage.")
    preimage = models.BinaryField(default=b"", help_text="The exact V2 ServingEpoch preimage bytes.")
    digest = IdentityField(**DIGEST, help_text="SHA-256 of the preimage.")
    profile_id = IdentityField(**PROFILE)
    created_at = models.DateTimeField(auto_now_add=True)
    activated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [reason_code_constraint(transitions.SERVING_EPOCH, name="serving_epoch_reason_chk")]


class AccountServingGate(GuardedModel):
    """An account's admission and protocol mode (v1 serving, draining, v2 serving ...): the one serving switch."""

    org_id = IdentityField(max_length=64)
    account_key = IdentityField(max_length=80)
    pack_key = IdentityField(max_length=80)
    state = models.CharField(max_length=16)
    version = models.PositiveBigIntegerField(default=1)
    fence_token = models.PositiveBigIntegerField(default=1)
    epoch = models.ForeignKey(ServingEpoch, null=True, blank=True, on_delete=models.PROTECT)
    epoch_digest = IdentityField(**DIGEST, blank=True, default="")
    reason_code = reason_code_field()
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["org_id", "account_key"], name="account_gate_uniq"),
            reason_code_constraint(transitions.ACCOUNT_SERVING_GATE, name="account_gate_reason_chk"),
        ]


class GateTransitionEvidence(GuardedModel):
    """Append-only evidence for each gate transition (inventory, certificate refs)."""

    org_id = IdentityField(max_length=64)
    gate = models.ForeignKey(AccountServingGate, on_delete=models.PROTECT)
    from_state = models.CharField(max_length=16)
    to_state = models.CharField(max_length=16)
    fence_token = models.PositiveBigIntegerField()
    evidence = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)


# --- Inbound facts --------------------------------------------------------
class Receipt(GuardedModel):
    """Immutable evidence of one accepted V2 admission."""

    org_id = IdentityField(max_length=64)
    epoch = models.ForeignKey(ServingEpoch, on_delete=models.PROTECT)
    account_key = IdentityField(max_length=80)
    channel = IdentityField(max_length=80)
    route_key = IdentityField(max_length=80)
    kind = models.CharField(max_length=16, default="transport")
    body = models.BinaryField(help_text="The raw request body, byte-exact.")
    body_digest = IdentityField(**DIGEST)
    component_count = models.PositiveIntegerField()
    quarantined_count = models.PositiveIntegerField()
    received_at = models.DateTimeField(auto_now_add=True)
    trace_id = trace_id_field()


class ReceiptAdmissionKey(GuardedModel):
    """Sole transport-idempotency authority (seed 003 "Inbound facts")."""

    org_id = IdentityField(max_length=64)
    account_key = IdentityField(max_length=80)
    channel = IdentityField(max_length=80)
    transport_key = IdentityField(**DIGEST)
    identity_digest = IdentityField(**DIGEST, help_text="Digest of the admitted items without volatile fields.")
    profile_id = IdentityField(**PROFILE)
    receipt = models.OneToOneField(Receipt, null=True, blank=True, on_delete=models.PROTECT)
    v1_tombstone = models.JSONField(
        null=True, blank=True,
        help_text="Immutable V1 acceptance tombstone: the predecessor ref. identity_digest is its authorized "
                  "payload digest. Never executable.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["org_id", "account_key", "channel", "transport_key"], name="admission_key_uniq"),
            # Exactly one target: a V2 Receipt or a V1 tombstone (seed 003 "Inbound facts").
            models.CheckConstraint(
                condition=(models.Q(receipt__isnull=False, v1_tombstone__isnull=True)
                           | models.Q(receipt__isnull=True, v1_tombstone__isnull=False)),
                name="admission_key_target_chk"),
        ]


class Event(GuardedModel):
    """Immutable normalized external event; no lease, retry or owner fields."""

    org_id = IdentityField(max_length=64)
    epoch = models.ForeignKey(ServingEpoch, on_delete=models.PROTECT)
    account_key = IdentityField(max_length=80)
    route_key = IdentityField(max_length=80)
    canonical_kind = IdentityField(max_length=80)
    source_event_key = IdentityField(max_length=160)
    event_generation = IdentityField(max_length=80, default="live")
    source_locator = IdentityField(max_length=160)
    occurred_at_ms = models.BigIntegerField()
    ordering_contract = models.CharField(max_length=32)
    ordering_contract_digest = IdentityField(**DIGEST)
    partition_key = IdentityField(**DIGEST)
    partition = models.JSONField()
    position = models.BinaryField(max_length=64, help_text="Fixed-width big-endian SourcePosition bytes.")
    tie_breaker = models.CharField(max_length=80)
    payload = models.JSONField()
    payload_digest = IdentityField(**DIGEST)
    receipt = models.ForeignKey(Receipt, on_delete=models.PROTECT)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["org_id", "account_key", "source_event_key", "event_generation"], name="event_identity_uniq"
            ),
        ]


class ReplayRequest(GuardedModel):
    """Immutable operator authorization of one replay (seed 003 "Inbound facts", "Replay identity and predecessor").

    Never an Event state and never claimable: it binds one target V2
    ServingEpoch (id + digest), a disclosure-safe predecessor ref (protocol
    version, predecessor Receipt/Event ids, original epoch id + digest,
    payload and result digests), the reason, the authorizing principal and
    the external-effect mode. Unique per account and ReplayRequest ID; its
    replay Receipt is outside the transport namespace (no ReceiptAdmissionKey).
    """

    org_id = IdentityField(max_length=64)
    account_key = IdentityField(max_length=80)
    replay_id = IdentityField(max_length=80, help_text="Operator-chosen ReplayRequest ID; the replay EventGeneration.")
    target_epoch = models.ForeignKey(ServingEpoch, on_delete=models.PROTECT, related_name="+")
    target_epoch_digest = IdentityField(**DIGEST)
    predecessor_protocol = models.CharField(max_length=8, help_text="Protocol version of the predecessor: v2.")
    predecessor_receipt_id = TypedIdReference(to="connectors.Receipt")
    predecessor_event_id = TypedIdReference(to="connectors.Event")
    predecessor_epoch_id = TypedIdReference(to="connectors.ServingEpoch")
    predecessor_epoch_digest = IdentityField(**DIGEST)
    predecessor_payload_digest = IdentityField(**DIGEST)
    predecessor_result_digest = IdentityField(**DIGEST, blank=True, default="")
    route_key = IdentityField(max_length=80)
    source_event_key = IdentityField(max_length=160)
    reason = models.CharField(max_length=500)
    principal = IdentityField(max_length=150, help_text="The authenticated operator who authorized the replay.")
    external_effects = models.CharField(max_length=32, default="suppress_external_effects",
                                        help_text="Only suppress_external_effects is valid.")
    request_digest = IdentityField(**DIGEST)
    profile_id = IdentityField(**PROFILE)
    receipt = models.OneToOneField(Receipt, on_delete=models.PROTECT, related_name="replay_request")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["org_id", "account_key", "replay_id"], name="replay_request_uniq"),
            models.CheckConstraint(condition=models.Q(external_effects="suppress_external_effects"),
                                   name="replay_request_mode_chk"),
        ]


class ReceiptComponent(GuardedModel):
    """One deterministic item of a Receipt; no worker state."""

    receipt = models.ForeignKey(Receipt, on_delete=models.PROTECT, related_name="components")
    ordinal = models.PositiveIntegerField()
    disposition = models.CharField(max_length=16, help_text="event | duplicate | quarantined")
    reason_code = models.CharField(max_length=64, blank=True, default="")
    item = models.JSONField(null=True)
    event = models.ForeignKey(Event, null=True, blank=True, on_delete=models.PROTECT)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["receipt", "ordinal"], name="receipt_component_uniq"),
            # A quarantined item always says why (seed 003 "Operational liveness and maintenance admission").
            models.CheckConstraint(condition=~models.Q(disposition="quarantined") | ~models.Q(reason_code=""),
                                   name="receipt_component_reason_chk"),
        ]


class StreamCursor(GuardedModel):
    """Durable read position of one pulled route of one account (seed 003 "ingress owner ... durable cursor").

    ``cursor`` is the opaque source position after the last batch whose
    Receipts committed (canonical JSON bytes of the provider's value; NULL:
    from the earliest retained event). It is never computed, only copied from
    a fetch response, and it advances only after the Receipts of that batch
    committed; ``stopped`` keeps it where it is.
    """

    org_id = IdentityField(max_length=64)
    account_key = IdentityField(max_length=80)
    route_key = IdentityField(max_length=80)
    cursor = models.BinaryField(max_length=512, null=True, help_text="Opaque source position bytes; NULL: from the start.")
    state = models.CharField(max_length=16, default="active")
    version = models.PositiveBigIntegerField(default=1)
    batches = models.PositiveBigIntegerField(default=0, help_text="Batches committed through this cursor.")
    last_receipt_id = TypedIdReference(to="connectors.Receipt", null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["org_id", "account_key", "route_key"], name="stream_cursor_uniq"),
        ]


class OrderingLane(GuardedModel):
    """Sole mutable source-order claim guard (seed 003 "Durable source ordering")."""

    org_id = IdentityField(max_length=64)
    epoch = models.ForeignKey(ServingEpoch, on_delete=models.PROTECT)
    account_key = IdentityField(max_length=80)
    route_key = IdentityField(max_length=80)
    partition_key = IdentityField(**DIGEST)
    partition = models.JSONField()
    state = models.CharField(max_length=16, default="open")
    version = models.PositiveBigIntegerField(default=1)
    high_water_position = models.BinaryField(max_length=64, null=True)
    baseline_position = models.BinaryField(max_length=64, null=True)
    baseline_origin = models.CharField(max_length=32, default="greenfield_empty")
    active_execution_id = TypedIdReference(to="connectors.Execution", null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["epoch", "route_key", "partition_key"], name="ordering_lane_uniq"),
        ]


class ProjectionWindow(GuardedModel):
    """One explicit window of a grouped, latest, batch or settle route (seed 003 "Inbound facts").

    At most one ``open`` window per epoch, route and canonical grouping key:
    ``open_key`` holds the grouping key while open and is NULL once sealed,
    under a unique index. Input that races a seal lands in a successor window.
    """

    org_id = IdentityField(max_length=64)
    epoch = models.ForeignKey(ServingEpoch, on_delete=models.PROTECT)
    account_key = IdentityField(max_length=80)
    route_key = IdentityField(max_length=80)
    grouping_key = IdentityField(**DIGEST)
    open_key = IdentityField(**DIGEST, null=True, blank=True, help_text="grouping_key while open; NULL once sealed.")
    grouping = models.JSONField()
    policy = models.CharField(max_length=16, help_text="grouped | latest | batch | settle")
    close_policy = models.JSONField(help_text="Frozen close policy: close_after_seconds, max_items.")
    lane = models.ForeignKey(OrderingLane, null=True, blank=True, on_delete=models.PROTECT)
    state = models.CharField(max_length=16)
    version = models.PositiveBigIntegerField(default=1)
    reason_code = reason_code_field()
    member_count = models.PositiveIntegerField(default=0)
    close_at = models.DateTimeField(help_text="Database-clock time the window closes (immutable).")
    opened_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["epoch", "route_key", "open_key"], name="projection_window_open_uniq"),
            reason_code_constraint(transitions.PROJECTION_WINDOW, name="projection_window_reason_chk"),
        ]
        indexes = [models.Index(fields=["state", "close_at"], name="projection_window_close_idx")]
class OrderingHandoff(GuardedModel):
    """Frozen predecessor high-water that seeds one successor lane (seed 003 "Durable source ordering").

    One row per predecessor epoch, successor epoch, route lineage (account and
    route key) and predecessor partition. ``high_water_position`` is the
    predecessor lane's final high-water, byte-exact (NULL when the lane never
    completed a position); the successor lane's ``baseline_position`` equals
    it. ``digest`` covers every frozen column; activation recomputes it.
    """

    org_id = IdentityField(max_length=64)
    predecessor_epoch = models.ForeignKey(ServingEpoch, on_delete=models.PROTECT, related_name="handoffs_out")
    successor_epoch = models.ForeignKey(ServingEpoch, on_delete=models.PROTECT, related_name="handoffs_in")
    account_key = IdentityField(max_length=80)
    route_key = IdentityField(max_length=80)
    partition_key = IdentityField(**DIGEST)
    partition = models.JSONField()
    predecessor_lane = models.ForeignKey(OrderingLane, on_delete=models.PROTECT, related_name="handoffs_out")
    successor_lane = models.ForeignKey(OrderingLane, null=True, blank=True, on_delete=models.PROTECT,
                                       related_name="handoffs_in",
                                       help_text="NULL when the successor does not enable the route.")
    high_water_position = models.BinaryField(max_length=64, null=True)
    ordering = models.JSONField(help_text="Frozen comparator and partition derivation of the route.")
    ordering_digest = IdentityField(**DIGEST)
    transition_class = models.CharField(max_length=32)
    cites_handoff_id = TypedIdReference(to="connectors.OrderingHandoff", null=True, blank=True,
                                        help_text="The abandoned successor's handoff this one derives from.")
    digest = IdentityField(**DIGEST)
    profile_id = IdentityField(**PROFILE)
    state = models.CharField(max_length=16, help_text="frozen | activated | abandoned")
    version = models.PositiveBigIntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["predecessor_epoch", "successor_epoch", "account_key", "route_key",
                                            "partition_key"], name="ordering_handoff_uniq"),
        ]


class Projection(GuardedModel):
    """The application input built from one normalized event, bound to its route and window (seed 003)."""

    org_id = IdentityField(max_length=64)
    event = models.OneToOneField(Event, on_delete=models.PROTECT)
    route_key = IdentityField(max_length=80)
    definition_digest = IdentityField(**DIGEST)
    input_digest = IdentityField(**DIGEST)
    window = models.ForeignKey(ProjectionWindow, null=True, blank=True, on_delete=models.PROTECT,
                               related_name="members")
    created_at = models.DateTimeField(auto_now_add=True)


class Execution(GuardedModel):
    """Ownership of applying one projection: generation, lease and outcome, claimed through its ordering lane."""

    org_id = IdentityField(max_length=64)
    projection = models.ForeignKey(Projection, on_delete=models.PROTECT)
    generation = models.PositiveIntegerField(default=1)
    trace_id = trace_id_field()
    lane = models.ForeignKey(OrderingLane, null=True, blank=True, on_delete=models.PROTECT)
    position = models.BinaryField(max_length=64)
    state = models.CharField(max_length=24)
    version = models.PositiveBigIntegerField(default=1)
    reason_code = models.CharField(max_length=64, blank=True, default="")
    command_id = IdentityField(**DIGEST, help_text="Runtime Command ID: stable across retries.")
    execution_ref_digest = IdentityField(**DIGEST)
    result_digest = IdentityField(**DIGEST, blank=True, default="")
    runtime_receipt_id = TypedIdReference(to="runtime_outbox.ApplicationResult", null=True, blank=True)
    window = models.OneToOneField(ProjectionWindow, null=True, blank=True, on_delete=models.PROTECT,
                                  help_text="The sealed window this Execution applies (one per window).")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["projection", "generation"], name="execution_generation_uniq"),
            reason_code_constraint(transitions.EXECUTION, name="execution_reason_chk"),
        ]
        indexes = [models.Index(fields=["state", "lane"], name="execution_state_lane_idx"),
                   models.Index(fields=["org_id", "state", "id"], name="execution_org_state_idx")]


class ExecutionAttempt(GuardedModel):
    """Append-only evidence of one claim; the lease is not an execution state."""

    org_id = IdentityField(max_length=64)
    execution = models.ForeignKey(Execution, on_delete=models.PROTECT, related_name="attempts")
    attempt_number = models.PositiveIntegerField()
    worker_id = IdentityField(max_length=120)
    lease_token = IdentityField(max_length=64)
    lease_expires_at = models.DateTimeField()
    state = models.CharField(max_length=16, default="started", help_text="started | completed | expired")
    version = models.PositiveBigIntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["execution", "attempt_number"], name="execution_attempt_uniq")]


class ExecutionDependency(GuardedModel):
    """A requirement an Execution waits on, with an immutable deadline (seed 003 "Inbound facts").

    Waiting holds no worker lease: the Execution is ``waiting_dependency``
    and no ExecutionAttempt is started. ``deadline_at``, ``requirement``,
    ``required_position`` and ``disposition`` never change after insert.
    """

    org_id = IdentityField(max_length=64)
    execution = models.ForeignKey(Execution, on_delete=models.PROTECT, related_name="dependencies")
    lane = models.ForeignKey(OrderingLane, null=True, blank=True, on_delete=models.PROTECT)
    requirement = IdentityField(max_length=32, help_text="source_predecessor: the lane must reach required_position.")
    required_position = models.BinaryField(max_length=64)
    disposition = models.CharField(max_length=16, help_text="Frozen deadline disposition: quarantine | skip.")
    deadline_at = models.DateTimeField(help_text="Database-clock deadline, fixed at insert.")
    state = models.CharField(max_length=16)
    version = models.PositiveBigIntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["execution", "requirement"], name="execution_dependency_uniq"),
        ]
        indexes = [models.Index(fields=["state", "deadline_at"], name="execution_dependency_due_idx")]


class OrderingDecision(GuardedModel):
    """Append-only superseded decision for a lower or late source position."""

    org_id = IdentityField(max_length=64)
    lane = models.ForeignKey(OrderingLane, on_delete=models.PROTECT)
    execution = models.OneToOneField(Execution, on_delete=models.PROTECT)
    decision = models.CharField(max_length=16, default="superseded")
    high_water_position = models.BinaryField(max_length=64, null=True)
    winning_position = models.BinaryField(max_length=64, null=True)
    created_at = models.DateTimeField(auto_now_add=True)


# --- Outbound facts -------------------------------------------------------
class RemoteLink(GuardedModel):
    """Proven external identity of one local owner slot (seed 002 "Link Key")."""

    org_id = IdentityField(max_length=64)
    link_key = IdentityField(**DIGEST)
    owner_key = IdentityField(max_length=120)
    action_slot_id = IdentityField(max_length=120)
    action_type = IdentityField(max_length=40)
    destination_slot_id = IdentityField(max_length=120)
    source_object = IdentityField(max_length=80)
    source_record_key = IdentityField(max_length=64)
    remote_scope = IdentityField(max_length=80, help_text="Provider account scope of the remote id.")
    remote_id = IdentityField(max_length=160)
    live_remote_id = IdentityField(max_length=160, null=True, help_text="remote_id while not retired; NULL once retired.")
    state = models.CharField(max_length=16)
    version = models.PositiveBigIntegerField(default=1)
    reason_code = reason_code_field()
    snapshot = models.JSONField(help_text="Frozen install/profile/action snapshots for drift validation.")
    created_by_effect_id = TypedIdReference(to="connectors.RemoteEffect", null=True, blank=True)
    created_install_id = IdentityField(max_length=120, blank=True, default="",
                                       help_text="CreatedPackInstallId: the pack installation that created the link.")
    last_validated_install_id = IdentityField(
        max_length=120, blank=True, default="",
        help_text="LastValidatedPackInstallId: the installation whose action config last passed drift validation.")
    mapping_fingerprint = IdentityField(max_length=64, blank=True, default="",
                                        help_text="Current validated outbound mapping authority (seed 002 CARVE_DOWN).")
    body_fingerprint = IdentityField(max_length=64, blank=True, default="",
                                     help_text="Current validated body-shape authority (seed 002 CARVE_DOWN).")
    last_mapping_revalidation = models.ForeignKey(
        "connectors.PushLinkRevalidationReceipt", null=True, blank=True, on_delete=models.PROTECT, related_name="+",
        help_text="LastMappingRevalidationOperationId: the receipt that moved the fingerprints to their current value.")
    last_pushed_version = models.PositiveBigIntegerField(
        default=0, help_text="Source record version of the newest confirmed push; older versions are superseded.")
    mirror_status = models.CharField(max_length=24, blank=True, default="",
                                     help_text="Last compatibility mirror writeback: written | skipped | conflict | "
                                               "source_deleted | tuple_changed (never authority).")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["org_id", "link_key"], name="remote_link_key_uniq"),
            models.UniqueConstraint(
                fields=["org_id", "owner_key", "destination_slot_id", "remote_scope", "live_remote_id"],
                name="remote_link_locator_uniq",
            ),
            reason_code_constraint(transitions.REMOTE_LINK, name="remote_link_reason_chk"),
        ]


class RemoteEffect(GuardedModel):
    """Sole lifecycle authority of one logical external effect."""

    org_id = IdentityField(max_length=64)
    command = models.OneToOneField("runtime_outbox.OutboundCommand", on_delete=models.PROTECT)
    trace_id = trace_id_field()
    logical_effect_digest = IdentityField(**DIGEST)
    account_key = IdentityField(max_length=80)
    contract_key = IdentityField(max_length=80)
    link_key = IdentityField(**DIGEST, help_text="Seed 002 link_key: effects of one slot dispatch in order.")
    dispatch_lane = models.CharField(
        max_length=32, default="configured",
        help_text="Seed 002 DispatchLane: configured | deferred_association; any other value is never claimed.")
    lane_sequence = models.PositiveBigIntegerField()
    state = models.CharField(max_length=24)
    version = models.PositiveBigIntegerField(default=1)
    reason_code = models.CharField(max_length=64, blank=True, default="")
    attempt_count = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    remote_id = IdentityField(max_length=160, blank=True, default="")
    owner_key = IdentityField(max_length=120, blank=True, default="", help_text="ConnectorOwnerKey of the slot.")
    action_slot_id = IdentityField(max_length=120, blank=True, default="", help_text="ActionSlotId of the slot.")
    destination_slot_id = IdentityField(max_length=120, blank=True, default="",
                                        help_text="DestinationSlotId of the slot.")
    source_object = IdentityField(max_length=80, blank=True, default="")
    source_record_key = IdentityField(max_length=64, blank=True, default="")
    create_slot = IdentityField(
        **DIGEST, null=True, blank=True,
        help_text="Seed 002 AttemptOccupancyKey: the link_key while this effect holds the slot's one create "
                  "(active or unsuperseded terminal); NULL for updates and once superseded. Unique per org.")
    attempt_ordinal = models.PositiveIntegerField(
        default=1, help_text="AttemptOrdinal: 1, then +1 per explicit supersede of a terminal create.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            reason_code_constraint(transitions.REMOTE_EFFECT, name="remote_effect_reason_chk"),
            models.UniqueConstraint(fields=["org_id", "create_slot"], name="remote_effect_create_slot_uniq"),
        ]
        indexes = [
            models.Index(fields=["state", "next_attempt_at"], name="remote_effect_state_idx"),
            models.Index(fields=["org_id", "link_key", "lane_sequence"], name="remote_effect_slot_idx"),
            models.Index(fields=["org_id", "source_object", "source_record_key"], name="remote_effect_source_idx"),
        ]


class RemoteEffectAttempt(GuardedModel):
    """Append-only request/response evidence; never the effect's state authority."""

    org_id = IdentityField(max_length=64)
    effect = models.ForeignKey(RemoteEffect, on_delete=models.PROTECT, related_name="attempts")
    attempt_number = models.PositiveIntegerField()
    operation = models.CharField(max_length=16, help_text="create | update")
    method = models.CharField(max_length=8)
    path = models.CharField(max_length=255)
    request_body = models.BinaryField()
    request_digest = IdentityField(**DIGEST)
    idempotency_key = IdentityField(max_length=255, blank=True, default="")
    state = models.CharField(max_length=16, default="started", help_text="started | confirmed | no_effect | uncertain")
    version = models.PositiveBigIntegerField(default=1)
    response_status = models.IntegerField(null=True, blank=True)
    response_body = models.BinaryField(null=True)
    error = models.CharField(max_length=255, blank=True, default="")
    remote_id = IdentityField(max_length=160, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["effect", "attempt_number"], name="remote_effect_attempt_uniq")]


class RemoteEffectEvidence(GuardedModel):
    """Append-only reconciliation evidence of one RemoteEffect (seed 003 "Outbound facts").

    Reconciliation appends a row and then moves the effect; it never rewrites
    an Attempt or earlier evidence. ``kind``: ``operator_confirmed`` (remote
    identity proven by an operator), ``operator_no_effect`` (an operator
    proved the provider performed nothing), ``operator_quarantine``,
    ``exact_repeat`` (the frozen idempotency contract released an uncertain
    effect for a byte-identical repeat), ``credential_revoked`` (revocation
    closed a pre-I/O Permit).
    """

    org_id = IdentityField(max_length=64)
    effect = models.ForeignKey(RemoteEffect, on_delete=models.PROTECT, related_name="evidence")
    kind = models.CharField(max_length=32)
    actor = models.CharField(max_length=120, help_text="Operator name or worker id that recorded it.")
    from_state = models.CharField(max_length=24)
    to_state = models.CharField(max_length=24)
    detail = models.JSONField()
    digest = IdentityField(**DIGEST)
    created_at = models.DateTimeField(auto_now_add=True)


class RemoteLinkEvidence(GuardedModel):
    """Append-only history of one RemoteLink's lifecycle (seed 002 "Remote Link State").

    ``kind``: ``drift_suspended`` (a drift check suspended it), ``drift_validated``
    (a benign drift advanced LastValidatedPackInstallId), ``revalidated``,
    ``retired`` and ``rebound`` (operator), ``remote_not_found``,
    ``remote_conflict``, ``source_deleted``.
    """

    org_id = IdentityField(max_length=64)
    link = models.ForeignKey(RemoteLink, on_delete=models.PROTECT, related_name="evidence")
    kind = models.CharField(max_length=32)
    actor = models.CharField(max_length=120)
    from_state = models.CharField(max_length=16)
    to_state = models.CharField(max_length=16)
    detail = models.JSONField()
    digest = IdentityField(**DIGEST)
    created_at = models.DateTimeField(auto_now_add=True)


class PushLinkRevalidationReceipt(GuardedModel):
    """Append-only receipt of one finalized-link mapping revalidation (seed 002 "2026-07-22 ... CARVE_DOWN").

    Written only by ``connectors.links.mapping_revalidation.revalidation_apply`` together with
    the link's fingerprint move; never read by PATCH validation; blocked from
    generic CRUD and admin writes.
    """

    org_id = IdentityField(max_length=64)
    operation_id = IdentityField(max_length=120)
    link = models.ForeignKey(RemoteLink, on_delete=models.PROTECT, related_name="+")
    link_key = IdentityField(**DIGEST)
    manifest_digest = IdentityField(**DIGEST)
    approval_digest = IdentityField(**DIGEST)
    fingerprint_algorithm = IdentityField(max_length=40)
    old_mapping_fingerprint = IdentityField(**DIGEST)
    new_mapping_fingerprint = IdentityField(**DIGEST)
    old_body_fingerprint = IdentityField(**DIGEST)
    new_body_fingerprint = IdentityField(**DIGEST)
    old_install_id = IdentityField(max_length=120)
    new_install_id = IdentityField(max_length=120)
    before_row_digest = IdentityField(**DIGEST)
    after_row_digest = IdentityField(**DIGEST)
    previous_receipt = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    approved_by = models.CharField(max_length=120)
    reason = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["org_id", "operation_id", "link"],
                                               name="push_link_revalidation_uniq")]


class DispatchPermit(GuardedModel):
    """One-shot authorization to cross the provider-I/O boundary once."""

    org_id = IdentityField(max_length=64)
    attempt = models.OneToOneField(RemoteEffectAttempt, on_delete=models.PROTECT)
    gate = models.ForeignKey(AccountServingGate, on_delete=models.PROTECT)
    credential_gate = models.ForeignKey(CredentialGenerationDispatchGate, on_delete=models.PROTECT)
    state = models.CharField(max_length=16)
    version = models.PositiveBigIntegerField(default=1)
    holder_id = IdentityField(max_length=120)
    holder_fence = IdentityField(max_length=64)
    gate_fence_token = models.PositiveBigIntegerField()
    credential_fence_token = models.PositiveBigIntegerField()
    io_may_have_started_at = models.DateTimeField(null=True, blank=True)
    closed_evidence = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["gate", "state"], name="dispatch_permit_open_idx")]


class WorkerProcess(GuardedModel):
    """A registered worker process: the holder identity Permits and leases name."""

    worker_id = IdentityField(max_length=120, unique=True)
    role = models.CharField(max_length=64, help_text="Roles joined by '+', e.g. connector+egress.")
    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    process_start_ticks = models.PositiveBigIntegerField(help_text="/proc/<pid>/stat starttime: tells pid reuse apart.")
    started_at = models.DateTimeField(auto_now_add=True)
    terminated_at = models.DateTimeField(null=True, blank=True,
                                         help_text="Set once, when termination of this process generation is proven.")
    termination_proof = models.JSONField(null=True, blank=True,
                                         help_text="The proof: pid absent or reused on this host; egress died with it.")


# --- The V1 runtime being retired (connectors/v1/models.py; same app label) ---------
from connectors.v1.models import (  # noqa: F401 - the models join this app
    V1Account,
    V1EgressDenial,
    V1Event,
    V1MaintenanceBarrier,
    V1ProcessGeneration,
    V1ProviderCall,
    V1SchedulerLease,
    V1StreamCursor,
    V1TransportKey,
)


class ServingPublicationBarrierSet(GuardedModel):
    """The frozen external-owner publication barriers of one activation attempt (seed 003 "Generation and replay").

    Activation evidence, not another metadata authority: while a set of an org is not ``released``
    (``acquiring``, ``held`` or ``activation_committed``), every L2 configuration publication,
    credential publication and credential revocation of that org fails
    (:func:`connectors.serving.publication.publication_barrier_admit`). ``receipts`` freezes the exact
    owner generations the coordinator read under the barrier (configuration generation and digest,
    pack generations, credential generations); ``receipts_digest`` is their v2 digest.

    ``holder_fence`` is the coordinator fence: a takeover increments it, and every later write of the
    set compares it, so a stale coordinator can neither record, commit nor release. Nothing expires:
    only an explicit fenced release reopens publication. ``open_key`` holds ``org_id`` while the set is
    not released and NULL after, under a unique index: at most one nonreleased set per activation scope.
    """

    org_id = IdentityField(max_length=64)
    attempt_key = IdentityField(max_length=80)
    epoch = models.ForeignKey(ServingEpoch, on_delete=models.PROTECT)
    state = models.CharField(max_length=24)
    version = models.PositiveBigIntegerField(default=1)
    holder_fence = models.PositiveBigIntegerField(default=1)
    holder = models.CharField(max_length=120, help_text="Who holds the set now (host:pid of the coordinator).")
    open_key = IdentityField(max_length=64, null=True, blank=True, unique=True)
    receipts = models.JSONField(default=dict)
    receipts_digest = IdentityField(**DIGEST, blank=True, default="")
    release_reason = models.CharField(max_length=40, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        # An aborted (released) set is never reopened: the attempt's next activation writes a new set, so
        # sets are not unique per attempt and epoch; ``open_key`` keeps one nonreleased set per org.
        indexes = [models.Index(fields=["org_id", "attempt_key", "epoch"], name="publication_barrier_set_idx")]
