"""Runtime-owned facts: results, outbound intents, their delivery and receipts.

Seed 003 "Runtime-owned result" and "Outbound facts"; seed 000 (owner
protection reads intents and receipts by owner, never Connector history).
"""
from django.db import models

from nexusflow.kernel.identity import IdentityField
from nexusflow.kernel.models import GuardedModel, TypedIdReference, trace_id_field

DIGEST = {"max_length": 64}


class ApplicationResult(GuardedModel):
    """Immutable outcome of one application command, addressed by command id + ref digest."""

    org_id = IdentityField(max_length=64)
    command_id = IdentityField(**DIGEST)
    execution_ref_digest = IdentityField(**DIGEST)
    profile_id = IdentityField(max_length=64)
    outcome = models.CharField(max_length=16)
    result = models.JSONField()
    result_digest = IdentityField(**DIGEST)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["org_id", "command_id"], name="application_result_command_uniq")]


class OutboundCommand(GuardedModel):
    """Runtime's immutable outbound intent carrying its FrozenDispatchBinding."""

    org_id = IdentityField(max_length=64)
    app_installation_id = IdentityField(max_length=128)
    runtime_capability_id = IdentityField(max_length=128)
    binding_digest = IdentityField(max_length=128)
    effect_root_id = IdentityField(**DIGEST)
    effect_slot_id = IdentityField(max_length=120)
    trace_id = trace_id_field()
    effect_generation_id = IdentityField(max_length=40)
    idempotency_key = IdentityField(**DIGEST, unique=True)
    profile_id = IdentityField(max_length=64)
    account_key = IdentityField(max_length=80)
    contract_key = IdentityField(max_length=80)
    source_object = IdentityField(max_length=80)
    source_record_key = IdentityField(max_length=64)
    source_record_version = models.PositiveBigIntegerField()
    link_key = IdentityField(**DIGEST)
    request_fields = models.JSONField(help_text="Mapped provider body fields, frozen at authoring.")
    frozen_binding = models.JSONField()
    frozen_binding_digest = IdentityField(**DIGEST)
    origin_flow_run_id = TypedIdReference(to="flows.FlowRun", null=True, blank=True)
    origin_dependency_key = IdentityField(max_length=80, null=True, blank=True)
    predecessor = models.OneToOneField(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="successor",
        help_text="The terminal no_effect command this successor EffectGeneration follows (at most one successor).")
    successor_authorization = models.JSONField(
        null=True, blank=True, help_text="Operator business intent that minted this generation: actor, reason, time.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["org_id", "app_installation_id", "runtime_capability_id", "effect_root_id", "effect_slot_id",
                        "effect_generation_id"],
                name="outbound_command_logical_effect_uniq",
            ),
        ]
        indexes = [
            # Owner-leading (seed 000): owner checks read a record's intents in id order, FOR UPDATE NOWAIT.
            models.Index(fields=["org_id", "source_object", "source_record_key", "id"],
                         name="outbound_command_owner_idx"),
        ]


class OutboxMessage(GuardedModel):
    """Transport delivery of one Runtime message to the consumer of its family.

    ARCHITECTURE.md section 2 "Runtime message families"; seed 004 section
    10.7. ``(family, message_key)`` is the canonical dedupe key; the payload,
    its digest and the full trusted Runtime work scope are immutable after
    insert. Only the delivery columns move (``OutboxMessageStore``).
    """

    org_id = IdentityField(max_length=64)
    app_installation_id = IdentityField(max_length=128)
    runtime_capability_id = IdentityField(max_length=128)
    binding_digest = IdentityField(max_length=128)
    family = IdentityField(max_length=64)
    message_key = IdentityField(max_length=128)
    payload_schema_version = models.PositiveIntegerField()
    payload = models.JSONField(help_text="The frozen, safe payload handed to the consumer (as an immutable envelope).")
    payload_digest = IdentityField(**DIGEST)
    command = models.ForeignKey(OutboundCommand, null=True, blank=True, on_delete=models.PROTECT,
                                help_text="The intent the message is about, when it is about one.")
    state = models.CharField(max_length=16)
    version = models.PositiveBigIntegerField(default=1)
    delivery_attempts = models.PositiveIntegerField(default=0)
    reconcile_attempts = models.PositiveIntegerField(
        default=0, help_text="RejectIfUnaccepted questions asked while reconciling (seed 004 section 15.4).")
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["family", "message_key"], name="outbox_message_key_uniq")]
        indexes = [models.Index(fields=["state", "next_attempt_at"], name="outbox_message_due_idx")]


class InboxAcceptance(GuardedModel):
    """The Runtime transport authority's durable acceptance (or rejection) of one message key.

    Seed 004 section 10.7 ("RejectIfUnaccepted" fence) and section 15.1:
    ``message_key`` (the ``EffectHandoffKey``) alone is unique; family,
    outbox message id, payload digest and the full trusted Runtime work scope
    are immutable validation attributes, never alternate key parts. A row is
    ``accepted`` (the consumer's own record, named by ``accepted_ref``,
    committed in the same transaction) or a ``rejected`` tombstone that
    refuses every later acceptance. Retained beyond the outbox row.
    """

    org_id = IdentityField(max_length=64)
    app_installation_id = IdentityField(max_length=128)
    runtime_capability_id = IdentityField(max_length=128)
    binding_digest = IdentityField(max_length=128)
    family = IdentityField(max_length=64)
    message_key = IdentityField(max_length=128, unique=True)
    outbox_message_id = TypedIdReference(to="runtime_outbox.OutboxMessage")
    payload_digest = IdentityField(**DIGEST)
    consumer = IdentityField(max_length=80)
    state = models.CharField(max_length=16)
    version = models.PositiveBigIntegerField(default=1)
    accepted_ref = models.CharField(max_length=160, blank=True, default="",
                                    help_text="The consumer's record created on acceptance, e.g. remote_effect:<id>.")
    created_at = models.DateTimeField(auto_now_add=True)


class IntentResultReceipt(GuardedModel):
    """Completed result of one intent; the only completion fact Runtime readers use."""

    org_id = IdentityField(max_length=64)
    command = models.OneToOneField(OutboundCommand, on_delete=models.PROTECT)
    outcome = models.CharField(max_length=16)
    remote_id = IdentityField(max_length=160, blank=True, default="")
    evidence = models.JSONField()
    digest = IdentityField(**DIGEST)
    created_at = models.DateTimeField(auto_now_add=True)


class ReplayRecordWrite(GuardedModel):
    """A record version written by an application command that runs with suppressed external effects.

    Seed 003 "Replay and external effects": Runtime refuses OutboundCommand
    authoring from a replay execution context. The Flows such a write
    triggers run later, in their own transactions; this immutable row carries
    the replay context to them: authoring for a FlowRun triggered by this
    exact record version is refused.
    """

    org_id = IdentityField(max_length=64)
    object_name = IdentityField(max_length=80)
    record_key = IdentityField(max_length=64)
    record_version = models.PositiveBigIntegerField()
    command_id = IdentityField(**DIGEST, help_text="The replay application command that wrote the version.")
    external_effects = models.CharField(max_length=32)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["org_id", "object_name", "record_key", "record_version"],
                                    name="replay_record_write_uniq"),
        ]


class RuntimePolicyGeneration(GuardedModel):
    """One immutable generation of the runtime policy of a scope (seed 004 section 16.3): the admission,
    pressure, ingress-shedding and retry bounds in force, authored by ``manage.py runtime_policy publish``.

    ``scope`` is ``*`` (the environment: every org) or one org id; an org's policy is the environment's
    latest generation overlaid by its own (:func:`runtime_outbox.policy.runtime_policy`). ``document`` is
    the canonical validated document, ``digest`` its digest; ``policy_version`` (``runtime.policy.<scope
    generation>``-style, see :func:`runtime_outbox.policy.policy_version_of`) names it in diagnostics.
    """

    scope = IdentityField(max_length=64)
    generation = models.PositiveIntegerField()
    document = models.JSONField()
    digest = IdentityField(**DIGEST)
    policy_version = IdentityField(max_length=80)
    authored_by = models.CharField(max_length=120)
    reason = models.CharField(max_length=240)
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["scope", "generation"], name="runtime_policy_generation_uniq"),
            models.UniqueConstraint(fields=["scope", "digest"], name="runtime_policy_digest_uniq"),
        ]
