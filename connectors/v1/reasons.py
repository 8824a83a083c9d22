"""V1 runtime reason codes (closed set; owner ``connectors``; see :mod:`nexusflow.kernel.reasons`).

| row / state | codes |
| --- | --- |
| V1Event ``quarantined`` | the inbound item codes of :mod:`connectors.reasons` (ITEM_*) |
| V1Event ``failed`` | V1_RETRY_EXHAUSTED, V1_HANDOFF_REJECTED |
| V1ProviderCall ``refused`` | DEFINITE_REFUSAL (connectors), V1_NO_LINKED_REMOTE |
| V1ProviderCall ``ambiguous`` | RESPONSE_AMBIGUOUS, UNCLASSIFIED_RESPONSE (connectors) |

Seed 003 "Operational liveness and maintenance admission"; imported by ``connectors/reasons.py``.
"""
from nexusflow.kernel.reasons import ATTENTION, register

OWNER = "connectors"
_S = "connectors.v1.selectors."

V1_RETRY_EXHAUSTED = register(
    "v1_retry_exhausted", owner=OWNER, evidence=_S + "v1_events_with_reason",
    severity_class=ATTENTION, alert_after_seconds=3600, remediations=("operator_reconcile",))
V1_HANDOFF_REJECTED = register(
    "v1_handoff_rejected", owner=OWNER, evidence=_S + "v1_events_with_reason",
    severity_class=ATTENTION, alert_after_seconds=3600, remediations=("operator_reconcile",))
#: A V1 push asked for a record with no remote id in its mirror field: V1 never creates (seed 002 "Scope").
V1_NO_LINKED_REMOTE = register(
    "v1_no_linked_remote", owner=OWNER, evidence=_S + "v1_provider_calls_with_reason",
    severity_class=ATTENTION, alert_after_seconds=86400, remediations=("relink_or_retire",))
#: The provider proved it performed nothing (a refused connect, a declared not-performed status); V1 does not retry.
V1_NOT_PERFORMED = register(
    "v1_not_performed", owner=OWNER, evidence=_S + "v1_provider_calls_with_reason",
    severity_class=ATTENTION, alert_after_seconds=3600, remediations=("automatic_retry",))
