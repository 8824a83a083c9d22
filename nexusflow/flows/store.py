"""The only writers of Flow Runtime rows (ARCHITECTURE.md section 6, "State changes").

Stateful rows change through :class:`CasStore` subclasses; immutable rows are
inserted once through :func:`nexusflow.kernel.models.insert`. Every locking
read also records its position in the Flow lifecycle sub-order of seed 004
section 12 (root -> steps -> attempts -> dependencies -> wake signals / effect
links); taking a lower-ranked lifecycle row after a higher one raises
:class:`LockOrderViolation` instead of risking a reversed wait.
"""
from __future__ import annotations

from nexusflow.kernel import canonical_json, locks
from nexusflow.kernel.errors import FenceRejected, IllegalTransition
from nexusflow.kernel.models import insert
from nexusflow.kernel.store import CasStore

from . import transitions as t
from . import wakeups
from .compiler.constants import KIND_EFFECT_COMPLETION, KIND_TERMINAL
from .errors import CheckpointRejected
from .models import (
    FlowActionCatalogGeneration,
    FlowActivation,
    FlowAuditEvent,
    FlowCheckpoint,
    FlowDependency,
    FlowDeploymentSource,
    FlowEffectLink,
    FlowExecutionPlan,
    FlowRun,
    FlowRuntimeMetadataView,
    FlowScheduleOccurrence,
    FlowStepAttempt,
    FlowStepExecution,
    FlowWakeSignal,
)

# Seed 004 section 12 lifecycle sub-order inside LockClass.FLOW_LIFECYCLE.
RANK_ACTIVATION = 0
RANK_ROOT = 1
RANK_STEP = 2
RANK_ATTEMPT = 3
RANK_DEPENDENCY = 4
RANK_SIGNAL = 5


def note_lifecycle_rank(rank: int, label: str, using: str = "default") -> None:
    """Record a lifecycle lock at ``rank`` (see :func:`nexusflow.kernel.locks.note`)."""
    locks.note(locks.LockClass.FLOW_LIFECYCLE, using, rank=rank, label=label)


class _FlowCasStore(CasStore):
    """A Flow lifecycle store: :class:`CasStore`'s locking reads (one ``SELECT <every column> ... FOR UPDATE``
    built once per model, :mod:`nexusflow.kernel.rows`) at its position in the lifecycle sub-order."""

    lock_class = locks.LockClass.FLOW_LIFECYCLE


class FlowScheduleOccurrenceStore(_FlowCasStore):
    """The only writer of FlowScheduleOccurrence rows; locked alone, before any run it admits is inserted."""

    model = FlowScheduleOccurrence
    machine = t.FLOW_SCHEDULE_OCCURRENCE
    lock_rank, lock_label = RANK_ACTIVATION, "schedule_occurrence"


class FlowActivationStore(_FlowCasStore):
    model = FlowActivation
    machine = t.FLOW_ACTIVATION
    lock_rank, lock_label = RANK_ACTIVATION, "activation"

    @classmethod
    def lock_active(cls, org_id: str, flow_api_name: str) -> FlowActivation | None:
        """Lock the active activation of ``(org_id, flow_api_name)``, if any."""
        note_lifecycle_rank(cls.lock_rank, cls.lock_label, cls.db())
        return (FlowActivation.objects.select_for_update()
                .filter(org_id=org_id, active_slot=flow_api_name).first())


#: Called inside the transaction that moves a run into a terminal state, after the CAS:
#: ``hook(org_id=..., run_id=..., state=..., parent_run_id=...)`` (registered by the app,
#: :func:`register_run_ended`); ``parent_run_id`` is :data:`PARENT_UNREAD` when the caller did not hand over
#: the locked root.
_RUN_ENDED_HOOKS: list = []
#: ``parent_run_id`` of a run-ended hook call whose caller did not hand over the root row: the hook reads it.
PARENT_UNREAD = object()


def register_run_ended(hook) -> None:
    """Call ``hook`` in every transaction that ends a run (e.g. a subflow's parent wake); idempotent."""
    if hook not in _RUN_ENDED_HOOKS:
        _RUN_ENDED_HOOKS.append(hook)


class FlowRunStore(_FlowCasStore):
    """``FlowInterviewStateStore`` (seed 004 section 10.1): the only writer of FlowRun rows.

    Every insert and every state CAS writes the legacy status projection of
    section 18.2 with the canonical state, in the same statement; no caller
    can set it on its own.
    """

    model = FlowRun
    machine = t.FLOW_RUN
    lock_rank, lock_label = RANK_ROOT, "root"
    immutable_columns = frozenset({"plan_id", "plan_digest", "execution_profile", "execution_owner", "org_id",
                                   "app_installation_id", "runtime_capability_id", "binding_digest",
                                   "trigger_object_name", "record_key", "record_version", "created_at"})

    @classmethod
    def create(cls, **values):
        """Insert a root in an initial state with its legacy projection (see :meth:`CasStore.create`).

        Raises:
            ValueError: ``legacy_status`` given by the caller.
        """
        if "legacy_status" in values:
            raise ValueError("FlowRun.legacy_status is a projection; the store writes it")
        cls.machine.assert_initial(values["state"])  # IllegalTransition before the projection lookup
        values["legacy_status"] = t.legacy_status_of(values["state"])
        return super().create(**values)

    @classmethod
    def transition(cls, *, set_fields=None, locked: FlowRun | None = None, **kwargs) -> int:
        """Move the root and its legacy projection together (see :meth:`CasStore.transition`).

        A move to ``Runnable`` hints the idle ``flow`` workers once the transaction commits
        (:func:`.wakeups.hint_after_commit`); a move to a terminal state calls the run-ended hooks.

        Args:
            locked: the root row as the caller locked it in this transaction: its ``parent_run_id`` (fixed
                at insert) goes to the run-ended hooks, which then need not read it.

        Raises:
            ValueError: ``set_fields`` names ``legacy_status`` (before SQL).
        """
        if "legacy_status" in (set_fields or {}):
            raise ValueError("FlowRun.legacy_status is a projection; the store writes it")
        cls.machine.assert_transition(kwargs["src"], kwargs["dst"])  # unlisted pairs fail before anything else
        set_fields = {**(set_fields or {}), "legacy_status": t.legacy_status_of(kwargs["dst"])}
        version = super().transition(set_fields=set_fields, **kwargs)
        if kwargs["dst"] == t.RUN_RUNNABLE:  # an idle worker may claim it as soon as this commits
            wakeups.hint_after_commit(wakeups.RUNNABLE, cls.db())
        if kwargs["dst"] in cls.machine.terminal:
            parent = PARENT_UNREAD if locked is None or int(locked.pk) != int(kwargs["pk"]) else locked.parent_run_id
            for hook in _RUN_ENDED_HOOKS:
                hook(org_id=kwargs["org_id"], run_id=kwargs["pk"], state=kwargs["dst"], parent_run_id=parent)
        return version

    @classmethod
    def touch(cls, *, set_fields=None, **kwargs) -> int:
        if "legacy_status" in (set_fields or {}):
            raise ValueError("FlowRun.legacy_status is a projection; the store writes it")
        return super().touch(set_fields=set_fields, **kwargs)


class FlowStepStore(_FlowCasStore):
    model = FlowStepExecution
    machine = t.FLOW_STEP_EXECUTION
    lock_rank, lock_label = RANK_STEP, "step"
    stale_error = FenceRejected

    #: The only step kinds inserted in an initial state other than Pending, and in which.
    INSERTED_AS = {t.STEP_WAITING: frozenset({KIND_EFFECT_COMPLETION}), t.STEP_SUCCEEDED: frozenset({KIND_TERMINAL})}

    @classmethod
    def create(cls, **values):
        """Insert a step ``Pending`` (any kind), ``Waiting`` (EffectCompletion) or ``Succeeded`` (Terminal).

        Seed 004 section 15.1 step 5 inserts the EffectCompletion step waiting; the run's Terminal step does
        no user work, so the transaction of the step before it inserts it finished (:func:`.services.step_txn.
        _commit_step`).

        Raises:
            IllegalTransition: another kind in ``Waiting`` or ``Succeeded``, or a state that is not initial.
        """
        kinds = cls.INSERTED_AS.get(values["state"])
        if kinds is not None and values.get("step_kind") not in kinds:
            raise IllegalTransition(f"a {values.get('step_kind')} step cannot be inserted {values['state']}")
        return super().create(**values)


class FlowAttemptStore(_FlowCasStore):
    model = FlowStepAttempt
    machine = t.FLOW_STEP_ATTEMPT
    lock_rank, lock_label = RANK_ATTEMPT, "attempt"
    stale_error = FenceRejected


class FlowDependencyStore(_FlowCasStore):
    model = FlowDependency
    machine = t.FLOW_DEPENDENCY
    lock_rank, lock_label = RANK_DEPENDENCY, "dependency"


class FlowWakeSignalStore(_FlowCasStore):
    model = FlowWakeSignal
    machine = t.FLOW_WAKE_SIGNAL
    lock_rank, lock_label = RANK_SIGNAL, "signal"


STORES: dict[str, type[_FlowCasStore]] = {
    s.machine.name: s
    for s in (FlowRunStore, FlowStepStore, FlowAttemptStore, FlowDependencyStore, FlowWakeSignalStore,
              FlowActivationStore)
}


# --- immutable rows ---------------------------------------------------------
def catalog_insert(**values) -> FlowActionCatalogGeneration:
    return insert(FlowActionCatalogGeneration, **values)


def metadata_view_insert(**values) -> FlowRuntimeMetadataView:
    return insert(FlowRuntimeMetadataView, **values)


def plan_insert(**values) -> FlowExecutionPlan:
    return insert(FlowExecutionPlan, **values)


def deployment_source_insert(**values) -> FlowDeploymentSource:
    return insert(FlowDeploymentSource, **values)


#: Seed 004 sections 10.4 and 17.3: the serialized context bound of one checkpoint (bytes).
CHECKPOINT_MAX_BYTES = 64 * 1024
#: Keys that name forbidden credential material anywhere in a checkpoint payload (lower-cased, no
#: separators); a payload holding one is refused before SQL.
FORBIDDEN_CONTEXT_KEYS = frozenset({
    "password", "passwd", "secret", "clientsecret", "apikey", "accesstoken", "refreshtoken", "bearertoken",
    "token", "authorization", "credential", "credentials", "privatekey", "sessionid", "leasetoken",
})


def _forbidden_key(key: str) -> bool:
    folded = "".join(ch for ch in key.lower() if ch.isalnum())
    return folded in FORBIDDEN_CONTEXT_KEYS


def checkpoint_payload_check(payload) -> int:
    """Validate a checkpoint context payload; return its serialized size in bytes.

    Seed 004 sections 10.4 and 17.3: payloads are size bounded and exclude
    credential material. Walks every nested key.

    Raises:
        CheckpointRejected: a key names credential material (code
            ``flow_checkpoint_credential``) or the canonical JSON is larger
            than :data:`CHECKPOINT_MAX_BYTES` (``flow_checkpoint_too_large``).
    """
    todo = [payload]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                if isinstance(key, str) and _forbidden_key(key):
                    raise CheckpointRejected(f"checkpoint key {key!r} names credential material",
                                             code="flow_checkpoint_credential")
                todo.append(value)
        elif isinstance(node, list):
            todo.extend(node)
    size = len(canonical_json.dumps(payload))
    if size > CHECKPOINT_MAX_BYTES:
        raise CheckpointRejected(f"checkpoint context is {size} bytes, over {CHECKPOINT_MAX_BYTES}",
                                 code="flow_checkpoint_too_large")
    return size


def checkpoint_insert(**values) -> FlowCheckpoint:
    """Insert one immutable checkpoint after :func:`checkpoint_payload_check` (seed 004 section 10.4).

    Raises:
        CheckpointRejected: see :func:`checkpoint_payload_check` (before SQL).
    """
    checkpoint_payload_check(values["context_payload"])
    return insert(FlowCheckpoint, **values)


def audit_insert(**values) -> FlowAuditEvent:
    """Append one audit event (evidence only; seed 004 section 13.1 step 5)."""
    return insert(FlowAuditEvent, **values)


def effect_link_insert(**values) -> FlowEffectLink:
    """Insert the submit step's effect link (an insert: no lock on any existing row)."""
    return insert(FlowEffectLink, **values)


def wake_signal_insert(**values) -> FlowWakeSignal:
    """Insert an accepted wake signal (no lock on any existing Flow row)."""
    t.FLOW_WAKE_SIGNAL.assert_initial(values["state"])
    values.setdefault("version", 1)
    signal = insert(FlowWakeSignal, **values)
    wakeups.hint_after_commit(wakeups.SIGNAL)
    return signal
