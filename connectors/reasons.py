"""Connector reason codes (closed set; see :mod:`nexusflow.kernel.reasons`).

Which row carries which code (seed 003 "Operational liveness and maintenance
admission"; the states are listed in ``connectors/transitions.py``):

| row / state | codes |
| --- | --- |
| ReceiptComponent ``quarantined`` | ITEM_NOT_OBJECT, ITEM_KIND_UNSUPPORTED, ITEM_SCHEMA_INVALID, ITEM_IDENTITY_INVALID, SOURCE_GAP_REPORTED |
| Execution ``superseded`` | SUPERSEDED_BY_NEWER_POSITION |
| Execution ``quarantined`` | SOURCE_SEQUENCE_GAP (strict gap past its frozen deadline, disposition ``quarantine``) |
| ServingEpoch ``rejected`` | EPOCH_OWNER_MISMATCH |
| RemoteEffect ``uncertain`` | RESPONSE_AMBIGUOUS, RESPONSE_ID_MISSING, UNCLASSIFIED_RESPONSE, HOLDER_ABANDONED, REMOTE_LOCATOR_CONFLICT, CREATE_CONFLICT_EXISTING |
| RemoteEffect ``no_effect`` | DEFINITE_REFUSAL, RETRY_EXHAUSTED, OPERATOR_PROVED_NO_EFFECT |
| RemoteEffect ``quarantined`` | RETRY_EXHAUSTED, LINK_NOT_PATCHABLE, PRIOR_CREATE_UNRESOLVED, OPERATOR_QUARANTINE, SUPERSEDED_BY_NEWER_VERSION, SOURCE_DELETED_BEFORE_POST, SLOT_LINEAGE_UNRESOLVED, STABLE_SLOT_UNRESOLVED, MAPPING_DRIFT, AUTHORITY_DENIED, ASSOCIATION_SNAPSHOT_MISSING, ASSOCIATION_TARGET_UNRESOLVED, CREATE_CONFLICT_IDENTITY_MISMATCH, CREATE_CONFLICT_CANDIDATE_GONE, CREATE_CONFLICT_CANDIDATE_LINKED |
| CredentialGenerationDispatchGate ``revoked`` | CREDENTIAL_REVOKED |
| RemoteLink ``suspended_drift`` | REMOTE_NOT_FOUND, LINK_DRIFT, SLOT_LINEAGE_UNRESOLVED, REMOTE_CONFLICT, REMOTE_LOCATOR_CONFLICT, SOURCE_DELETED |
| AccountServingGate ``halting_v2`` / ``v2_halted`` | HALTED_FOR_SUCCESSOR, HALT_WAITING_OPEN_PERMITS, HALT_WAITING_PREDECESSOR_WORK |

Severity classes: SUPERSEDED_BY_NEWER_POSITION and SUPERSEDED_BY_NEWER_VERSION are ``benign`` (a newer
position or version won; nothing to do, no alert); every other code is ``attention``.
"""
from nexusflow.kernel.reasons import ATTENTION, BENIGN, register

OWNER = "connectors"
_S = "connectors.selectors."

# --- inbound items (ReceiptComponent) ------------------------------------------
ITEM_NOT_OBJECT = register(
    "item_not_object", owner=OWNER, evidence=_S + "receipt_components_quarantined",
    severity_class=ATTENTION, alert_after_seconds=86400, remediations=("fix_sender_and_replay",))
ITEM_KIND_UNSUPPORTED = register(
    "item_kind_unsupported", owner=OWNER, evidence=_S + "receipt_components_quarantined",
    severity_class=ATTENTION, alert_after_seconds=86400, remediations=("fix_sender_and_replay", "fix_pack_mapping"))
ITEM_SCHEMA_INVALID = register(
    "item_schema_invalid", owner=OWNER, evidence=_S + "receipt_components_quarantined",
    severity_class=ATTENTION, alert_after_seconds=86400, remediations=("fix_sender_and_replay",))
ITEM_IDENTITY_INVALID = register(
    "item_identity_invalid", owner=OWNER, evidence=_S + "receipt_components_quarantined",
    severity_class=ATTENTION, alert_after_seconds=86400, remediations=("fix_sender_and_replay",))
SOURCE_GAP_REPORTED = register(
    "source_gap_reported", owner=OWNER, evidence=_S + "receipt_components_quarantined",
    severity_class=ATTENTION, alert_after_seconds=3600, remediations=("resync_from_source",))

# --- source ordering (Execution) -------------------------------------------------
SUPERSEDED_BY_NEWER_POSITION = register(
    "superseded_by_newer_position", owner=OWNER, evidence=_S + "ordering_decisions_superseded",
    severity_class=BENIGN, alert_after_seconds=0, remediations=("none",))

#: A strict source gap past its frozen deadline quarantines the Execution: an operator must decide (alerts
#: after an hour, as the sibling ``source_gap_reported`` does).
SOURCE_SEQUENCE_GAP = register(
    "source_sequence_gap", owner=OWNER, evidence=_S + "executions_with_reason",
    severity_class=ATTENTION, alert_after_seconds=3600, remediations=("operator_reconcile", "fix_sender_and_replay"))

# --- serving generations (ServingEpoch) -----------------------------------------
EPOCH_OWNER_MISMATCH = register(
    "epoch_owner_mismatch", owner=OWNER, evidence=_S + "serving_epochs_with_reason",
    severity_class=ATTENTION, alert_after_seconds=3600, remediations=("reprepare_epoch",))

# --- outbound effects (RemoteEffect, RemoteLink) ----------------------------------
RESPONSE_AMBIGUOUS = register(
    "response_ambiguous", owner=OWNER, evidence=_S + "remote_effect_attempts_for_reason",
    severity_class=ATTENTION, alert_after_seconds=3600, remediations=("automatic_retry", "operator_reconcile"))
RESPONSE_ID_MISSING = register(
    "response_id_missing", owner=OWNER, evidence=_S + "remote_effect_attempts_for_reason",
    severity_class=ATTENTION, alert_after_seconds=600, remediations=("operator_reconcile",))
UNCLASSIFIED_RESPONSE = register(
    "unclassified_response", owner=OWNER, evidence=_S + "remote_effect_attempts_for_reason",
    severity_class=ATTENTION, alert_after_seconds=600, remediations=("operator_reconcile", "fix_pack_mapping"))
HOLDER_ABANDONED = register(
    "holder_abandoned", owner=OWNER, evidence=_S + "dispatch_permits_abandoned",
    severity_class=ATTENTION, alert_after_seconds=600, remediations=("automatic_retry", "operator_reconcile"))
DEFINITE_REFUSAL = register(
    "definite_refusal", owner=OWNER, evidence=_S + "remote_effect_attempts_for_reason",
    severity_class=ATTENTION, alert_after_seconds=3600, remediations=("reauthor_intent",))
RETRY_EXHAUSTED = register(
    "retry_exhausted", owner=OWNER, evidence=_S + "remote_effect_attempts_for_reason",
    severity_class=ATTENTION, alert_after_seconds=3600, remediations=("operator_reconcile",))
LINK_NOT_PATCHABLE = register(
    "link_not_patchable", owner=OWNER, evidence=_S + "remote_links_of_effects_with_reason",
    severity_class=ATTENTION, alert_after_seconds=3600, remediations=("relink_or_retire",))
PRIOR_CREATE_UNRESOLVED = register(
    "prior_create_unresolved", owner=OWNER, evidence=_S + "remote_effects_blocking_lane",
    severity_class=ATTENTION, alert_after_seconds=600, remediations=("resolve_prior_create",))
REMOTE_NOT_FOUND = register(
    "remote_not_found", owner=OWNER, evidence=_S + "remote_links_with_reason",
    severity_class=ATTENTION, alert_after_seconds=3600, remediations=("relink_or_retire",))

# --- seed 002 push protocol (connectors/links/push_rules.py) ------------------------------------
#: An older record version whose PATCH finds this version or a newer one already at the provider: stored as
#: RemoteEffect ``quarantined`` (the seed's state machine), nothing sent, a Runtime ``superseded`` receipt.
#: Benign: the provider holds the right values.
SUPERSEDED_BY_NEWER_VERSION = register(
    "superseded_by_newer_version", owner=OWNER, evidence=_S + "remote_effects_with_reason",
    severity_class=BENIGN, alert_after_seconds=0, remediations=("none",))
SOURCE_DELETED_BEFORE_POST = register(
    "source_deleted_before_post", owner=OWNER, evidence=_S + "remote_effects_with_reason",
    severity_class=ATTENTION, alert_after_seconds=86400, remediations=("resolve_prior_create",))
#: A create candidate for a record of an org that ran V1 whose remote-id mirror (or provenance marker) holds a
#: value no RemoteLink of the key proves: the V1 link adoption refused it, so V2 never guesses and never POSTs
#: (seed 002 "Migration Contract For #1783"); an operator binds it with ``push_links adopt``.
LEGACY_REMOTE_ID_UNLINKED = register(
    "legacy_remote_id_unlinked", owner=OWNER, evidence=_S + "remote_effects_with_reason",
    severity_class=ATTENTION, alert_after_seconds=86400, remediations=("operator_reconcile",))
SLOT_LINEAGE_UNRESOLVED = register(
    "slot_lineage_unresolved", owner=OWNER, evidence=_S + "remote_links_of_record_lineage",
    severity_class=ATTENTION, alert_after_seconds=600, remediations=("relink_or_retire",))
STABLE_SLOT_UNRESOLVED = register(
    "stable_slot_unresolved", owner=OWNER, evidence=_S + "remote_effects_with_reason",
    severity_class=ATTENTION, alert_after_seconds=600, remediations=("fix_pack_mapping",))
LINK_DRIFT = register(
    "link_drift", owner=OWNER, evidence=_S + "remote_link_evidence_for_reason",
    severity_class=ATTENTION, alert_after_seconds=600, remediations=("relink_or_retire",))
MAPPING_DRIFT = register(
    "mapping_drift", owner=OWNER, evidence=_S + "remote_links_of_effects_with_reason",
    severity_class=ATTENTION, alert_after_seconds=3600, remediations=("revalidate_link_mapping",))
AUTHORITY_DENIED = register(
    "authority_denied", owner=OWNER, evidence=_S + "remote_effects_with_reason",
    severity_class=ATTENTION, alert_after_seconds=3600, remediations=("reauthor_intent",))
REMOTE_CONFLICT = register(
    "remote_conflict", owner=OWNER, evidence=_S + "remote_link_evidence_for_reason",
    severity_class=ATTENTION, alert_after_seconds=3600, remediations=("relink_or_retire",))
REMOTE_LOCATOR_CONFLICT = register(
    "remote_locator_conflict", owner=OWNER, evidence=_S + "remote_link_evidence_for_reason",
    severity_class=ATTENTION, alert_after_seconds=600, remediations=("relink_or_retire",))
SOURCE_DELETED = register(
    "source_deleted", owner=OWNER, evidence=_S + "remote_link_evidence_for_reason",
    severity_class=ATTENTION, alert_after_seconds=86400, remediations=("relink_or_retire",))
ASSOCIATION_SNAPSHOT_MISSING = register(
    "association_snapshot_missing", owner=OWNER, evidence=_S + "remote_effects_with_reason",
    severity_class=ATTENTION, alert_after_seconds=600, remediations=("reauthor_intent",))
ASSOCIATION_TARGET_UNRESOLVED = register(
    "association_target_unresolved", owner=OWNER, evidence=_S + "remote_effects_with_reason",
    severity_class=ATTENTION, alert_after_seconds=3600, remediations=("reauthor_intent",))

# --- create-conflict recovery (connectors/contracts/create_conflict_recovery.py) -----------------------------------
#: A create was refused because its identity already exists remotely; the answer named a candidate id.
#: Parked for the reconciler's verify read (never a second create).
CREATE_CONFLICT_EXISTING = register(
    "create_conflict_existing", owner=OWNER, evidence=_S + "remote_effect_evidence_for_reason",
    severity_class=ATTENTION, alert_after_seconds=600, remediations=("automatic_retry", "operator_reconcile"))
#: The verify read of the candidate shows a record whose identity differs from the frozen create request.
CREATE_CONFLICT_IDENTITY_MISMATCH = register(
    "create_conflict_identity_mismatch", owner=OWNER, evidence=_S + "remote_effect_evidence_for_reason",
    severity_class=ATTENTION, alert_after_seconds=3600, remediations=("operator_reconcile",))
#: The candidate the create conflict named does not exist (404/410) when read back.
CREATE_CONFLICT_CANDIDATE_GONE = register(
    "create_conflict_candidate_gone", owner=OWNER, evidence=_S + "remote_effect_evidence_for_reason",
    severity_class=ATTENTION, alert_after_seconds=3600, remediations=("operator_reconcile",))
#: The verified candidate is already another local record's linked remote record (two local records, one
#: remote identity): never linked twice, and the other record's link is left as it is; an operator decides.
CREATE_CONFLICT_CANDIDATE_LINKED = register(
    "create_conflict_candidate_linked", owner=OWNER, evidence=_S + "remote_effect_evidence_for_reason",
    severity_class=ATTENTION, alert_after_seconds=3600, remediations=("operator_reconcile",))

OPERATOR_PROVED_NO_EFFECT = register(
    "operator_proved_no_effect", owner=OWNER, evidence=_S + "remote_effect_evidence_for_reason",
    severity_class=ATTENTION, alert_after_seconds=86400, remediations=("authorize_successor_effect",))
OPERATOR_QUARANTINE = register(
    "operator_quarantine", owner=OWNER, evidence=_S + "remote_effect_evidence_for_reason",
    severity_class=ATTENTION, alert_after_seconds=3600, remediations=("operator_reconcile",))

# --- credential dispatch gates (CredentialGenerationDispatchGate; connectors/serving/credential_gates.py) ----
CREDENTIAL_REVOKED = register(
    "credential_revoked", owner=OWNER, evidence=_S + "credential_gates_with_reason",
    severity_class=ATTENTION, alert_after_seconds=3600, remediations=("reenable_credential_generation", "publish_credential_generation"))

#: Quarantine reasons of a create refused by a seed 002 "Before POST" gate (no Attempt, so no I/O).
REFUSED_BEFORE_POST = frozenset({SOURCE_DELETED_BEFORE_POST, SLOT_LINEAGE_UNRESOLVED, STABLE_SLOT_UNRESOLVED,
                                 PRIOR_CREATE_UNRESOLVED, AUTHORITY_DENIED, ASSOCIATION_SNAPSHOT_MISSING,
                                 ASSOCIATION_TARGET_UNRESOLVED})

#: Effect reasons that settle as a Runtime ``no_effect`` result (seed 000 "A validated NO_EFFECT resource
#: result"): the frozen profile classified every Attempt's answer as a definite refusal or as not
#: performed. An operator's proof after an ambiguous Attempt is not among them (its Runtime result is
#: ``quarantined``), nor is any timeout, lease expiry, ambiguous or partial outcome.
NO_EFFECT_REASONS = frozenset({DEFINITE_REFUSAL, RETRY_EXHAUSTED})

#: Uncertain effects that only an operator may move on (the reconciler skips them).
OPERATOR_ONLY_UNCERTAIN = frozenset({UNCLASSIFIED_RESPONSE, RESPONSE_ID_MISSING, REMOTE_LOCATOR_CONFLICT})

# --- halt and successor epochs (AccountServingGate, OrderingHandoff; connectors/serving/handoff.py) ----------
HALTED_FOR_SUCCESSOR = register(
    "halted_for_successor", owner=OWNER, evidence=_S + "gates_with_reason",
    severity_class=ATTENTION, alert_after_seconds=3600, remediations=("complete_successor_switch",))
HALT_WAITING_OPEN_PERMITS = register(
    "halt_waiting_open_permits", owner=OWNER, evidence=_S + "open_permits_of_halting_gates",
    severity_class=ATTENTION, alert_after_seconds=600, remediations=("automatic_retry", "complete_successor_switch"))
HALT_WAITING_PREDECESSOR_WORK = register(
    "halt_waiting_predecessor_work", owner=OWNER, evidence=_S + "gates_with_reason",
    severity_class=ATTENTION, alert_after_seconds=600, remediations=("automatic_retry", "complete_successor_switch"))

# --- the V1 runtime being retired (connectors/v1) ----------------------------------
#: V1Event ``failed``: V1_RETRY_EXHAUSTED, V1_HANDOFF_REJECTED; V1Event ``quarantined``: the ITEM_* codes;
#: V1ProviderCall ``refused``: DEFINITE_REFUSAL, V1_NOT_PERFORMED; ``ambiguous``: RESPONSE_AMBIGUOUS,
#: UNCLASSIFIED_RESPONSE. V1_NO_LINKED_REMOTE is the code of a V1 push refused before any row or I/O.
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
