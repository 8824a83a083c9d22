"""Flow Runtime V2 state machines as data (seed 004 section 11).

``manage.py state_graph flows.FlowRun`` prints any of them.

States that store a reason code (``reason_required``; seed 003 "Operational
liveness and maintenance admission"; codes in ``nexusflow/flows/reasons.py``):

| machine | reason_required | why |
| --- | --- | --- |
| FlowRun | TerminalFailed, Quarantined | ``reason_code`` is seed 004's TerminalCauseCode for a failed or halted run; Succeeded and Cancelled need none |
| FlowStepExecution | Failed, Quarantined | the step that ended the run carries the same code |
| FlowDependency | rejected | the producer's evidence was refused; ``expired`` is explained by its ``deadline`` |
| FlowStepAttempt | none | attempt outcomes are evidence (``safe_error_code``); the step and run carry the code |
| FlowWakeSignal, FlowActivation, FlowScheduleOccurrence | none | no halted state |
"""
from nexusflow.kernel.transitions import machine

# --- FlowRun (seed 004 section 11.1) ----------------------------------------
RUN_ACCEPTED = "Accepted"
RUN_RUNNABLE = "Runnable"
RUN_RUNNING = "Running"
RUN_WAITING = "Waiting"
RUN_SUCCEEDED = "Succeeded"
RUN_TERMINAL_FAILED = "TerminalFailed"
RUN_QUARANTINED = "Quarantined"
RUN_CANCEL_REQUESTED = "CancelRequested"
RUN_CANCELLED = "Cancelled"

FLOW_RUN = machine(
    "flows.FlowRun",
    {
        RUN_ACCEPTED: {RUN_RUNNABLE, RUN_CANCEL_REQUESTED},
        RUN_RUNNABLE: {RUN_RUNNING, RUN_CANCEL_REQUESTED},
        RUN_RUNNING: {RUN_RUNNABLE, RUN_WAITING, RUN_SUCCEEDED, RUN_TERMINAL_FAILED, RUN_QUARANTINED,
                      RUN_CANCEL_REQUESTED},
        RUN_WAITING: {RUN_RUNNABLE, RUN_TERMINAL_FAILED, RUN_QUARANTINED, RUN_CANCEL_REQUESTED},
        RUN_CANCEL_REQUESTED: {RUN_CANCELLED},
        RUN_SUCCEEDED: set(),
        RUN_TERMINAL_FAILED: set(),
        RUN_QUARANTINED: set(),
        RUN_CANCELLED: set(),
    },
    initial={RUN_ACCEPTED},
    seed='Seed 004, section 11.1 "FlowRun"',
    reason_required={RUN_TERMINAL_FAILED, RUN_QUARANTINED},
)

# --- Legacy interview status projection (seed 004 section 18.2) -------------
LEGACY_RUNNING = "Running"
LEGACY_PAUSED = "Paused"
LEGACY_FINISHED = "Finished"
LEGACY_ERROR = "Error"

#: Canonical V2 state -> legacy interview status (section 18.2 table).
LEGACY_STATUS = {
    RUN_ACCEPTED: LEGACY_RUNNING, RUN_RUNNABLE: LEGACY_RUNNING, RUN_RUNNING: LEGACY_RUNNING,
    # CancelRequested is still in flight: the legacy view keeps reporting Running.
    RUN_CANCEL_REQUESTED: LEGACY_RUNNING,
    RUN_WAITING: LEGACY_PAUSED,
    RUN_SUCCEEDED: LEGACY_FINISHED,
    RUN_TERMINAL_FAILED: LEGACY_ERROR, RUN_QUARANTINED: LEGACY_ERROR,
    # "Error until a dedicated public cancellation value is versioned".
    RUN_CANCELLED: LEGACY_ERROR,
}


def legacy_status_of(state: str) -> str:
    """The legacy interview status projected from canonical ``state`` (seed 004 section 18.2).

    Raises:
        KeyError: ``state`` is not a FlowRun state.
    """
    return LEGACY_STATUS[state]


def legacy_projection_q():
    """A ``Q`` that holds exactly when ``legacy_status`` equals the projection of ``state`` (a CHECK)."""
    from django.db.models import Q

    out = Q()
    for legacy in sorted(set(LEGACY_STATUS.values())):
        states = sorted(s for s, v in LEGACY_STATUS.items() if v == legacy)
        out |= Q(state__in=states, legacy_status=legacy)
    return out


# --- FlowStepExecution (seed 004 section 11.2) -------------------------------
STEP_PENDING = "Pending"
STEP_CLAIMED = "Claimed"
STEP_RUNNING = "Running"
STEP_WAITING = "Waiting"
STEP_RETRY_SCHEDULED = "RetryScheduled"
STEP_SUCCEEDED = "Succeeded"
STEP_FAILED = "Failed"
STEP_QUARANTINED = "Quarantined"
STEP_CANCEL_REQUESTED = "CancelRequested"
STEP_CANCELLED = "Cancelled"

FLOW_STEP_EXECUTION = machine(
    "flows.FlowStepExecution",
    {
        STEP_PENDING: {STEP_CLAIMED, STEP_CANCELLED},
        STEP_RETRY_SCHEDULED: {STEP_CLAIMED, STEP_CANCELLED},
        STEP_CLAIMED: {STEP_RUNNING, STEP_PENDING, STEP_RETRY_SCHEDULED, STEP_CANCEL_REQUESTED},
        STEP_RUNNING: {STEP_SUCCEEDED, STEP_WAITING, STEP_RETRY_SCHEDULED, STEP_FAILED, STEP_QUARANTINED,
                       STEP_CANCEL_REQUESTED},
        STEP_WAITING: {STEP_CANCEL_REQUESTED, STEP_PENDING, STEP_FAILED, STEP_QUARANTINED},
        STEP_CANCEL_REQUESTED: {STEP_CANCELLED},
        STEP_SUCCEEDED: set(),
        STEP_FAILED: set(),
        STEP_QUARANTINED: set(),
        STEP_CANCELLED: set(),
    },
    # Waiting: an EffectSubmit step's transaction inserts its EffectCompletion step already waiting on the
    # completion dependency it commits with it (seed 004 section 15.1 step 5). Succeeded: the run's Terminal
    # step (no user work) is inserted finished by the transaction of the step before it
    # (FlowStepStore.create refuses any other kind in a state other than Pending).
    initial={STEP_PENDING, STEP_WAITING, STEP_SUCCEEDED},
    seed='Seed 004, section 11.2 "FlowStepExecution"',
    reason_required={STEP_FAILED, STEP_QUARANTINED},
)

# --- FlowStepAttempt outcome (seed 004 section 11.3) --------------------------
ATTEMPT_STARTED = "Started"
ATTEMPT_COMMITTED = "Committed"
ATTEMPT_ROLLED_BACK = "RolledBack"
ATTEMPT_COMMIT_UNKNOWN = "CommitUnknown"
ATTEMPT_ROLLBACK_UNKNOWN = "RollbackUnknown"
ATTEMPT_PRE_TRANSACTION_FAILED = "PreTransactionFailed"
ATTEMPT_FENCED = "Fenced"
ATTEMPT_CANCELLED = "Cancelled"
ATTEMPT_ABANDONED = "Abandoned"

FLOW_STEP_ATTEMPT = machine(
    "flows.FlowStepAttempt",
    {
        ATTEMPT_STARTED: {ATTEMPT_COMMITTED, ATTEMPT_ROLLED_BACK, ATTEMPT_COMMIT_UNKNOWN, ATTEMPT_ROLLBACK_UNKNOWN,
                          ATTEMPT_PRE_TRANSACTION_FAILED, ATTEMPT_FENCED, ATTEMPT_CANCELLED, ATTEMPT_ABANDONED},
        ATTEMPT_COMMITTED: set(),
        ATTEMPT_ROLLED_BACK: set(),
        ATTEMPT_COMMIT_UNKNOWN: set(),
        ATTEMPT_ROLLBACK_UNKNOWN: set(),
        ATTEMPT_PRE_TRANSACTION_FAILED: set(),
        ATTEMPT_FENCED: set(),
        ATTEMPT_CANCELLED: set(),
        ATTEMPT_ABANDONED: set(),
    },
    initial={ATTEMPT_STARTED},
    seed='Seed 004, section 11.3 "FlowStepAttempt outcome"',
)

# --- FlowDependency (seed 004 sections 10.5 and 14) ---------------------------
DEP_WAITING = "waiting"
DEP_SATISFIED = "satisfied"
DEP_EXPIRED = "expired"
DEP_REJECTED = "rejected"
DEP_CANCELLED = "cancelled"
#: Expiry under the quarantine policy: the producer's outcome is unknown (seed 004 sections 10.5 and 14.3).
DEP_QUARANTINED = "quarantined"

FLOW_DEPENDENCY = machine(
    "flows.FlowDependency",
    {
        DEP_WAITING: {DEP_SATISFIED, DEP_EXPIRED, DEP_REJECTED, DEP_CANCELLED, DEP_QUARANTINED},
        DEP_SATISFIED: set(),
        DEP_EXPIRED: set(),
        DEP_REJECTED: set(),
        DEP_CANCELLED: set(),
        DEP_QUARANTINED: set(),
    },
    initial={DEP_WAITING},
    seed='Seed 004, sections 10.5 and 14 "FlowDependency"',
    reason_required={DEP_REJECTED, DEP_EXPIRED, DEP_QUARANTINED},
)

# --- FlowWakeSignal resolution (seed 004 section 10.6) ------------------------
SIGNAL_UNMATCHED = "unmatched"
SIGNAL_CONSUMED = "consumed"
SIGNAL_EXPIRED = "expired"

FLOW_WAKE_SIGNAL = machine(
    "flows.FlowWakeSignal",
    {
        SIGNAL_UNMATCHED: {SIGNAL_CONSUMED, SIGNAL_EXPIRED},
        SIGNAL_CONSUMED: set(),
        SIGNAL_EXPIRED: set(),
    },
    initial={SIGNAL_UNMATCHED},
    seed='Seed 004, section 10.6 "FlowWakeSignal" ResolutionState',
)

# --- FlowActivation (seed 004 section 7.4) ------------------------------------
ACTIVATION_ACTIVE = "active"
ACTIVATION_SUPERSEDED = "superseded"

FLOW_ACTIVATION = machine(
    "flows.FlowActivation",
    {
        ACTIVATION_ACTIVE: {ACTIVATION_SUPERSEDED},
        ACTIVATION_SUPERSEDED: set(),
    },
    initial={ACTIVATION_ACTIVE},
    seed='Seed 004, section 7.4 "Flow version activation binding"',
)

# --- FlowScheduleOccurrence (a schedule-triggered flow's occurrence; docs/operations.md "Schedule-triggered flows")
OCCURRENCE_ADMITTING = "admitting"
OCCURRENCE_ADMITTED = "admitted"

FLOW_SCHEDULE_OCCURRENCE = machine(
    "flows.FlowScheduleOccurrence",
    {
        OCCURRENCE_ADMITTING: {OCCURRENCE_ADMITTED},
        OCCURRENCE_ADMITTED: set(),
    },
    initial={OCCURRENCE_ADMITTING},
    seed="Seed 004, section 12.1 (a schedule-triggered start admits its runs on the database clock)",
)

MACHINES = (FLOW_RUN, FLOW_STEP_EXECUTION, FLOW_STEP_ATTEMPT, FLOW_DEPENDENCY, FLOW_WAKE_SIGNAL, FLOW_ACTIVATION,
            FLOW_SCHEDULE_OCCURRENCE)
