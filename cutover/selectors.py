"""Cutover reads (no locks), org-scoped.

``gates_halted_for_cutover`` is the evidence query of ``cutover_in_progress``
(``cutover/reasons.py``; seed 003 "Operational liveness and maintenance
admission").
"""
from __future__ import annotations

from django.db.models import QuerySet

from connectors.models import GateTransitionEvidence


def gates_halted_for_cutover(*, org_id: str, reason_code: str | None = None,
                             account_key: str | None = None) -> QuerySet[GateTransitionEvidence]:
    """Gate transition evidence of the gates that are not serving, newest first.

    Each row names the gate (with its current state and ``reason_code``), the
    step it took and the CutoverEvidence id/digest proving it; the attempt's
    CutoverDecision lives in the ``control`` database under the same org.

    Args:
        reason_code: only gates carrying this code (default: any code).
        account_key: only this account's gate.
    """
    qs = GateTransitionEvidence.objects.filter(org_id=org_id, gate__org_id=org_id).select_related("gate")
    qs = qs.filter(gate__reason_code=reason_code) if reason_code else qs.exclude(gate__reason_code="")
    if account_key is not None:
        qs = qs.filter(gate__account_key=account_key)
    return qs.order_by("-id")
