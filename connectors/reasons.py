"""Connector reason codes (closed set; see ``nexusflow.kernel.reasons``)."""
from nexusflow.kernel.reasons import register

register("item_not_object", owner="connectors", evidence="ReceiptComponent where reason_code=item_not_object",
         alert_after_seconds=86400, remediation="fix the sender; the rest of the batch was admitted")
register("item_kind_unsupported", owner="connectors", evidence="ReceiptComponent where reason_code=item_kind_unsupported",
         alert_after_seconds=86400, remediation="enable a route for the kind or ignore it")
register("item_schema_invalid", owner="connectors", evidence="ReceiptComponent where reason_code=item_schema_invalid",
         alert_after_seconds=86400, remediation="fix the sender; replay through an operator ReplayRequest")
register("item_identity_invalid", owner="connectors", evidence="ReceiptComponent where reason_code=item_identity_invalid",
         alert_after_seconds=86400, remediation="fix the sender; locators must be canonical")
register("superseded_by_newer_position", owner="connectors", evidence="OrderingDecision by lane",
         alert_after_seconds=0, remediation="none: a newer source position won")
register("mapping_produced_no_body", owner="connectors", evidence="RemoteEffect.reason_code",
         alert_after_seconds=3600, remediation="fix the pack mapping or the record, then author a new intent")
register("link_not_patchable", owner="connectors", evidence="RemoteLink.state for the effect's link_key",
         alert_after_seconds=3600, remediation="reconcile or retire the link")
register("definite_refusal", owner="connectors", evidence="RemoteEffectAttempt.response_status",
         alert_after_seconds=3600, remediation="fix the request cause and author a new intent")
register("retry_exhausted", owner="connectors", evidence="RemoteEffectAttempt rows of the effect",
         alert_after_seconds=3600, remediation="operator reconciliation of the uncertain effect")
register("response_id_missing", owner="connectors", evidence="RemoteEffectAttempt.response_body",
         alert_after_seconds=600, remediation="operator reconciliation: the remote effect may exist")
register("holder_abandoned", owner="connectors", evidence="DispatchPermit.closed_evidence",
         alert_after_seconds=600, remediation="automatic: idempotent repeat or reconciliation")
register("unclassified_response", owner="connectors", evidence="RemoteEffectAttempt.response_status",
         alert_after_seconds=600, remediation="operator reconciliation; classify the status in the pack contract")
register("prior_create_unresolved", owner="connectors", evidence="quarantined RemoteEffect of the same link_key",
         alert_after_seconds=600, remediation="resolve the earlier quarantined create, then author a new intent")
