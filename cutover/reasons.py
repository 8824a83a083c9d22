"""Cutover reason codes (closed set; see :mod:`nexusflow.kernel.reasons`).

The cutover coordinator owns why an AccountServingGate is not serving while a
cutover walks it ``halting_v1 -> v1_stopped -> v1_drained -> v2_validating``
(seed 003 "Offline V1 shutdown, cold rollback, and V2 cutover"); the gate
states are listed in ``connectors/transitions.py``.
"""
from nexusflow.kernel.reasons import ATTENTION, register

OWNER = "cutover"

CUTOVER_IN_PROGRESS = register(
    "cutover_in_progress", owner=OWNER, evidence="cutover.selectors.gates_halted_for_cutover",
    severity_class=ATTENTION, alert_after_seconds=3600, remediations=("resume_cutover",))

# --- preflight refusals (seed 003 "Operational liveness and maintenance admission") -------------
#: Each is stored in the ``blockers`` of a ``preflight_refusal`` CutoverEvidence row; nothing entered maintenance.
ROUTE_MIGRATION_UNSUPPORTED = register(
    "route_migration_unsupported", owner=OWNER, evidence="cutover.selectors.preflight_refusals",
    severity_class=ATTENTION, alert_after_seconds=86400, remediations=("revise_cutover_plan",))
ROUTE_HALT_CONTRACT_MISSING = register(
    "route_halt_contract_missing", owner=OWNER, evidence="cutover.selectors.preflight_refusals",
    severity_class=ATTENTION, alert_after_seconds=86400, remediations=("revise_cutover_plan",))
READINESS_INPUT_INCOMPLETE = register(
    "readiness_input_incomplete", owner=OWNER, evidence="cutover.selectors.preflight_refusals",
    severity_class=ATTENTION, alert_after_seconds=86400, remediations=("revise_cutover_plan",))
CUTOVER_BUDGET_EXCEEDED = register(
    "cutover_budget_exceeded", owner=OWNER, evidence="cutover.selectors.preflight_refusals",
    severity_class=ATTENTION, alert_after_seconds=86400, remediations=("revise_cutover_plan",))
V1_EFFECT_UNRESOLVED = register(
    "v1_effect_unresolved", owner=OWNER, evidence="cutover.selectors.preflight_refusals",
    severity_class=ATTENTION, alert_after_seconds=3600, remediations=("operator_reconcile", "revise_cutover_plan"))

# --- V1 drain, stop and shutdown certification (seed 003 "Offline V1 shutdown ...", steps 2-5) ---------
#: Blockers of ``cutover drain``, ``stop`` and ``certify``, each stored in the ``blockers`` of a ``shutdown_blocked``
#: CutoverEvidence row and reported with exit 3; a blocker is resolved by its owner, never relabeled away.
V1_WORK_OPEN = register(
    "v1_work_open", owner=OWNER, evidence="cutover.selectors.shutdown_blocks",
    severity_class=ATTENTION, alert_after_seconds=3600, remediations=("automatic_retry", "resume_cutover"))
V1_LEASE_LIVE = register(
    "v1_lease_live", owner=OWNER, evidence="cutover.selectors.shutdown_blocks",
    severity_class=ATTENTION, alert_after_seconds=3600, remediations=("automatic_retry", "resume_cutover"))
V1_GENERATION_LIVE = register(
    "v1_generation_live", owner=OWNER, evidence="cutover.selectors.shutdown_blocks",
    severity_class=ATTENTION, alert_after_seconds=1800, remediations=("resume_cutover",))
V1_EGRESS_NOT_ISOLATED = register(
    "v1_egress_not_isolated", owner=OWNER, evidence="cutover.selectors.shutdown_blocks",
    severity_class=ATTENTION, alert_after_seconds=1800, remediations=("resume_cutover",))
V1_EGRESS_MANIFEST_INCOMPLETE = register(
    "v1_egress_manifest_incomplete", owner=OWNER, evidence="cutover.selectors.shutdown_blocks",
    severity_class=ATTENTION, alert_after_seconds=3600, remediations=("revise_cutover_plan",))
V1_IDENTITY_CONFLICT = register(
    "v1_identity_conflict", owner=OWNER, evidence="cutover.selectors.shutdown_blocks",
    severity_class=ATTENTION, alert_after_seconds=3600, remediations=("revise_cutover_plan",))
V1_BASELINE_MISSING = register(
    "v1_baseline_missing", owner=OWNER, evidence="cutover.selectors.shutdown_blocks",
    severity_class=ATTENTION, alert_after_seconds=3600, remediations=("revise_cutover_plan",))

V1_RELEASE_MISMATCH = register(
    "v1_release_mismatch", owner=OWNER, evidence="cutover.selectors.shutdown_blocks",
    severity_class=ATTENTION, alert_after_seconds=1800, remediations=("revise_cutover_plan",))

# --- V1 restore point (seed 003 "Offline V1 shutdown ...", step 6; proof S003-RP-43) -------------------------
#: Refusals of ``cutover restore-point``, each stored in the ``blockers`` of a ``shutdown_blocked`` CutoverEvidence
#: row (phase ``restore_point``) and reported with exit 3; no V1RestorePoint is written and no V2 mutation may start.
RESTORE_POINT_NOT_DRAINED = register(
    "restore_point_not_drained", owner=OWNER, evidence="cutover.selectors.shutdown_blocks",
    severity_class=ATTENTION, alert_after_seconds=1800, remediations=("resume_cutover",))
RESTORE_POINT_V2_MUTATED = register(
    "restore_point_v2_mutated", owner=OWNER, evidence="cutover.selectors.shutdown_blocks",
    severity_class=ATTENTION, alert_after_seconds=600, remediations=("inspect_invariant",))
RESTORE_POINT_BACKUP_INVALID = register(
    "restore_point_backup_invalid", owner=OWNER, evidence="cutover.selectors.shutdown_blocks",
    severity_class=ATTENTION, alert_after_seconds=1800, remediations=("resume_cutover",))
RESTORE_POINT_REHEARSAL_FAILED = register(
    "restore_point_rehearsal_failed", owner=OWNER, evidence="cutover.selectors.shutdown_blocks",
    severity_class=ATTENTION, alert_after_seconds=1800, remediations=("resume_cutover", "inspect_invariant"))
RESTORE_POINT_DRIFT = register(
    "restore_point_drift", owner=OWNER, evidence="cutover.selectors.shutdown_blocks",
    severity_class=ATTENTION, alert_after_seconds=600, remediations=("inspect_invariant", "resume_cutover"))

# --- full V1 restore (seed 003 "Offline V1 shutdown ...", the full restore; proofs S003-RP-44, -45, -50) ---------
#: Refusals of ``cutover restore`` (exit 3), recorded in the RestoreAttempt's ``evidence.refusal`` (control
#: database) once the attempt exists; a refusal before the load leaves the main database untouched.
RESTORE_POINT_MISSING = register(
    "restore_point_missing", owner=OWNER, evidence="cutover.selectors.restore_attempts",
    severity_class=ATTENTION, alert_after_seconds=1800, remediations=("resume_cutover",))
RESTORE_FORWARD_ONLY = register(
    "restore_forward_only", owner=OWNER, evidence="cutover.selectors.restore_attempts",
    severity_class=ATTENTION, alert_after_seconds=600, remediations=("inspect_invariant",))
RESTORE_V2_SERVED = register(
    "restore_v2_served", owner=OWNER, evidence="cutover.selectors.restore_attempts",
    severity_class=ATTENTION, alert_after_seconds=600, remediations=("inspect_invariant",))
RESTORE_VERIFICATION_FAILED = register(
    "restore_verification_failed", owner=OWNER, evidence="cutover.selectors.restore_attempts",
    severity_class=ATTENTION, alert_after_seconds=600, remediations=("resume_cutover", "inspect_invariant"))
COLD_ABORT_NOT_DRAINED = register(
    "cold_abort_not_drained", owner=OWNER, evidence="cutover.selectors.shutdown_blocks",
    severity_class=ATTENTION, alert_after_seconds=1800, remediations=("resume_cutover",))
COLD_ABORT_V2_MUTATED = register(
    "cold_abort_v2_mutated", owner=OWNER, evidence="cutover.selectors.shutdown_blocks",
    severity_class=ATTENTION, alert_after_seconds=600, remediations=("resume_cutover", "inspect_invariant"))

# --- V1 push link adoption at certify (seed 002 "Migration Contract For #1783"; issue 21 item 5) -------------
#: A V1 record whose remote-id mirror and provenance marker prove no one link: no RemoteLink is created, the
#: refusal is listed in the V1ShutdownCertificate's ``link_adoption`` and one ``link_adoption_refused`` evidence
#: row, and V2 refuses to create for the record (``legacy_remote_id_unlinked``) until an operator decides.
V1_LINK_MULTIPLE_CANDIDATES = register(
    "v1_link_multiple_candidates", owner=OWNER, evidence="cutover.selectors.link_adoption_refusals",
    severity_class=ATTENTION, alert_after_seconds=86400, remediations=("operator_reconcile",))
V1_LINK_PROVENANCE_WITHOUT_REMOTE_ID = register(
    "v1_link_provenance_without_remote_id", owner=OWNER, evidence="cutover.selectors.link_adoption_refusals",
    severity_class=ATTENTION, alert_after_seconds=86400, remediations=("operator_reconcile",))
V1_LINK_REMOTE_ID_OUTSIDE_FIELD_PAIR = register(
    "v1_link_remote_id_outside_field_pair", owner=OWNER, evidence="cutover.selectors.link_adoption_refusals",
    severity_class=ATTENTION, alert_after_seconds=86400, remediations=("operator_reconcile",))
V1_LINK_PROVENANCE_MISSING = register(
    "v1_link_provenance_missing", owner=OWNER, evidence="cutover.selectors.link_adoption_refusals",
    severity_class=ATTENTION, alert_after_seconds=86400, remediations=("operator_reconcile",))
V1_LINK_ACTION_SLOT_UNMAPPED = register(
    "v1_link_action_slot_unmapped", owner=OWNER, evidence="cutover.selectors.link_adoption_refusals",
    severity_class=ATTENTION, alert_after_seconds=86400, remediations=("operator_reconcile",))
V1_LINK_DESTINATION_DRIFT = register(
    "v1_link_destination_drift", owner=OWNER, evidence="cutover.selectors.link_adoption_refusals",
    severity_class=ATTENTION, alert_after_seconds=86400, remediations=("operator_reconcile",))
V1_LINK_PROVENANCE_MISMATCH = register(
    "v1_link_provenance_mismatch", owner=OWNER, evidence="cutover.selectors.link_adoption_refusals",
    severity_class=ATTENTION, alert_after_seconds=86400, remediations=("operator_reconcile",))
V1_LINK_CONFLICT = register(
    "v1_link_conflict", owner=OWNER, evidence="cutover.selectors.link_adoption_refusals",
    severity_class=ATTENTION, alert_after_seconds=86400, remediations=("operator_reconcile",))
V1_LINK_REMOTE_ID_CLAIMED = register(
    "v1_link_remote_id_claimed", owner=OWNER, evidence="cutover.selectors.link_adoption_refusals",
    severity_class=ATTENTION, alert_after_seconds=86400, remediations=("operator_reconcile",))
