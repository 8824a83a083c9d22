"""Connector reads (no locks), org-scoped.

The ``*_with_reason`` / ``*_for_reason`` selectors are the evidence queries of
the connector reason codes (``connectors/reasons.py``; seed 003 "Operational
liveness and maintenance admission"). Each takes the trusted ``org_id`` and an
optional ``reason_code`` filter and returns the rows an operator reads.
"""
from __future__ import annotations

from django.db.models import QuerySet

from .models import (
    DispatchPermit,
    OrderingDecision,
    ReceiptComponent,
    RemoteEffect,
    RemoteEffectAttempt,
    RemoteLink,
    ServingEpoch,
)


def _with_reason(qs: QuerySet, reason_code: str | None, field: str = "reason_code") -> QuerySet:
    return qs.filter(**{field: reason_code}) if reason_code else qs.exclude(**{field: ""})


def receipt_components_quarantined(*, org_id: str, reason_code: str | None = None,
                                   receipt_id: int | None = None) -> QuerySet[ReceiptComponent]:
    """Quarantined receipt items of ``org_id`` with their raw item, newest receipt first.

    Args:
        reason_code: only items with this code (default: every quarantined item).
        receipt_id: only items of this receipt.
    """
    qs = ReceiptComponent.objects.filter(receipt__org_id=org_id, disposition="quarantined").select_related("receipt")
    if receipt_id is not None:
        qs = qs.filter(receipt_id=receipt_id)
    return _with_reason(qs, reason_code).order_by("-receipt_id", "ordinal")


def ordering_decisions_superseded(*, org_id: str, reason_code: str | None = None,
                                  lane_id: int | None = None) -> QuerySet[OrderingDecision]:
    """Superseded-ordering decisions with their execution and the winning position.

    Args:
        reason_code: only decisions whose execution carries this code.
        lane_id: only decisions of this OrderingLane.
    """
    qs = OrderingDecision.objects.filter(org_id=org_id).select_related("execution", "lane")
    if lane_id is not None:
        qs = qs.filter(lane_id=lane_id)
    return _with_reason(qs, reason_code, "execution__reason_code").order_by("-id")


def serving_epochs_with_reason(*, org_id: str, reason_code: str | None = None) -> QuerySet[ServingEpoch]:
    """Serving epochs carrying a reason (rejected candidates), newest first."""
    return _with_reason(ServingEpoch.objects.filter(org_id=org_id), reason_code).order_by("-id")


def remote_effect_attempts_for_reason(*, org_id: str, reason_code: str | None = None,
                                      effect_id: int | None = None) -> QuerySet[RemoteEffectAttempt]:
    """Request/response evidence of the effects carrying a reason code.

    Rows carry ``response_status``, ``response_body``, ``error`` and the exact
    request, ordered by effect then attempt number.
    """
    qs = RemoteEffectAttempt.objects.filter(org_id=org_id).select_related("effect")
    if effect_id is not None:
        qs = qs.filter(effect_id=effect_id)
    return _with_reason(qs, reason_code, "effect__reason_code").order_by("effect_id", "attempt_number")


def dispatch_permits_abandoned(*, org_id: str, reason_code: str | None = None,
                               effect_id: int | None = None) -> QuerySet[DispatchPermit]:
    """Abandoned Permits (``closed_evidence`` holds the holder-termination proof) of effects with a reason."""
    qs = DispatchPermit.objects.filter(org_id=org_id, state="abandoned").select_related("attempt__effect")
    if effect_id is not None:
        qs = qs.filter(attempt__effect_id=effect_id)
    return _with_reason(qs, reason_code, "attempt__effect__reason_code").order_by("id")


def remote_links_with_reason(*, org_id: str, reason_code: str | None = None,
                             link_key: str | None = None) -> QuerySet[RemoteLink]:
    """Remote links carrying a reason code (e.g. ``suspended_drift``)."""
    qs = RemoteLink.objects.filter(org_id=org_id)
    if link_key is not None:
        qs = qs.filter(link_key=link_key)
    return _with_reason(qs, reason_code).order_by("id")


def remote_links_of_effects_with_reason(*, org_id: str, reason_code: str | None = None) -> QuerySet[RemoteLink]:
    """The links (by ``link_key``) of effects quarantined with ``reason_code``: why PATCH was refused."""
    lanes = _with_reason(RemoteEffect.objects.filter(org_id=org_id), reason_code).values("dispatch_lane")
    return RemoteLink.objects.filter(org_id=org_id, link_key__in=lanes).order_by("id")


def remote_effects_blocking_lane(*, org_id: str, reason_code: str | None = None) -> QuerySet[RemoteEffect]:
    """Quarantined effects that block the lane of effects carrying ``reason_code``.

    For ``prior_create_unresolved``: the earlier quarantined creates of the same
    link key, which must be resolved first.
    """
    held = _with_reason(RemoteEffect.objects.filter(org_id=org_id), reason_code)
    blocked = held.values("dispatch_lane")
    return (RemoteEffect.objects.filter(org_id=org_id, state="quarantined", dispatch_lane__in=blocked)
            .exclude(pk__in=held.values("pk")).order_by("dispatch_lane", "lane_sequence", "id"))
