"""The Flow side of effect-handoff dead-letter convergence (seed 004 section 15.4).

:func:`effect_handoff_finalize` is the finalizer the Runtime's handoff
reconciliation (:mod:`runtime_outbox.handoff`) calls, through its port, for a
``flow.effect.submit`` message the owner's ``RejectIfUnaccepted`` fence
answered ``rejected``, or whose acceptance stayed unknown. It runs in the
Runtime's finalizing transaction, before the outbox row is locked, and locks
the run's root, the waiting EffectCompletion step and its dependency in the
one order (the same rows, versions and order as a wake, an expiry or a
cancel, so exactly one of them wins):

- ``rejected`` (no command was ever accepted, none ever will be): the
  completion step's compiled no-effect route, the same one a ``no_effect``
  receipt takes: its fault successor becomes ``Pending`` and the run
  ``Runnable``, or, without one, step ``Failed`` and run ``TerminalFailed``;
  the dependency ends ``rejected``; cause ``flow_effect_handoff_rejected``;
- ``acceptance_unknown``: dependency ``quarantined``, step and run
  ``Quarantined``, cause ``flow_effect_acceptance_unknown``: an operator
  reconciles the effect; nothing is retried or guessed.

A dependency that already left ``waiting`` (its receipt came, the run was
cancelled or expired) is left alone.
"""
from __future__ import annotations

import logging
from typing import Any

from nexusflow.kernel.clock import db_now
from nexusflow.kernel.scope import TrustedRuntimeWorkScope

from .. import reasons
from .. import transitions as t
from ..models import FlowDependency
from ..producers import PRODUCER_RUNTIME_INTENT
from ..store import audit_insert
from .admission import _step_def
from .effects import no_effect_route
from .expiry import EXPIRY_FAULT_PATH, EXPIRY_QUARANTINE, EXPIRY_TERMINAL, _finalize
from .wait_resolution import lock_waiting

log = logging.getLogger("nexusflow.flows")

VERDICT_REJECTED = "rejected"
VERDICT_UNKNOWN = "acceptance_unknown"


def effect_handoff_finalize(*, scope: TrustedRuntimeWorkScope, flow_run_id: int, dependency_key: str, verdict: str,
                            evidence: dict[str, Any]) -> str:
    """Apply a handoff verdict to the run's waiting completion dependency, in the caller's transaction.

    Args:
        scope: the persisted message's complete trusted Runtime work scope (the dependency must carry it).
        flow_run_id: the run that submitted the effect (the message's ``flow_run_id``).
        dependency_key: the completion dependency's key (the intent id).
        verdict: ``rejected`` or ``acceptance_unknown``.
        evidence: the fence's answer, kept in the run's audit.

    Returns:
        ``"fault_path"``, ``"terminal_failure"`` or ``"quarantined"``; ``"no_dependency"`` when the run has
        no such dependency in that scope (a run submitted before the completion dependency committed with
        its submit: it expires under its own policy); ``"already_<state>"`` when it left ``waiting``.

    Raises:
        ValueError: an unknown ``verdict``.
    """
    if verdict not in (VERDICT_REJECTED, VERDICT_UNKNOWN):
        raise ValueError(f"unknown handoff verdict {verdict!r}")
    dependency = (FlowDependency.objects.filter(
        org_id=scope.org_id, app_installation_id=scope.app_installation_id,
        runtime_capability_id=scope.runtime_capability_id, binding_digest=scope.binding_digest,
        run_id=flow_run_id, dependency_key=dependency_key, producer_kind=PRODUCER_RUNTIME_INTENT)
        .values_list("pk", "step_id").first())
    if dependency is None:
        log.error("no completion dependency %s for run %s in the message's scope", dependency_key, flow_run_id,
                  extra={"org_id": scope.org_id, "run_id": flow_run_id})
        return "no_dependency"
    dependency_id, step_id = dependency
    locked = lock_waiting(org_id=scope.org_id, run_id=flow_run_id, step_id=step_id, dependency_id=dependency_id)
    if locked is None:
        current = FlowDependency.objects.values_list("state", flat=True).get(org_id=scope.org_id, pk=dependency_id)
        return f"already_{current}"
    run, step, dependency_row = locked
    now = db_now()
    if verdict == VERDICT_UNKNOWN:
        outcome = _finalize(run, step, dependency_row, now, policy_name=EXPIRY_QUARANTINE,
                            unknown_cause=reasons.EFFECT_ACCEPTANCE_UNKNOWN)
    else:
        fault = no_effect_route(_step_def(run.plan, step.plan_step_key))
        outcome = _finalize(run, step, dependency_row, now,
                            policy_name=EXPIRY_TERMINAL if fault is None else EXPIRY_FAULT_PATH, fault_step=fault,
                            definite_cause=reasons.EFFECT_HANDOFF_REJECTED, definite_state=t.DEP_REJECTED)
    audit_insert(org_id=scope.org_id, run=run, step_id=step.pk, attempt=None, event="effect_handoff_finalized",
                 detail={"dependency": int(dependency_id), "verdict": verdict, "outcome": outcome, **evidence},
                 created_at=now)
    return outcome
