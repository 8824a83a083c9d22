"""Support reads: one run (seed 004 section 19) and an org's waits (section 14)."""
from __future__ import annotations

from typing import Any

from nexusflow.kernel.ids import require_id
from nexusflow.kernel.scope import OrgScope

from .. import transitions as t
from ..errors import FlowRunNotFound
from ..models import FlowDependency, FlowEffectLink, FlowRun, FlowStepAttempt, FlowStepExecution, FlowWakeSignal
from ..producers import PRODUCERS

#: The most rows :func:`flow_waits_list` returns in one call.
WAITS_PAGE_MAX = 500
#: The newest wake signals :func:`flow_waits_list` shows per wait (``signals_total`` counts them all).
SIGNALS_PER_WAIT = 20


def _ts(value):
    return value.isoformat() if value is not None else None


def _contract_of(kind: str) -> dict[str, Any] | None:
    contract = PRODUCERS.get(kind)
    return None if contract is None else contract.as_dict()


def _dependency_json(d: FlowDependency) -> dict[str, Any]:
    return {"dependency_id": int(d.pk), "run_id": int(d.run_id), "step_id": int(d.step_id),
            "producer_kind": d.producer_kind, "producer": _contract_of(d.producer_kind),
            "dependency_key": d.dependency_key, "state": d.state,
            "deadline": _ts(d.deadline), "expiry_policy": d.expiry_policy, "condition": d.condition,
            "condition_digest": d.condition_digest, "resolved_at": _ts(d.resolved_at), "resolution": d.resolution,
            "reason_code": d.reason_code, "created_at": _ts(d.created_at)}


def flow_waits_list(*, org: OrgScope, state: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
    """The waits of one trusted org, oldest deadline first, as JSON-safe dicts (seed 004 sections 10.5, 14).

    Each row: dependency and run/step identity, producer kind and key, state,
    deadline, expiry policy, the condition (for a time wait its events and
    resume times), resolution evidence, and the wake signals accepted for the
    same producer key (id, producer, state, wake version, the producer's
    resolution receipt id when it has one, the dependency a consumed signal
    resolved, received and consumed times): a consumed signal is listed only
    under the wait it resolved; at most :data:`SIGNALS_PER_WAIT` newest per
    wait, ``signals_total`` counting them all.

    Args:
        state: one FlowDependency state (``waiting``, ``satisfied``, ...), or every state.
        limit: at most this many rows (1..:data:`WAITS_PAGE_MAX`).

    Raises:
        ValueError: an unknown ``state`` or a ``limit`` out of range (before SQL).
    """
    if state is not None and state not in t.FLOW_DEPENDENCY.states:
        raise ValueError(f"unknown wait state {state!r}; one of {', '.join(sorted(t.FLOW_DEPENDENCY.states))}")
    if not 1 <= limit <= WAITS_PAGE_MAX:
        raise ValueError(f"limit must be within 1..{WAITS_PAGE_MAX}")
    qs = FlowDependency.objects.filter(org_id=org.org_id)
    if state is not None:
        qs = qs.filter(state=state)
    rows = [_dependency_json(d) for d in qs.order_by("deadline", "id")[:limit]]
    keys = {(r["run_id"], r["dependency_key"]) for r in rows}
    by_dependency = {r["dependency_id"]: r for r in rows}
    for r in rows:
        r["signals"], r["signals_total"] = [], 0
    if keys:
        for sig in (FlowWakeSignal.objects.filter(org_id=org.org_id, flow_run_id__in={k[0] for k in keys})
                    .order_by("-id")):
            key = (int(sig.flow_run_id), sig.dependency_key)
            if key not in keys:
                continue
            # A consumed signal belongs to the dependency it resolved; an unmatched or expired one to its key.
            if sig.dependency_id is not None:
                owner = by_dependency.get(int(sig.dependency_id))
                owners = [] if owner is None else [owner]
            else:
                owners = [r for r in rows if (r["run_id"], r["dependency_key"]) == key]
            for r in owners:
                r["signals_total"] += 1
                if len(r["signals"]) < SIGNALS_PER_WAIT:
                    r["signals"].append({
                        "signal_id": int(sig.pk), "producer_kind": sig.producer_kind, "state": sig.state,
                        "wake_version": int(sig.wake_version),
                        "resolution_receipt_id": None if sig.receipt_id is None else int(sig.receipt_id),
                        "dependency_id": None if sig.dependency_id is None else int(sig.dependency_id),
                        "received_at": _ts(sig.received_at), "consumed_at": _ts(sig.consumed_at)})
    for r in rows:
        r["signals"].sort(key=lambda x: x["signal_id"])
    return rows


#: The keys of a wait step's output the support read shows (never the run's context or variables).
_WAIT_OUTCOME_KEYS = ("scheduled_path", "outcome", "why", "due_at", "wait", "event", "resolved_at", "record_version",
                      "met_on_arrival")


def _wait_outcome(step: FlowStepExecution) -> dict[str, Any] | None:
    """What a committed wait step decided (a scheduled path withdrawn, waiting again or due; the event a Wait
    element took), from its output checkpoint; None for other steps."""
    checkpoint = step.output_checkpoint
    output = (checkpoint.context_payload or {}).get("output") if checkpoint is not None else None
    if not isinstance(output, dict) or not ({"scheduled_path", "wait"} & output.keys()):
        return None
    from nexusflow.flows.redaction import support_projection

    return support_projection({key: output[key] for key in _WAIT_OUTCOME_KEYS if key in output})


def flow_run_support_read(*, org: OrgScope, run_id: FlowRun.Id | int, include_deleted: bool = False) -> dict[str, Any]:
    """The section 19 support read of one run of the trusted org, as a JSON-safe dict.

    Returns the immutable plan identity, canonical run state and legacy
    projection, current step, current checkpoint metadata (no raw context),
    every step with its attempt history (a wait step with ``wait_outcome``:
    a scheduled path's verdict ``outcome`` withdrawn / wait / due / recheck
    and ``why``, or the event a Wait element took), dependency and effect
    correlation and the safe terminal cause.

    Args:
        include_deleted: an authorized include-deleted read; otherwise a
            soft-deleted run is not found (``IsDeleted`` is the one filter).

    Raises:
        InvalidIdentity: ``run_id`` is not a FlowRun id (before SQL).
        FlowRunNotFound: no visible run ``run_id`` in ``org``.
    """
    run_id = require_id(run_id, FlowRun, field="run_id")
    qs = FlowRun.objects.filter(org_id=org.org_id, pk=run_id).select_related("plan", "current_checkpoint")
    if not include_deleted:
        qs = qs.filter(is_deleted=False)
    run = qs.first()
    if run is None:
        raise FlowRunNotFound(f"no flow run {int(run_id)} in this org")
    cp = run.current_checkpoint

    def ts(value):
        return value.isoformat() if value is not None else None

    steps = []
    for step in (FlowStepExecution.objects.filter(org_id=org.org_id, run_id=run.pk)
                 .select_related("output_checkpoint").order_by("id")):
        attempts = [{
            "attempt_id": int(a.pk), "attempt_number": a.attempt_number, "outcome": a.state,
            "lease_owner": a.lease_owner, "lease_correlation": a.lease_token_digest[:12],
            "ownership_epoch": a.ownership_epoch, "root_state_version_at_claim": a.root_state_version_at_claim,
            "failure_class": a.failure_class, "safe_error_code": a.safe_error_code,
            "retry_decision": a.retry_decision, "recovery_backoff_floor_ms": a.recovery_backoff_floor_ms,
            "lock_plan_digest": a.lock_plan_digest, "started_at": ts(a.started_at), "finished_at": ts(a.finished_at),
        } for a in FlowStepAttempt.objects.filter(org_id=org.org_id, step_id=step.pk).order_by("attempt_number")]
        steps.append({"step_id": int(step.pk), "plan_step_key": step.plan_step_key, "step_kind": step.step_kind,
                      "state": step.state, "version": step.version, "attempt_count": step.attempt_count,
                      "run_after": ts(step.run_after), "reason_code": step.reason_code,
                      "wait_outcome": _wait_outcome(step), "attempts": attempts})
    dependencies = [_dependency_json(d)
                    for d in FlowDependency.objects.filter(org_id=org.org_id, run_id=run.pk).order_by("id")]
    effects = [{"effect_link_id": int(e.pk), "step_id": int(e.step_id), "effect_owner_kind": e.effect_owner_kind,
                "outbound_command_id": int(e.outbound_command_id), "effect_handoff_key": e.effect_handoff_key}
               for e in FlowEffectLink.objects.filter(org_id=org.org_id, run_id=run.pk).order_by("id")]
    return {
        "run_id": int(run.pk), "org_id": run.org_id,
        "plan": {"plan_id": run.plan.plan_id, "plan_digest": run.plan_digest, "flow_api_name": run.plan.flow_api_name,
                 "flow_version": run.plan.flow_version, "execution_profile": run.execution_profile},
        "execution_owner": run.execution_owner, "state": run.state, "legacy_status": run.legacy_status,
        "state_version": run.version, "ownership_epoch": run.ownership_epoch,
        "current_step_id": int(run.current_step_id) if run.current_step_id else None,
        "current_checkpoint": None if cp is None else {
            "checkpoint_id": int(cp.pk), "sequence": cp.sequence, "plan_cursor": cp.plan_cursor,
            "context_digest": cp.context_digest, "context_schema_version": cp.context_schema_version},
        "terminal_cause": run.reason_code, "is_deleted": run.is_deleted,
        "delete_requested_at": ts(run.delete_requested_at), "started_at": ts(run.started_at),
        "completed_at": ts(run.completed_at), "trigger": {"object": run.trigger_object_name,
                                                          "record_key": run.record_key,
                                                          "record_version": run.record_version,
                                                          "save_depth": run.save_depth,
                                                          "triggered_by_run_id": run.triggered_by_run_id},
        "parent_run_id": run.parent_run_id,
        "subflow_run_ids": [int(pk) for pk in FlowRun.objects.filter(org_id=org.org_id, parent_run_id=run.pk)
                            .order_by("id").values_list("id", flat=True)],
        "steps": steps, "dependencies": dependencies, "effects": effects,
    }
