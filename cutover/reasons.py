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
