"""V1 runtime reads (support views, evidence selectors, open-work counts); no writes.

Seed 003 "V1 concepts to retire" and "Operational liveness and maintenance admission".
"""
from __future__ import annotations

from django.db.models import QuerySet

from connectors.v1.models import V1Event, V1ProviderCall

#: V1 event states a worker still has to move on.
OPEN_EVENT_STATES = ("pending", "running", "handed_off")
#: V1 provider-call states whose I/O is not settled (prepared rows may still be sent).
OPEN_CALL_STATES = ("prepared", "sending")


def v1_events_with_reason(*, org_id: str, reason_code: str | None = None) -> QuerySet[V1Event]:
    """V1 events of ``org_id`` carrying a reason code (or exactly ``reason_code``), newest first."""
    qs = V1Event.objects.filter(org_id=org_id).exclude(reason_code="")
    if reason_code is not None:
        qs = qs.filter(reason_code=reason_code)
    return qs.order_by("-id")


def v1_provider_calls_with_reason(*, org_id: str, reason_code: str | None = None) -> QuerySet[V1ProviderCall]:
    """V1 provider calls of ``org_id`` carrying a reason code (or exactly ``reason_code``), newest first."""
    qs = V1ProviderCall.objects.filter(org_id=org_id).exclude(reason_code="")
    if reason_code is not None:
        qs = qs.filter(reason_code=reason_code)
    return qs.order_by("-id")


def v1_events_open_count() -> int:
    """V1 events (all orgs) in ``pending``, ``running`` or ``handed_off``: the V1 drain is not done."""
    return V1Event.objects.filter(state__in=OPEN_EVENT_STATES).count()


def v1_calls_unsettled_count() -> int:
    """V1 provider calls (all orgs) that are ``prepared``, ``sending`` or ``ambiguous``: I/O not proven settled."""
    return V1ProviderCall.objects.filter(state__in=(*OPEN_CALL_STATES, "ambiguous")).count()
