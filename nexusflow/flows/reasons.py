"""Closed reason codes for halted Flow runs and steps (ARCHITECTURE.md section 6).

A run in ``TerminalFailed`` or ``Quarantined`` stores one of these in
``FlowRun.reason_code`` (seed 004's TerminalCauseCode); the step that ended it
stores the same code in ``FlowStepExecution.reason_code``. The handler's own
error code stays in ``FlowStepAttempt.safe_error_code`` as evidence.

Severity classes: TRIGGER_RECORD_DELETED and STEP_EXPECTED_REFUSAL are ``benign``
(an expected, recorded end of the run); every other code is ``attention``.
"""
from nexusflow.kernel.reasons import ATTENTION, BENIGN, register

OWNER = "flows"
_S = "nexusflow.flows.selectors."

# --- TerminalFailed ------------------------------------------------------------
TRIGGER_RECORD_DELETED = register(
    "flow_trigger_record_deleted", owner=OWNER, evidence=_S + "flow_runs_with_reason",
    severity_class=BENIGN, alert_after_seconds=0, remediations=("none",))
EFFECT_NO_EFFECT = register(
    "flow_effect_no_effect", owner=OWNER, evidence=_S + "flow_effect_links_for_reason",
    severity_class=ATTENTION, alert_after_seconds=3600, remediations=("reauthor_intent",))
STEP_RETRY_EXHAUSTED = register(
    "flow_step_retry_exhausted", owner=OWNER, evidence=_S + "flow_attempts_for_reason",
    severity_class=ATTENTION, alert_after_seconds=3600, remediations=("reauthor_intent",))
#: The step's handler refused definitely (a checkpoint holding credential material, a push contract that
#: cannot be frozen, a refused record write...): an operator must look at the handler code on the attempt.
STEP_DEFINITE_REFUSAL = register(
    "flow_step_definite_refusal", owner=OWNER, evidence=_S + "flow_attempts_for_reason",
    severity_class=ATTENTION, alert_after_seconds=3600, remediations=("reauthor_intent", "fix_pack_mapping"))
#: The handler's definite refusal is an expected outcome (``NexusError.expected_outcome``), e.g. a push whose
#: mapping produced no body: nothing was to be done, so the run ends TerminalFailed as a recorded, benign
#: outcome with nothing for an operator to do.
STEP_EXPECTED_REFUSAL = register(
    "flow_step_expected_refusal", owner=OWNER, evidence=_S + "flow_attempts_for_reason",
    severity_class=BENIGN, alert_after_seconds=0, remediations=("none",))
RECURSION_LIMIT = register(
    "flow_recursion_limit", owner=OWNER, evidence=_S + "flow_runs_with_reason",
    severity_class=ATTENTION, alert_after_seconds=3600, remediations=("fix_flow_recursion",))
LEASE_EXPIRY_EXHAUSTED = register(
    "flow_lease_expiry_exhausted", owner=OWNER, evidence=_S + "flow_attempts_for_reason",
    severity_class=ATTENTION, alert_after_seconds=600, remediations=("reauthor_intent",))

#: A subflow's child run ended without succeeding (failed, quarantined or cancelled): the calling step fails
#: with it, as a failing subflow fails its caller in the Flow language; the child run keeps its own reason code.
SUBFLOW_FAILED = register(
    "flow_subflow_failed", owner=OWNER, evidence=_S + "flow_runs_with_reason",
    severity_class=ATTENTION, alert_after_seconds=3600, remediations=("reauthor_intent",))
DEPENDENCY_EXPIRED = register(
    "flow_dependency_expired", owner=OWNER, evidence=_S + "flow_runs_with_reason",
    severity_class=ATTENTION, alert_after_seconds=3600, remediations=("reauthor_intent",))
#: The record a Wait element's record event watched was deleted while the run waited: it can never meet the
#: resume condition, so the wait's fault path ran or, without one, the run failed (seed 004 22.4-10).
WAIT_PRODUCER_DELETED = register(
    "flow_wait_producer_deleted", owner=OWNER, evidence=_S + "flow_runs_with_reason",
    severity_class=ATTENTION, alert_after_seconds=3600, remediations=("reauthor_intent",))

#: The effect owner's RejectIfUnaccepted fence proved that no command was accepted for the run's effect
#: handoff (seed 004 section 15.4): the effect never happened; the completion step's no-effect route ran.
EFFECT_HANDOFF_REJECTED = register(
    "flow_effect_handoff_rejected", owner=OWNER, evidence=_S + "flow_runs_with_reason",
    severity_class=ATTENTION, alert_after_seconds=3600, remediations=("reauthor_intent",))

# --- Quarantined ---------------------------------------------------------------
#: The handoff's delivery and reconciliation budgets ran out without a durable owner answer, or the owner's
#: fence failed closed: whether the owner accepted the effect is unknown (seed 004 section 15.4).
EFFECT_ACCEPTANCE_UNKNOWN = register(
    "flow_effect_acceptance_unknown", owner=OWNER, evidence=_S + "flow_runs_with_reason",
    severity_class=ATTENTION, alert_after_seconds=900, remediations=("operator_reconcile",))
DEPENDENCY_EXPIRED_UNKNOWN = register(
    "flow_dependency_expired_unknown", owner=OWNER, evidence=_S + "flow_runs_with_reason",
    severity_class=ATTENTION, alert_after_seconds=900, remediations=("operator_reconcile",))
EFFECT_QUARANTINED = register(
    "flow_effect_quarantined", owner=OWNER, evidence=_S + "flow_effect_links_for_reason",
    severity_class=ATTENTION, alert_after_seconds=900, remediations=("operator_reconcile",))
EFFECT_RECEIPT_MISSING = register(
    "flow_effect_receipt_missing", owner=OWNER, evidence=_S + "flow_effect_links_for_reason",
    severity_class=ATTENTION, alert_after_seconds=300, remediations=("inspect_invariant",))
RECOVERY_COMMIT_EVIDENCE = register(
    "flow_recovery_commit_evidence", owner=OWNER, evidence=_S + "flow_checkpoints_for_reason",
    severity_class=ATTENTION, alert_after_seconds=60, remediations=("inspect_invariant",))
HANDLER_BINDING_MISMATCH = register(
    "flow_handler_binding_mismatch", owner=OWNER, evidence=_S + "flow_runs_with_reason",
    severity_class=ATTENTION, alert_after_seconds=600, remediations=("reauthor_intent",))
# --- added with the complete executor (seed 004 sections 5.2, 12.2 and 13.3) ------
STEP_EXECUTION_ERROR = register(
    "flow_step_execution_error", owner=OWNER, evidence=_S + "flow_attempts_for_reason",
    severity_class=ATTENTION, alert_after_seconds=3600, remediations=("reauthor_intent",))
#: Seed 004 section 17.2: a step's writes, decided again as the run's principal under the access policy in
#: force, were refused (object, field-level or record access), or the principal is no longer an active user.
ACCESS_DENIED = register(
    "flow_access_denied", owner=OWNER, evidence=_S + "flow_attempts_for_reason",
    severity_class=ATTENTION, alert_after_seconds=3600, remediations=("operator_reconcile",))
PRINCIPAL_DISABLED = register(
    "flow_principal_disabled", owner=OWNER, evidence=_S + "flow_attempts_for_reason",
    severity_class=ATTENTION, alert_after_seconds=3600, remediations=("operator_reconcile",))
LOCK_PLAN_EXCEEDED = register(
    "flow_lock_plan_exceeded", owner=OWNER, evidence=_S + "flow_attempts_for_reason",
    severity_class=ATTENTION, alert_after_seconds=3600, remediations=("reauthor_intent",))
COMMIT_UNKNOWN = register(
    "flow_commit_unknown", owner=OWNER, evidence=_S + "flow_attempts_for_reason",
    severity_class=ATTENTION, alert_after_seconds=300, remediations=("inspect_invariant",))
ROLLBACK_UNKNOWN = register(
    "flow_rollback_unknown", owner=OWNER, evidence=_S + "flow_attempts_for_reason",
    severity_class=ATTENTION, alert_after_seconds=300, remediations=("inspect_invariant",))
