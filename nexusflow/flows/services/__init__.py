"""Flow Runtime V2 use cases (seed 004 sections 7, 9, 10, 12, 14, 15 and 19), one module per use case.

- :mod:`.deploy`: :func:`flow_compile_check`, :func:`flow_plan_compile`,
  :func:`flow_activate`, :func:`flow_deploy`.
- :mod:`.admission`: :func:`flow_trigger_on_record_saved` (the records
  after-save hook) and :func:`flow_run_start` (an operator starts an
  autolaunched flow with inputs).
- :mod:`.claim`: :func:`flow_step_claim_one`, the :class:`StepClaim` fence.
- :mod:`.execute`: :func:`flow_step_execute` and the graph and terminal step
  executors, over the step transaction of :mod:`.step_txn`;
  :func:`flow_run_drive` (the operator's ``flows run``).
- :mod:`.effects`: the ``EffectSubmit`` / ``EffectCompletion`` executors,
  :func:`effect_root_id_for`.
- :mod:`.waits`: the producer entry point :func:`flow_wake_signal_accept`
  and :func:`flow_try_wake_one`.
- :mod:`.time_waits`: Wait elements on the database clock, the
  ``DependencyWait`` executor, :func:`flow_try_resume_due_one` and
  :func:`flow_wait_signal` (the operator's ``flows signal``).
- :mod:`.subflows`: a durable plan's subflow step (a child FlowRun and the
  ``subflow`` wait on its end), :func:`subflow_run_ended` (the wake its end
  writes).
- :mod:`.schedules`: :func:`flow_try_schedule_one` (schedule-triggered flows'
  occurrences) and :func:`flow_schedules_list` (the operator's ``flows schedules``).
- :mod:`.recovery`: :func:`flow_try_recover_expired_one`.
- :mod:`.expiry`: :func:`flow_try_expire_one` (a producer dependency past its
  deadline, under its compiled expiry policy) and :func:`flow_try_repair_one`
  (a run left ``Waiting`` on a terminal dependency).
- :mod:`.handoff`: :func:`effect_handoff_finalize`, the Flow side of a
  ``flow.effect.submit`` handoff the owner rejected or whose acceptance
  stayed unknown (section 15.4; the Runtime calls it through its port).
- :mod:`.lifecycle`: :func:`flow_step_heartbeat`, :func:`flow_run_delete`,
  :func:`flow_try_cancel_cleanup_one`, :func:`subflow_children_cancel`.
- :mod:`.before_save`: :func:`flow_before_save` (the records before-save hook).
- :mod:`.support`: :func:`flow_run_support_read`, :func:`flow_waits_list`
  (the operator's ``flows waits``).

Workers, one unit per call, each returning True when it did work:
:func:`flow_try_run_step_one` (the ``flow.step`` unit is :func:`flow_try_run_step_or_wait_one`, which
listens for a wake hint when nothing is due, :mod:`..wakeups`), :func:`flow_try_wake_one`, :func:`flow_try_resume_due_one`,
:func:`flow_try_recover_expired_one`, :func:`flow_try_cancel_cleanup_one`, :func:`flow_try_schedule_one`.

Transactions are short and never span I/O: a claim transaction, a
lifecycle-only start transaction, then one step transaction that takes the
business record lock first (when the step needs one), then root -> step ->
attempt -> dependency -> wake signal / effect link (section 12), and commits
the step result, checkpoint and next-step pointer atomically.

This package re-exports the public use cases; a test that patches a seam or
a name a use case looks up patches the module that holds it.
"""
from .admission import StartResult, flow_run_start, flow_start_inputs, flow_trigger_on_record_saved, plan_inputs
from .before_save import flow_before_save
from .claim import StepClaim, flow_step_claim_batch, flow_step_claim_one
from .deploy import (
    DeployResult,
    flow_activate,
    flow_compile_check,
    flow_deploy,
    flow_plan_compile,
    metadata_view_seal,
)
from .effects import effect_root_id_for
from .execute import flow_run_drive, flow_step_execute, flow_try_run_step_one, flow_try_run_step_or_wait_one
from .expiry import flow_try_expire_one, flow_try_repair_one
from .handoff import effect_handoff_finalize
from .lifecycle import CancelResult, flow_run_delete, flow_step_heartbeat, flow_try_cancel_cleanup_one
from .recovery import flow_try_recover_expired_one
from .schedules import flow_schedules_list, flow_try_schedule_one
from .support import flow_run_support_read, flow_waits_list
from .time_waits import flow_try_resume_due_one, flow_wait_signal
from .waits import flow_try_wake_one, flow_wake_signal_accept

__all__ = [
    "CancelResult", "DeployResult", "StartResult", "StepClaim", "effect_handoff_finalize", "effect_root_id_for",
    "flow_activate",
    "flow_before_save", "flow_compile_check", "flow_deploy", "flow_plan_compile", "flow_run_delete",
    "flow_run_drive", "flow_run_start", "flow_run_support_read", "flow_schedules_list", "flow_start_inputs", "flow_step_claim_batch",
    "flow_step_claim_one",
    "flow_step_execute", "flow_step_heartbeat", "flow_trigger_on_record_saved", "flow_try_cancel_cleanup_one",
    "flow_try_expire_one", "flow_try_recover_expired_one", "flow_try_repair_one", "flow_try_resume_due_one",
    "flow_try_run_step_one", "flow_try_run_step_or_wait_one", "flow_try_schedule_one", "flow_try_wake_one", "flow_wait_signal", "flow_waits_list", "flow_wake_signal_accept",
    "metadata_view_seal", "plan_inputs",
]
