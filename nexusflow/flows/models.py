"""Flow Runtime V2 schema (seed 004 sections 7.4, 8.4 and 10).

Schema only: every row is a ``GuardedModel``; immutable rows are inserted by
``store.py`` and stateful rows change only through its CAS stores. Every row
carries the trusted ``org_id``; run-scoped Runtime rows also carry the rest of
the ``TrustedRuntimeWorkScope``. Identity columns use binary collation.
"""
from django.db import models

from nexusflow.kernel.identity import IdentityField
from nexusflow.kernel.models import (
    GuardedModel,
    TypedIdReference,
    reason_code_constraint,
    reason_code_field,
    trace_id_field,
)

from . import transitions


def OrgField():  # a column factory, read like a field class
    return IdentityField(max_length=64)


def DigestField(**kwargs):
    return IdentityField(max_length=64, **kwargs)


def ScopeField():
    return IdentityField(max_length=128)


class FlowActionCatalogGeneration(GuardedModel):
    """One sealed, immutable capability-catalog generation (seed 004 section 8.4).

    Scoped by the complete RuntimeWorkBinding: ``(org_id, app_installation_id,
    runtime_capability_id, binding_digest, generation_id)``.
    """

    org_id = OrgField()
    app_installation_id = ScopeField()
    runtime_capability_id = ScopeField()
    binding_digest = DigestField()
    binding = models.JSONField(help_text="The complete RuntimeWorkBinding the generation is bound to.")
    generation_id = IdentityField(max_length=64)
    contract_version = IdentityField(max_length=64)
    digest_profile = IdentityField(max_length=64)
    digest = DigestField()
    entries = models.JSONField(help_text="Sorted entries with descriptor, entry digests and binding fingerprints.")
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["org_id", "app_installation_id", "runtime_capability_id", "binding_digest", "generation_id"],
                name="flow_catalog_generation_uniq",
            ),
            # Target of the plan's composite catalog reference (migration 0002).
            models.UniqueConstraint(
                fields=["org_id", "app_installation_id", "runtime_capability_id", "binding_digest", "id", "digest"],
                name="flow_catalog_composite_ref_uniq",
            ),
        ]

    def __str__(self) -> str:
        return f"catalog {self.generation_id} ({self.org_id})"


class FlowRuntimeMetadataView(GuardedModel):
    """An immutable, content-addressed RuntimeMetadataView artifact (seed 004 section 7.4).

    A plan references its view through ``(org_id, metadata_view_digest)``
    (enforced in the database, ``ON DELETE RESTRICT``), so in-flight runs keep
    the exact view their plan was compiled against.
    """

    org_id = OrgField()
    view_digest = DigestField()
    digest_profile = IdentityField(max_length=64)
    objects_payload = models.JSONField(help_text="Object and field schema of the view, as compiled against.")
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["org_id", "view_digest"], name="flow_metadata_view_uniq"),
        ]

    def __str__(self) -> str:
        return f"view {self.view_digest[:12]} ({self.org_id})"


class FlowExecutionPlan(GuardedModel):
    """An immutable compiled plan (seed 004 section 7.4)."""

    org_id = OrgField()
    app_installation_id = ScopeField()
    runtime_capability_id = ScopeField()
    runtime_work_binding_digest = DigestField()
    runtime_work_binding = models.JSONField()
    plan_id = IdentityField(max_length=64)
    flow_api_name = IdentityField(max_length=80)
    flow_version = DigestField(help_text="Source version identity: the metadata digest.")
    metadata_digest = DigestField()
    compiler_version = IdentityField(max_length=32)
    catalog = models.ForeignKey(FlowActionCatalogGeneration, on_delete=models.PROTECT, related_name="plans")
    catalog_digest = DigestField()
    trigger_object_name = IdentityField(max_length=80)
    trigger_binding_digest = DigestField()
    metadata_view_digest = DigestField()
    # The RuntimeMetadataView artifact; the database also enforces (org_id, metadata_view_digest).
    metadata_view = models.ForeignKey(FlowRuntimeMetadataView, on_delete=models.PROTECT, related_name="plans")
    policy_version = IdentityField(max_length=32)
    execution_profile = models.CharField(max_length=32)
    digest_profile = IdentityField(max_length=64)
    plan_digest = DigestField()
    plan_payload = models.JSONField()
    bound_summary = models.JSONField()
    diagnostic_summary = models.TextField()
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["org_id", "plan_id"], name="flow_plan_id_uniq"),
            models.UniqueConstraint(fields=["org_id", "plan_digest"], name="flow_plan_digest_uniq"),
            models.UniqueConstraint(
                fields=["org_id", "app_installation_id", "runtime_capability_id", "runtime_work_binding_digest",
                        "flow_api_name", "metadata_digest", "compiler_version", "catalog",
                        "trigger_binding_digest", "policy_version"],
                name="flow_plan_input_tuple_uniq",
            ),
        ]
        indexes = [models.Index(fields=["org_id", "trigger_object_name"], name="flow_plan_trigger_idx")]

    def __str__(self) -> str:
        return f"{self.flow_api_name} {self.plan_id}"


class FlowDeploymentSource(GuardedModel):
    """The Flow metadata a deployed plan was compiled from (seed 004 section 7.4), kept so a runtime policy
    generation that changes a plan-eligibility bound can recompile the org's active Flows
    (docs/operations.md "The runtime policy"). ``subflows``: ``{flow API name: source text}`` of the flows
    it calls, transitively; ``requested_profile``: the deploy's requested profile, if any."""

    org_id = OrgField()
    flow_api_name = IdentityField(max_length=80)
    plan = models.ForeignKey(FlowExecutionPlan, on_delete=models.PROTECT, related_name="sources")
    source = models.TextField()
    subflows = models.JSONField(default=dict)
    requested_profile = models.CharField(max_length=32, blank=True)
    source_digest = DigestField()
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["org_id", "plan", "source_digest"], name="flow_deployment_source_uniq"),
        ]


class FlowActivation(GuardedModel):
    """Which plan a Flow version runs in an org; owns active/superseded (section 7.4)."""

    org_id = OrgField()
    flow_api_name = IdentityField(max_length=80)
    plan = models.ForeignKey(FlowExecutionPlan, on_delete=models.PROTECT, related_name="activations")
    # The activation binding (section 7.4): valid only while the request-bound
    # view yields this RuntimeWorkBinding digest and trigger binding digest.
    runtime_work_binding_digest = DigestField(null=True)
    trigger_binding_digest = DigestField(null=True)
    state = models.CharField(max_length=16)
    version = models.PositiveBigIntegerField(default=1)
    # Equal to flow_api_name while active, NULL once superseded: at most one
    # active activation per (org, flow) without a partial index.
    active_slot = IdentityField(max_length=80, null=True)
    created_at = models.DateTimeField()
    superseded_at = models.DateTimeField(null=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["org_id", "active_slot"], name="flow_activation_one_active_uniq"),
        ]
        indexes = [models.Index(fields=["org_id", "state"], name="flow_activation_state_idx")]


class FlowScheduleOccurrence(GuardedModel):
    """One occurrence of a schedule-triggered Flow and the runs it admitted (docs/operations.md
    "Schedule-triggered flows").

    Unique per ``(org, flow, occurrence time)``: however many workers sweep, and across a redeploy of the
    flow, an occurrence admits its runs once. ``admitting`` walks the trigger object's records in key order
    in bounded batches (``cursor_record_key``: the last record a committed batch considered); ``admitted``
    when the walk is done.
    """

    org_id = OrgField()
    flow_api_name = IdentityField(max_length=80)
    plan = models.ForeignKey(FlowExecutionPlan, on_delete=models.PROTECT, related_name="schedule_occurrences")
    occurrence_at = models.DateTimeField(help_text="The schedule's time this occurrence stands for (UTC).")
    state = models.CharField(max_length=16)
    version = models.PositiveBigIntegerField(default=1)
    cursor_record_key = IdentityField(max_length=64, null=True)
    considered = models.PositiveIntegerField(default=0, help_text="Records of the object the walk has read.")
    admitted = models.PositiveIntegerField(default=0, help_text="Runs admitted: records that met the filters.")
    created_at = models.DateTimeField()
    completed_at = models.DateTimeField(null=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["org_id", "flow_api_name", "occurrence_at"],
                                    name="flow_schedule_occurrence_uniq"),
        ]
        indexes = [models.Index(fields=["state", "id"], name="flow_schedule_occ_state_idx")]

    def __str__(self) -> str:
        return f"{self.flow_api_name} @ {self.occurrence_at:%Y-%m-%d %H:%M} {self.state}"


class FlowRun(GuardedModel):
    """The Flow run root: the lifecycle authority (seed 004 sections 10.1 and 11.1)."""

    org_id = OrgField()
    app_installation_id = ScopeField()
    runtime_capability_id = ScopeField()
    binding_digest = DigestField()
    plan = models.ForeignKey(FlowExecutionPlan, on_delete=models.PROTECT, related_name="runs")
    plan_digest = DigestField()
    trace_id = trace_id_field()
    execution_profile = models.CharField(max_length=32)
    execution_owner = models.CharField(max_length=32)
    state = models.CharField(max_length=24)
    version = models.PositiveBigIntegerField(default=1, help_text="Root state version (CAS fence).")
    ownership_epoch = models.PositiveIntegerField(default=1)
    trigger_object_name = IdentityField(max_length=80)
    record_key = IdentityField(max_length=64)
    record_version = models.PositiveBigIntegerField()
    current_step = models.ForeignKey("FlowStepExecution", null=True, on_delete=models.PROTECT, related_name="+")
    current_checkpoint = models.ForeignKey("FlowCheckpoint", null=True, on_delete=models.PROTECT, related_name="+")
    run_after = models.DateTimeField(null=True)
    queue_class = models.CharField(max_length=32, default="default")
    priority = models.SmallIntegerField(default=0)
    # Recursive saves (docs/operations.md "Flows that save their own records"): the run whose
    # own record write admitted this run (null: an outside save admitted it), and
    # how many such Flow-caused re-saves lie between the logical save and this run.
    triggered_by_run = models.ForeignKey("self", null=True, on_delete=models.PROTECT, related_name="triggered_runs")
    save_depth = models.PositiveSmallIntegerField(default=0)
    # Seed 004 section 17.1 (nexusflow/flows/authorization.py): who the run acts as and who caused it, and the
    # access-policy generation in force at admission; never a session cookie, token or password.
    principal_mode = models.CharField(max_length=8, default="system", help_text="system | user")
    execution_principal = models.CharField(max_length=80, default="", blank=True,
                                           help_text="The declared identity every step reauthorizes as.")
    initiating_principal = models.CharField(max_length=80, default="", blank=True,
                                            help_text="Who caused the run, when known.")
    authorization_digest = IdentityField(max_length=64, default="", blank=True,
                                         help_text="The access-policy generation in force at admission ('' none).")
    # A subflow call of a Durable Orchestration plan (docs/operations.md "Subflows"): the run whose subflow
    # step started this one and waits on its end (null: not a subflow run).
    parent_run = models.ForeignKey("self", null=True, on_delete=models.PROTECT, related_name="subflow_runs")
    # Seed 004's TerminalCauseCode: the closed reason a run failed or halted.
    reason_code = reason_code_field()
    # Seed 004 section 18.2: the legacy interview status, written only by the
    # same CAS that moves ``state`` (FlowRunStore); a CHECK refuses divergence.
    legacy_status = models.CharField(max_length=16, default=transitions.LEGACY_RUNNING)
    # Cancel fence: set together with CancelRequested (section 10.1). ``is_deleted``
    # is the one public-visibility fact; there is no other tombstone.
    is_deleted = models.BooleanField(default=False)
    delete_requested_at = models.DateTimeField(null=True)
    started_at = models.DateTimeField(null=True)
    completed_at = models.DateTimeField(null=True)
    entry_path = IdentityField(max_length=80, default="@immediate", help_text=(
        "The path this run runs: @immediate (the start connector) or a record-triggered scheduled path's name."))
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["org_id", "plan", "record_key", "record_version", "entry_path"],
                                    name="flow_run_trigger_path_uniq"),
            reason_code_constraint(transitions.FLOW_RUN, name="flow_run_reason_chk"),
            models.CheckConstraint(
                condition=transitions.legacy_projection_q(), name="flow_run_legacy_projection_chk"),
        ]
        indexes = [
            models.Index(fields=["org_id", "state", "run_after", "queue_class", "id"], name="flow_run_claim_idx"),
            models.Index(fields=["org_id", "plan", "state", "run_after", "id"], name="flow_run_plan_claim_idx"),
            models.Index(fields=["state", "run_after", "id"], name="flow_run_due_idx"),
            # a record save finds its waiting scheduled paths (wait_resolution.scheduled_paths_recheck)
            models.Index(fields=["org_id", "record_key", "state"], name="flow_run_record_state_idx"),
        ]

    def __str__(self) -> str:
        return f"run {self.pk} ({self.org_id}) {self.state}"


class FlowStepExecution(GuardedModel):
    """One logical step invocation (seed 004 sections 10.2 and 11.2)."""

    org_id = OrgField()
    run = models.ForeignKey(FlowRun, on_delete=models.PROTECT, related_name="steps")
    plan_step_key = IdentityField(max_length=120)
    invocation_ordinal = models.PositiveIntegerField(default=1)
    step_kind = models.CharField(max_length=32)
    state = models.CharField(max_length=24)
    version = models.PositiveBigIntegerField(default=1)
    attempt_count = models.PositiveIntegerField(default=0)
    lease_owner = models.CharField(max_length=128, null=True)
    lease_token_digest = DigestField(null=True)
    lease_expires_at = models.DateTimeField(null=True)
    ownership_epoch = models.PositiveIntegerField(default=1)
    run_after = models.DateTimeField(null=True)
    queue_class = models.CharField(max_length=32, default="default")
    failure_class = models.CharField(max_length=32, blank=True, default="")
    reason_code = reason_code_field()
    input_checkpoint = models.ForeignKey("FlowCheckpoint", null=True, on_delete=models.PROTECT, related_name="+")
    output_checkpoint = models.ForeignKey("FlowCheckpoint", null=True, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["org_id", "run", "plan_step_key", "invocation_ordinal"],
                                    name="flow_step_invocation_uniq"),
            reason_code_constraint(transitions.FLOW_STEP_EXECUTION, name="flow_step_reason_chk"),
        ]
        indexes = [
            models.Index(fields=["org_id", "state", "queue_class", "run_after", "id"], name="flow_step_claim_idx"),
            models.Index(fields=["state", "lease_expires_at"], name="flow_step_lease_idx"),
        ]

    def __str__(self) -> str:
        return f"step {self.plan_step_key} of run {self.run_id} {self.state}"


class FlowStepAttempt(GuardedModel):
    """One fenced attempt at a step (seed 004 sections 10.3 and 11.3)."""

    org_id = OrgField()
    step = models.ForeignKey(FlowStepExecution, on_delete=models.PROTECT, related_name="attempts")
    attempt_number = models.PositiveIntegerField()
    state = models.CharField(max_length=24, help_text="Transaction outcome: Started, then one terminal outcome.")
    version = models.PositiveBigIntegerField(default=1, help_text="AttemptStateVersion.")
    lease_owner = models.CharField(max_length=128)
    lease_token_digest = DigestField()
    ownership_epoch = models.PositiveIntegerField()
    root_state_version_at_claim = models.PositiveBigIntegerField()
    retry_policy_digest = DigestField()
    recovery_backoff_floor_ms = models.PositiveIntegerField()
    plan_digest = DigestField()
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True)
    failure_class = models.CharField(max_length=32, blank=True, default="")
    safe_error_code = models.CharField(max_length=64, blank=True, default="")
    retry_decision = models.CharField(max_length=16, default="none")
    # Seed 004 sections 10.3 and 13.3: the declared resource plan this attempt
    # locks first (immutable) and its digest; ``metrics_summary`` is bounded
    # outcome evidence (e.g. the resource a late discovery found).
    lock_plan = models.JSONField(default=list)
    lock_plan_digest = DigestField(null=True)
    metrics_summary = models.JSONField(default=dict)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["org_id", "step", "attempt_number"], name="flow_attempt_number_uniq"),
        ]
        indexes = [models.Index(fields=["org_id", "started_at"], name="flow_attempt_org_started_idx")]


class FlowCheckpoint(GuardedModel):
    """Immutable resume snapshot committed with a step (seed 004 section 10.4)."""

    org_id = OrgField()
    run = models.ForeignKey(FlowRun, on_delete=models.PROTECT, related_name="checkpoints")
    step = models.ForeignKey(FlowStepExecution, null=True, on_delete=models.PROTECT, related_name="checkpoints",
                             help_text="NULL for the trigger snapshot the run starts from.")
    sequence = models.PositiveIntegerField()
    plan_cursor = IdentityField(max_length=120, null=True, help_text="Next compiled step key, NULL at the end.")
    context_schema_version = models.PositiveSmallIntegerField(default=1)
    context_payload = models.JSONField()
    context_digest = DigestField()
    created_by_attempt = models.ForeignKey(FlowStepAttempt, null=True, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["org_id", "run", "sequence"], name="flow_checkpoint_sequence_uniq"),
            models.UniqueConstraint(fields=["org_id", "step"], name="flow_checkpoint_step_uniq"),
        ]


class FlowDependency(GuardedModel):
    """Why a step cannot continue yet (seed 004 sections 10.5 and 14)."""

    org_id = OrgField()
    app_installation_id = ScopeField()
    runtime_capability_id = ScopeField()
    binding_digest = DigestField()
    run = models.ForeignKey(FlowRun, on_delete=models.PROTECT, related_name="dependencies")
    step = models.ForeignKey(FlowStepExecution, on_delete=models.PROTECT, related_name="dependencies")
    producer_kind = models.CharField(max_length=64)
    dependency_key = IdentityField(max_length=128, help_text="Producer key, e.g. the Runtime intent id.")
    condition_digest = DigestField()
    condition = models.JSONField(default=dict, help_text=(
        "The immutable satisfaction rule the digest covers, e.g. a time wait's events and resume times."))
    expiry_policy = models.CharField(max_length=32)
    state = models.CharField(max_length=16)
    version = models.PositiveBigIntegerField(default=1)
    deadline = models.DateTimeField()
    resolved_at = models.DateTimeField(null=True)
    resolution_receipt_id = TypedIdReference(to="runtime_outbox.IntentResultReceipt", null=True)
    resolution = models.JSONField(null=True, help_text=(
        "Safe resolution evidence set with the satisfied transition, e.g. which time event fired and when."))
    reason_code = reason_code_field()
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["org_id", "app_installation_id", "runtime_capability_id", "binding_digest", "step"],
                name="flow_dependency_step_uniq",
            ),
            reason_code_constraint(transitions.FLOW_DEPENDENCY, name="flow_dependency_reason_chk"),
        ]
        indexes = [models.Index(fields=["org_id", "run", "dependency_key"], name="flow_dependency_key_idx"),
                   models.Index(fields=["state", "producer_kind", "deadline", "id"], name="flow_dependency_due_idx")]


class FlowWakeSignal(GuardedModel):
    """Durable acceptance of a producer notification (seed 004 section 10.6).

    ``flow_run_id`` is a typed id column, not a foreign key: accepting a
    signal inside a producer's transaction must not take a lock on the run row.
    """

    org_id = OrgField()
    app_installation_id = ScopeField()
    runtime_capability_id = ScopeField()
    binding_digest = DigestField()
    flow_run_id = TypedIdReference(to="flows.FlowRun")
    producer_kind = models.CharField(max_length=64)
    dependency_key = IdentityField(max_length=128)
    receipt_id = TypedIdReference(to="runtime_outbox.IntentResultReceipt", null=True,
                                  help_text="Producer-owned evidence of a runtime.intent_result wake: the intent "
                                            "result receipt (empty for other producers).")
    wake_version = models.PositiveBigIntegerField(default=0, help_text=(
        "Monotonic producer version of this wake (a record.condition wake: the record version the save wrote; "
        "0 for a producer that wakes once per key)."))
    evidence_digest = DigestField()
    state = models.CharField(max_length=16, help_text="unmatched -> consumed | expired.")
    version = models.PositiveBigIntegerField(default=1)
    received_at = models.DateTimeField()
    consumed_at = models.DateTimeField(null=True)
    dependency = models.ForeignKey(FlowDependency, null=True, on_delete=models.PROTECT, related_name="signals")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["org_id", "app_installation_id", "runtime_capability_id", "binding_digest",
                        "flow_run_id", "dependency_key", "wake_version"],
                name="flow_wake_signal_uniq",
            ),
        ]
        indexes = [models.Index(fields=["state", "id"], name="flow_wake_signal_state_idx")]


class FlowEffectLink(GuardedModel):
    """Immutable lineage from an EffectSubmit step to its Runtime intent (seed 004 section 10.8)."""

    org_id = OrgField()
    app_installation_id = ScopeField()
    runtime_capability_id = ScopeField()
    binding_digest = DigestField()
    run = models.ForeignKey(FlowRun, on_delete=models.PROTECT, related_name="effect_links")
    step = models.ForeignKey(FlowStepExecution, on_delete=models.PROTECT, related_name="effect_links")
    effect_owner_kind = models.CharField(max_length=64)
    outbound_command_id = TypedIdReference(to="runtime_outbox.OutboundCommand")
    effect_handoff_key = IdentityField(max_length=128)
    submission_attempt = models.ForeignKey(FlowStepAttempt, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["org_id", "step"], name="flow_effect_link_step_uniq"),
            models.UniqueConstraint(fields=["org_id", "outbound_command_id"], name="flow_effect_link_command_uniq"),
        ]


class FlowAuditEvent(GuardedModel):
    """Append-only Flow audit evidence, inserted in the committing transaction (seed 004 sections 5.1.9, 13.1).

    Evidence, never read to decide: safe codes and digests only, no raw context.
    """

    org_id = OrgField()
    run = models.ForeignKey(FlowRun, on_delete=models.PROTECT, related_name="audit_events")
    step = models.ForeignKey(FlowStepExecution, null=True, on_delete=models.PROTECT, related_name="+")
    attempt = models.ForeignKey(FlowStepAttempt, null=True, on_delete=models.PROTECT, related_name="+")
    event = models.CharField(max_length=48)
    detail = models.JSONField(default=dict)
    created_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["org_id", "run", "id"], name="flow_audit_run_idx")]
