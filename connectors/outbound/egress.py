"""The sole egress adapter: DispatchPermit acquisition, one-shot send, settlement, recovery.

Seed 003 "State machines" (DispatchPermit, RemoteEffect) and "Transaction and
crash rules"; seed 002 "Before POST", "After POST", "Before PATCH".

Per effect: (1) grant (:mod:`~connectors.outbound.permit_grant`): lock gate ->
epoch -> credential gate -> effect, append an Attempt and a ``granted``
Permit, effect ``dispatching``; (2) send (:mod:`~connectors.outbound.permit_send`):
lock credential gate -> Permit, win ``granted -> sending``
(``io_may_have_started``), commit, then call the provider; (3) settle
(:mod:`~connectors.outbound.permit_settle`): lock effect -> Permit, append the
response, move the effect and close the Permit ``returned``; (4) finalize
(:mod:`~connectors.outbound.effect_finalize`): lock record -> effect, write the
mirror, record the Runtime intent receipt. Recovery of abandoned Permits and
``uncertain`` effects is :mod:`~connectors.outbound.recovery`. No transaction
spans the HTTP call.

This module composes the steps (:func:`effect_try_dispatch_one`) and is the
one import the worker roles and operators use: every step's entry point is
re-exported here.
"""
from __future__ import annotations

import logging

import httpx

from connectors.outbound.effect_finalize import effect_try_finalize_one
from connectors.outbound.egress_common import (
    FP_AFTER_FINALIZE,
    FP_AFTER_GRANT,
    FP_AFTER_RESPONSE,
    FP_AFTER_SENDING,
    FP_AFTER_SETTLE,
    FP_FINALIZE_INTENT_LOCKED,
    FP_GRANT_BEFORE_COMMIT,
    FP_SENDING_BEFORE_COMMIT,
    KNOWN_LANES,
    NONTERMINAL,
    EgressRefused,
    Grant,
    Response,
    append_evidence,
)
from connectors.outbound.permit_grant import permit_try_grant_one
from connectors.outbound.permit_send import permit_send
from connectors.outbound.permit_settle import permit_settle
from connectors.outbound.recovery import (
    effect_try_reconcile_one,
    effect_verify_create_conflict,
    permit_try_abandon_one,
)
from nexusflow.kernel import failpoints
from nexusflow.kernel.errors import StaleVersion
from nexusflow.kernel.logs import log_context
from nexusflow.kernel.retry import retry_deadlock_victim

__all__ = [
    "EgressRefused", "FP_AFTER_FINALIZE", "FP_AFTER_GRANT", "FP_AFTER_RESPONSE", "FP_AFTER_SENDING", "FP_AFTER_SETTLE",
    "FP_FINALIZE_INTENT_LOCKED", "FP_GRANT_BEFORE_COMMIT", "FP_SENDING_BEFORE_COMMIT", "Grant", "KNOWN_LANES",
    "NONTERMINAL", "Response", "append_evidence", "effect_try_dispatch_one", "effect_try_finalize_one",
    "effect_try_reconcile_one", "effect_verify_create_conflict", "permit_send", "permit_settle",
    "permit_try_abandon_one", "permit_try_grant_one",
]

log = logging.getLogger(__name__)


def effect_try_dispatch_one(*, worker_id: str, client: httpx.Client | None = None,
                            lanes: tuple[str, ...] = KNOWN_LANES) -> bool:
    """Grant, send and settle one effect of ``lanes``. Returns ``True`` if work was done."""
    grant = permit_try_grant_one(worker_id=worker_id, lanes=lanes)
    if grant is None:
        return False
    with log_context(org_id=grant.org_id, effect_id=int(grant.effect_id), trace_id=grant.trace_id or None,
                     unit="egress.dispatch"):
        return _dispatch_granted(grant, client)


def _dispatch_granted(grant, client: httpx.Client | None) -> bool:
    response = permit_send(grant, client=client)
    if response is None:
        return True
    failpoints.hit(FP_AFTER_RESPONSE)
    try:
        # The response is in hand: a settle transaction the server rolled back whole (deadlock victim, lock
        # wait timeout) runs again instead of leaving the Permit ``sending`` until this process ends.
        retry_deadlock_victim(permit_settle)(grant, response)
    except StaleVersion as exc:
        log.warning("settlement of permit %s fenced: %s", grant.permit_id, exc,
                    extra={"code": getattr(exc, "code", None)})
    return True
