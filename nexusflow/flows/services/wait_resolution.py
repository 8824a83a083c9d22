"""Resolving a clock wait, and the record saves that make a scheduled path look again (seed 004 section 14.2).

:func:`clock_wait_resolve` is the one resolution transition of a
``runtime.clock`` dependency, in the caller's transaction: root -> step ->
dependency locks, state, version and scope checks, then dependency
``satisfied`` (with its resolution evidence), step ``Pending`` and root
``Runnable`` together. The resume sweep (:mod:`.time_waits`) calls it for a
due wait; :func:`scheduled_paths_recheck` calls it, right after a record save
commits, for a waiting scheduled path whose record no longer meets the flow's
entry conditions or whose time field changed, so the path's step withdraws
the path or evaluates the record again (docs/operations.md "Scheduled paths").

This module imports no executor module: the records after-save hook
(:mod:`.admission`) reaches it without an import cycle.
"""
from __future__ import annotations

import logging
from typing import Any

from django.db import transaction

from nexusflow.kernel import canonical_json, failpoints, locks
from nexusflow.kernel.clock import db_now
from nexusflow.kernel.scope import OrgScope

from .. import transitions as t
from ..binding import scope_of
from ..conditions import conditions_hold
from ..models import FlowDependency, FlowRun, FlowStepExecution
from ..producers import PRODUCER_CLOCK, PRODUCER_RECORD
from ..selectors import flow_path_runs_waiting, flow_plan_of
from ..store import FlowDependencyStore, FlowRunStore, FlowStepStore, audit_insert

log = logging.getLogger("nexusflow.flows")

#: A wait's expiry policy when reaching the deadline resolves it along its earliest time event.
EXPIRY_FIRES = "fires"
#: ``FlowRun.entry_path`` of a run of the start connector.
IMMEDIATE_PATH = "@immediate"
#: The resolution event of a scheduled path's wait ended early by a record save.
EVENT_RECORD_CHANGED = "record_changed"
#: ``FlowDependency.condition["kind"]`` of the wait of a scheduled path's first step for the path's time.
CONDITION_SCHEDULED_PATH = "scheduled_path"

FP_RECHECK_RESOLVED = failpoints.declare("flow.path.recheck_resolved")


def lock_waiting(*, org_id: str, run_id: int, step_id: int,
                 dependency_id: int) -> tuple[FlowRun, FlowStepExecution, FlowDependency] | None:
    """Lock root -> step -> dependency (section 12 order) and return them while all three still wait.

    ``None`` when the run left ``Waiting`` or moved past ``step_id`` (or is
    being deleted), the step left ``Waiting``, or the dependency is no longer
    ``waiting`` on that step: whoever moved it won, and the caller does nothing.
    """
    run = FlowRunStore.lock(org_id, run_id)
    if not root_waits_on(run, step_id):
        return None
    step = FlowStepStore.lock(org_id, step_id)
    if step.state != t.STEP_WAITING:
        return None
    dependency = FlowDependencyStore.lock(org_id, dependency_id)
    if not _dependency_waits(dependency, step):
        return None
    return run, step, dependency


def root_waits_on(run: FlowRun, step_id: int) -> bool:
    return (run.state == t.RUN_WAITING and run.current_step_id == step_id and not run.is_deleted
            and run.delete_requested_at is None)


def _dependency_waits(dependency: FlowDependency, step: FlowStepExecution) -> bool:
    return dependency.state == t.DEP_WAITING and dependency.step_id == step.pk


def clock_wait_resolve(*, org_id: str, run_id: int, step_id: int, dependency_id: int,
                       early: dict[str, Any] | None = None, operator: dict[str, Any] | None = None) -> bool:
    """Resolve one waiting time dependency in the caller's transaction; True when it did.

    A time dependency is a ``runtime.clock`` wait, or a record event's wait
    whose Wait element also has AlarmEvents (expiry policy ``fires``).
    Without ``early`` or ``operator`` the dependency must be due
    (``deadline <= db_now()``) and resolves with its earliest event. With
    ``early`` (a record save made a scheduled path look again) it resolves
    now with event ``record_changed`` and ``early`` as evidence. With
    ``operator`` (an operator's resume) it resolves now with its earliest
    event, as if that time had come (a record event's wait: along the record
    event, as if the record met its condition), and the operator's evidence. A run,
    step or dependency that moved (cancelled, resolved, another worker won)
    is left alone.
    """
    locked = lock_waiting(org_id=org_id, run_id=run_id, step_id=step_id, dependency_id=dependency_id)
    return locked is not None and _resolve_locked(*locked, now=db_now(), early=early, operator=operator)


def _resolve_locked(run: FlowRun, step: FlowStepExecution, dependency: FlowDependency, *, now,
                    early: dict[str, Any] | None = None, operator: dict[str, Any] | None = None) -> bool:
    """:func:`clock_wait_resolve` on rows the caller locked root -> step -> dependency and found waiting."""
    org_id = run.org_id
    record_operator = operator is not None and dependency.producer_kind == PRODUCER_RECORD
    if early is not None and dependency.producer_kind != PRODUCER_CLOCK:
        return False  # only a scheduled path's clock wait ends early on a save
    if not record_operator and dependency.expiry_policy != EXPIRY_FIRES:
        return False  # no time event decides this wait
    if early is None and operator is None and dependency.deadline > now:
        return False
    scope = scope_of(run)
    if (dependency.app_installation_id, dependency.runtime_capability_id, dependency.binding_digest) != (
            scope.app_installation_id, scope.runtime_capability_id, scope.binding_digest):
        log.error("clock wait %s does not share its run's work scope; left waiting", dependency.pk,
                  extra={"org_id": org_id, "run_id": run.pk})
        return False
    if record_operator:
        resolution = {"event": dependency.condition["event"], "resolved_at": now.isoformat(), "operator": operator}
    elif early is None:
        due = dependency.condition["events"][0]
        resolution = {"event": due["event"], "due_at": due["resume_at"], "resolved_at": now.isoformat()}
        if operator is not None:
            resolution["operator"] = operator
    else:
        resolution = {"event": EVENT_RECORD_CHANGED, "due_at": dependency.condition["events"][0]["resume_at"],
                      "resolved_at": now.isoformat(), **early}
    satisfy_and_resume(run, step, dependency, now=now, resolution=resolution)
    return True


def satisfy_and_resume(run: FlowRun, step: FlowStepExecution, dependency: FlowDependency, *, now,
                       resolution: dict[str, Any]) -> None:
    """Dependency ``satisfied`` with ``resolution``, step ``Pending``, root ``Runnable``, audit ``wait_resolved``.

    The one resolution transition of a clock or record wait (seed 004 section 14.2 step 6), on rows the caller
    locked root -> step -> dependency and found waiting; versions and fences are compared by the stores.
    """
    org_id = run.org_id
    FlowDependencyStore.transition(
        org_id=org_id, pk=dependency.pk, src=t.DEP_WAITING, dst=t.DEP_SATISFIED, version=dependency.version,
        set_fields={"resolved_at": now, "resolution": canonical_json.dumps(resolution).decode()},
    )
    resume_waiting(run, step, now=now)
    audit_insert(org_id=org_id, run=run, step_id=step.pk, attempt=None, event="wait_resolved",
                 detail={"dependency": int(dependency.pk), **resolution}, created_at=now)


def resume_waiting(run: FlowRun, step: FlowStepExecution, *, now) -> None:
    """Step ``Waiting`` -> ``Pending`` and root ``Waiting`` -> ``Runnable`` on it, due now (rows locked root first).

    The second half of every resolution (a satisfied dependency of any
    producer, and the repair of a run left waiting on one); the root is
    fenced on its current step and on not being deleted.
    """
    FlowStepStore.transition(
        org_id=run.org_id, pk=step.pk, src=t.STEP_WAITING, dst=t.STEP_PENDING, version=step.version,
        set_fields={"run_after": now, "updated_at": now},
    )
    FlowRunStore.transition(
        org_id=run.org_id, pk=run.pk, src=t.RUN_WAITING, dst=t.RUN_RUNNABLE, version=run.version,
        fences={"current_step_id": step.pk, "is_deleted": False, "delete_requested_at": None},
        set_fields={"run_after": now, "updated_at": now},
    )


def scheduled_paths_recheck(*, org: OrgScope, record, change) -> int:
    """Make the waiting scheduled paths of a just-updated record look again (records after-save hook).

    A path run waiting at its path's first step for the path's time resolves
    early (event ``record_changed``) when this save leaves the flow's entry
    conditions unmet (the resolution then carries ``withdraw``: the path is
    withdrawn whatever later saves do) or changes the record field the
    path's time is counted from (its step then waits for the recomputed time,
    or runs). A run that already entered its path (waiting at a Wait element
    inside it) is not touched: the path has started.

    Nothing is locked in the saving transaction, which may lock further
    records after this save: the recheck runs right after it commits, in a
    transaction of its own that locks the record first, then every such
    run's root, then their steps, then their dependencies (one declared
    set), and judges each run on the values this save wrote. A crash in
    between loses only the early look: the path's step evaluates the record
    again when its time comes (docs/operations.md "Scheduled paths").

    Returns how many waiting runs the recheck will look at (0: none, nothing deferred).
    """
    return _recheck_after_commit_of(org=org, record=record, changed_fields=frozenset(change.changed_fields),
                                    deleting=False)


def scheduled_paths_before_delete(*, org: OrgScope, record) -> int:
    """Withdraw every scheduled path of ``record`` still waiting for its time (records before-delete hook).

    Registered at ``DELETE_STAGE_FLOW_WAITS``. Like
    :func:`scheduled_paths_recheck` it locks nothing in the deleting
    transaction: right after that commits, each such wait resolves early with
    ``withdraw`` (why ``the record was deleted``) and its step withdraws the
    path. A refused deletion rolls the deferred recheck back with it. Returns
    how many waiting runs the recheck will look at.
    """
    return _recheck_after_commit_of(org=org, record=record, changed_fields=frozenset(), deleting=True)


def _recheck_after_commit_of(*, org: OrgScope, record, changed_fields: frozenset[str], deleting: bool) -> int:
    """Register the recheck of this save (or deletion) to run after its commit when a run may need it."""
    object_name, record_key, version = record.object_name, record.record_key, record.version
    fields = dict(record.fields)  # the values this save wrote: the verdict is this save's, not a later one's
    # A save judges the runs admitted before it; a deletion (no new version) every run admitted so far.
    admitted_before = version + 1 if deleting else version
    candidates = _recheck_candidates(org=org, object_name=object_name, record_key=record_key, fields=fields,
                                     changed_fields=changed_fields, admitted_before=admitted_before,
                                     deleting=deleting)
    if candidates:
        transaction.on_commit(lambda: _recheck_after_commit(
            org=org, object_name=object_name, record_key=record_key, fields=fields, version=version,
            admitted_before=admitted_before, changed_fields=changed_fields, deleting=deleting), robust=True)
    return len(candidates)


def _recheck_candidates(*, org: OrgScope, object_name: str, record_key: str, fields: dict[str, Any],
                        changed_fields: frozenset[str], admitted_before: int,
                        deleting: bool = False) -> list[tuple[int, int, int, str, bool]]:
    """``(run id, step id, dependency id, why, withdraw)`` of the record's path runs to wake (unlocked reads).

    Only runs admitted by a save older than the one judged (``record_version < admitted_before``): a run a
    later save admitted is that save's, and ``fields`` say nothing about it.
    """
    runs = [(run.pk, run.plan_id, run.plan_digest, run.entry_path, run.current_step_id)
            for run in flow_path_runs_waiting(org_id=org.org_id, object_name=object_name, record_key=record_key,
                                              version_below=admitted_before, immediate_path=IMMEDIATE_PATH)]
    out = []
    for run_id, plan_id, plan_digest, entry_path, current_step_id in runs:
        payload = flow_plan_of(org_id=org.org_id, plan_id=plan_id, plan_digest=plan_digest).plan_payload
        trigger = payload.get("trigger") or {}
        path = next((p for p in trigger.get("scheduled_paths") or [] if p["name"] == entry_path), None)
        entry = next((p for p in payload.get("scheduled_paths") or [] if p["name"] == entry_path), None)
        if path is None or entry is None or current_step_id is None:
            continue
        why, withdraw = None, True
        if deleting:
            why = "the record was deleted"
        elif not conditions_hold(trigger.get("filters") or [], trigger.get("filter_logic") or "and", fields):
            why = "entry conditions no longer hold"
        elif path.get("time_source") == "RecordField" and path.get("record_field") in changed_fields:
            why, withdraw = f"time field {path['record_field']} changed", False
        if why is None:
            continue
        # Only the wait of the path's own first step (its time): a Wait element inside the path is the path's own.
        dependency = (FlowDependency.objects.filter(org_id=org.org_id, run_id=run_id, step_id=current_step_id,
                                                    step__plan_step_key=entry["step"], state=t.DEP_WAITING,
                                                    producer_kind=PRODUCER_CLOCK)
                      .values_list("pk", "condition").first())
        if dependency is None or (dependency[1] or {}).get("kind") != CONDITION_SCHEDULED_PATH:
            continue
        out.append((int(run_id), int(current_step_id), int(dependency[0]), why, withdraw))
    return out


def _resolve_rechecks(*, org_id: str, candidates: list[tuple[int, int, int, str, bool]], record_version: int) -> int:
    """Lock every candidate's root, step and dependency as one declared set, then resolve those still waiting."""
    resources = []
    for run_id, step_id, dependency_id, _why, _withdraw in candidates:
        resources += [locks.store_resource(FlowRunStore, org_id, run_id),
                      locks.store_resource(FlowStepStore, org_id, step_id),
                      locks.store_resource(FlowDependencyStore, org_id, dependency_id)]
    rows = locks.acquire(resources)
    now = db_now()
    resolved = 0
    for index, (_run_id, step_id, _dependency_id, why, withdraw) in enumerate(candidates):
        run, step, dependency = rows[3 * index: 3 * index + 3]
        if not (root_waits_on(run, step_id) and step.state == t.STEP_WAITING
                and _dependency_waits(dependency, step)):
            continue  # whoever moved it won: the clock, a cancel, or another save
        early = {"why": why, "record_version": record_version, **({"withdraw": True} if withdraw else {})}
        with transaction.atomic():
            if _resolve_locked(run, step, dependency, now=now, early=early):
                resolved += 1
                failpoints.hit(FP_RECHECK_RESOLVED)
    return resolved


def _recheck_after_commit(*, org: OrgScope, object_name: str, record_key: str, fields: dict[str, Any],
                          version: int, admitted_before: int, changed_fields: frozenset[str], deleting: bool) -> int:
    """The recheck of one committed save or deletion: record lock, then the runs (own transaction)."""
    from nexusflow.records.models import Record
    from nexusflow.records.services import record_lock_owner

    with transaction.atomic(durable=True):
        try:
            record_lock_owner(org=org, object_name=object_name, record_key=record_key)  # live or deleted
        except Record.DoesNotExist:
            return 0
        candidates = _recheck_candidates(org=org, object_name=object_name, record_key=record_key, fields=fields,
                                         changed_fields=changed_fields, admitted_before=admitted_before,
                                         deleting=deleting)
        return _resolve_rechecks(org_id=org.org_id, candidates=candidates, record_version=version) if candidates else 0

