"""Closed reason codes for halted Flow runs and steps (ARCHITECTURE.md section 6)."""
from nexusflow.kernel.reasons import register

OWNER = "flows"

TRIGGER_RECORD_DELETED = register(
    "flow_trigger_record_deleted", owner=OWNER,
    evidence="FlowRun(org_id, id).terminal_cause_code; records.Record(org_id, object_name, record_key).is_deleted",
    alert_after_seconds=0, remediation="none: the effect was never authored; re-save a live record to run again",
).code
EFFECT_NO_EFFECT = register(
    "flow_effect_no_effect", owner=OWNER,
    evidence="FlowEffectLink(run) -> runtime_outbox IntentResultReceipt(command_id).outcome = no_effect",
    alert_after_seconds=3600, remediation="fix the provider-side refusal, then re-save the record",
).code
EFFECT_QUARANTINED = register(
    "flow_effect_quarantined", owner=OWNER,
    evidence="FlowEffectLink(run) -> runtime_outbox IntentResultReceipt(command_id).outcome = quarantined",
    alert_after_seconds=900, remediation="operator reconciles the Runtime intent; the Flow run stays quarantined",
).code
EFFECT_RECEIPT_MISSING = register(
    "flow_effect_receipt_missing", owner=OWNER,
    evidence="FlowWakeSignal(receipt_id) without a matching runtime_outbox IntentResultReceipt",
    alert_after_seconds=300, remediation="operator repairs the producer evidence; never retried automatically",
).code
STEP_RETRY_EXHAUSTED = register(
    "flow_step_retry_exhausted", owner=OWNER,
    evidence="FlowStepAttempt(step).safe_error_code for every RolledBack attempt",
    alert_after_seconds=0, remediation="fix the cause named by safe_error_code, then re-save the record",
).code
LEASE_EXPIRY_EXHAUSTED = register(
    "flow_lease_expiry_exhausted", owner=OWNER,
    evidence="FlowStepAttempt(step) rows in state Fenced",
    alert_after_seconds=0, remediation="investigate worker crashes at this step, then re-save the record",
).code
RECOVERY_COMMIT_EVIDENCE = register(
    "flow_recovery_commit_evidence", owner=OWNER,
    evidence="FlowCheckpoint(step) exists while the step is still Running under an expired lease",
    alert_after_seconds=0, remediation="invariant corruption: operator inspects the step; no automatic retry",
).code
HANDLER_BINDING_MISMATCH = register(
    "flow_handler_binding_mismatch", owner=OWNER,
    evidence="FlowExecutionPlan.plan_payload step entry_digest/binding_fingerprint vs the running catalog.json entry",
    alert_after_seconds=0, remediation="run a worker release that carries the plan's handler binding, or redeploy",
).code
