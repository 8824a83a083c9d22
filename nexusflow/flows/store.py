"""The only writers of Flow Runtime rows (ARCHITECTURE.md section 6, "State changes").

Stateful rows change through :class:`CasStore` subclasses; immutable rows are
inserted once through :func:`nexusflow.kernel.models.insert`. Every locking
read also records its position in the Flow lifecycle sub-order of seed 004
section 12 (root -> steps -> attempts -> dependencies -> wake signals / effect
links); taking a lower-ranked lifecycle row after a higher one raises
:class:`LockOrderViolation` instead of risking a reversed wait.
"""
from __future__ import annotations



from nexusflow.kernel import locks
from nexusflow.kernel.errors import FenceRejected
from nexusflow.kernel.models import insert
from nexusflow.kernel.store import CasStore

from . import transitions as t
from .models import (
    FlowActionCatalogGeneration,
    FlowActivation,
    FlowCheckpoint,
    FlowDependency,
    FlowEffectLink,
    FlowExecutionPlan,
    FlowRun,
    FlowRuntimeMetadataView,
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
    lock_class = locks.LockClass.FLOW_LIFECYCLE


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


class FlowRunStore(_FlowCasStore):
    model = FlowRun
    machine = t.FLOW_RUN
    lock_rank, lock_label = RANK_ROOT, "root"


class FlowStepStore(_FlowCasStore):
    model = FlowStepExecution
    machine = t.FLOW_STEP_EXECUTION
    lock_rank, lock_label = RANK_STEP, "step"
    stale_error = FenceRejected


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


def checkpoint_insert(**values) -> FlowCheckpoint:
    return insert(FlowCheckpoint, **values)


def effect_link_insert(**values) -> FlowEffectLink:
    """Insert the submit step's effect link (an insert: no lock on any existing row)."""
    return insert(FlowEffectLink, **values)


def wake_signal_insert(**values) -> FlowWakeSignal:
    """Insert an accepted wake signal (no lock on any existing Flow row)."""
    t.FLOW_WAKE_SIGNAL.assert_initial(values["state"])
    values.setdefault("version", 1)
    return insert(FlowWakeSignal, **values)
