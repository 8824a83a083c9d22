"""Flow Runtime V2 use cases (seed 004 sections 7, 9, 10, 12, 14, 15 and 19).

This package re-exports the public use cases; a test that patches a seam or
a name a use case looks up patches the module that holds it.
"""
from .execute import (
    CancelResult,
    DeployResult,
    StartResult,
    StepClaim,
    effect_root_id_for,
    flow_activate,
    flow_before_save,
    flow_compile_check,
    flow_deploy,
    flow_plan_compile,
    flow_run_delete,
    flow_run_drive,
    flow_run_start,
    flow_run_support_read,
    flow_start_inputs,
    flow_step_claim_one,
    flow_step_execute,
    flow_step_heartbeat,
    flow_trigger_on_record_saved,
    flow_try_cancel_cleanup_one,
    flow_try_recover_expired_one,
    flow_try_run_step_one,
    flow_try_wake_one,
    flow_wake_signal_accept,
    metadata_view_seal,
    plan_inputs,
)

__all__ = [
    "CancelResult", "DeployResult", "StartResult", "StepClaim",
    "effect_root_id_for", "flow_activate", "flow_before_save", "flow_compile_check", "flow_deploy",
    "flow_plan_compile", "flow_run_delete", "flow_run_drive", "flow_run_start", "flow_run_support_read",
    "flow_start_inputs", "flow_step_claim_one", "flow_step_execute", "flow_step_heartbeat",
    "flow_trigger_on_record_saved", "flow_try_cancel_cleanup_one", "flow_try_recover_expired_one",
    "flow_try_run_step_one", "flow_try_wake_one", "flow_wake_signal_accept", "metadata_view_seal", "plan_inputs",
]
