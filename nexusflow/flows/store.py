"""The only writers of Flow Runtime rows (ARCHITECTURE.md section 6, "State changes").

Stateful rows change through :class:`CasStore` subclasses; immutable rows are
inserted once through :func:`nexusflow.kernel.models.insert`. Every locking
read also records its position in the Flow lifecycle sub-order of seed 004
section 12 (root -> steps -> attempts -> dependencies -> wake signals / effect
links); taking a lower-ranked lifecycle row after a higher one raises
:class:`LockOrderViolation` instead of risking a reversed wait.
"""
from __future__ import annotations

import datetime as dt
from typing import Any

from django.db import connections

from nexusflow.kernel import locks
from nexusflow.kernel.errors import FenceRejected, LockOrderViolation
from nexusflow.kernel.models import insert
from nexusflow.kernel.store import CasStore

from . import transitions as t
from .models import (
    FlowActionCapabilityCatalog,
    FlowActivation,
    FlowCheckpoint,
    FlowDependency,
    FlowEffectLink,
    FlowExecutionPlan,
    FlowRun,
    FlowStepAttempt,
    FlowStepExecution,
    FlowWakeSignal,
)

# Seed 004 section 12 lifecycle sub-order.
RANK_ACTIVATION = 0
RANK_ROOT = 1
RANK_STEP = 2
RANK_ATTEMPT = 3
RANK_DEPENDENCY = 4
RANK_SIGNAL = 5
RANK_NAMES = {0: "activation", 1: "root", 2: "step", 3: "attempt", 4: "dependency", 5: "signal/link"}


def note_lifecycle_rank(rank: int, using: str = "default") -> None:
    """Record that this transaction is about to lock a lifecycle row of ``rank``.

    Raises:
        LockOrderViolation: a higher-ranked lifecycle row is already locked.
        RuntimeError: called outside a transaction.
    """
    conn = connections[using]
    if not conn.in_atomic_block:
        raise RuntimeError("locking read outside a transaction")
    # The rank lives on the outermost real Atomic (not a test case's wrapping
    # block), so it ends with the transaction.
    blocks = [b for b in conn.atomic_blocks if not getattr(b, "_from_testcase", False)]
    holder = (blocks or conn.atomic_blocks or [conn])[0]
    held = getattr(holder, "_nexus_flow_rank", -1)
    if rank < held:
        raise LockOrderViolation(
            f"flow lifecycle lock {RANK_NAMES[rank]} requested after {RANK_NAMES[held]} (seed 004 section 12)"
        )
    holder._nexus_flow_rank = max(held, rank)


def _adapt(values: dict[str, Any] | None, using: str) -> dict[str, Any] | None:
    if not values:
        return values
    ops = connections[using].ops
    return {k: (ops.adapt_datetimefield_value(v) if isinstance(v, dt.datetime) else v) for k, v in values.items()}


class _FlowCasStore(CasStore):
    lock_class = locks.LockClass.FLOW_LIFECYCLE
    rank: int

    @classmethod
    def lock(cls, org_id: str, pk: int, *, nowait: bool = False):
        """Lock one row by trusted ``(org_id, id)`` in lifecycle order.

        Raises:
            LockOrderViolation: a later lifecycle class is already locked.
            Model.DoesNotExist: no such row in that org.
        """
        note_lifecycle_rank(cls.rank, cls.db())
        return super().lock(org_id, pk, nowait=nowait)

    @classmethod
    def transition(cls, *, org_id, pk, src, dst, version, fences=None, set_fields=None) -> int:
        db = cls.db()
        return super().transition(org_id=org_id, pk=pk, src=src, dst=dst, version=version,
                                  fences=_adapt(fences, db), set_fields=_adapt(set_fields, db))

    @classmethod
    def touch(cls, *, org_id, pk, state, version, fences=None, set_fields=None) -> int:
        db = cls.db()
        return super().touch(org_id=org_id, pk=pk, state=state, version=version,
                             fences=_adapt(fences, db), set_fields=_adapt(set_fields, db))


class FlowActivationStore(_FlowCasStore):
    model = FlowActivation
    machine = t.FLOW_ACTIVATION
    rank = RANK_ACTIVATION

    @classmethod
    def lock_active(cls, org_id: str, flow_api_name: str) -> FlowActivation | None:
        """Lock the active activation of ``(org_id, flow_api_name)``, if any."""
        note_lifecycle_rank(cls.rank, cls.db())
        locks.note(cls.lock_class, cls.db())
        return (FlowActivation.objects.select_for_update()
                .filter(org_id=org_id, active_slot=flow_api_name).first())


class FlowRunStore(_FlowCasStore):
    model = FlowRun
    machine = t.FLOW_RUN
    rank = RANK_ROOT


class FlowStepStore(_FlowCasStore):
    model = FlowStepExecution
    machine = t.FLOW_STEP_EXECUTION
    rank = RANK_STEP
    stale_error = FenceRejected


class FlowAttemptStore(_FlowCasStore):
    model = FlowStepAttempt
    machine = t.FLOW_STEP_ATTEMPT
    rank = RANK_ATTEMPT
    stale_error = FenceRejected


class FlowDependencyStore(_FlowCasStore):
    model = FlowDependency
    machine = t.FLOW_DEPENDENCY
    rank = RANK_DEPENDENCY


class FlowWakeSignalStore(_FlowCasStore):
    model = FlowWakeSignal
    machine = t.FLOW_WAKE_SIGNAL
    rank = RANK_SIGNAL


STORES: dict[str, type[_FlowCasStore]] = {
    s.machine.name: s
    for s in (FlowRunStore, FlowStepStore, FlowAttemptStore, FlowDependencyStore, FlowWakeSignalStore,
              FlowActivationStore)
}


# --- immutable rows ---------------------------------------------------------
def catalog_insert(**values) -> FlowActionCapabilityCatalog:
    return insert(FlowActionCapabilityCatalog, **values)


def plan_insert(**values) -> FlowExecutionPlan:
    return insert(FlowExecutionPlan, **values)


def checkpoint_insert(**values) -> FlowCheckpoint:
    return insert(FlowCheckpoint, **values)


def effect_link_insert(**values) -> FlowEffectLink:
    note_lifecycle_rank(RANK_SIGNAL)
    return insert(FlowEffectLink, **values)


def wake_signal_insert(**values) -> FlowWakeSignal:
    """Insert an accepted wake signal (no lock on any existing Flow row)."""
    t.FLOW_WAKE_SIGNAL.assert_initial(values["state"])
    values.setdefault("version", 1)
    return insert(FlowWakeSignal, **values)
