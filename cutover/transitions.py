"""Cutover state machines (seed 003 "Compressed durable model", CutoverDecision).

No CutoverDecision state needs a reason code (``reason_required``): the
decision records which way the attempt went; the halted gates carry
``cutover_in_progress`` (``cutover/reasons.py``).
"""
from nexusflow.kernel.transitions import machine

CUTOVER_DECISION = machine(
    "cutover.CutoverDecision",
    {
        "rollback_open": {"activating_v2", "restoring_v1"},
        "activating_v2": {"v2_committed"},
        "restoring_v1": {"v1_restored"},
        "v2_committed": set(),
        "v1_restored": set(),
    },
    initial={"rollback_open"},
    seed='Seed 003, "Compressed durable model" (external L2 CutoverDecision)',
)

RESTORE_ATTEMPT = machine(
    "cutover.RestoreAttempt",
    {
        "isolated": {"loading"},
        "loading": {"verified"},
        "verified": {"completed"},
        "completed": set(),
    },
    initial={"isolated"},
    seed='Seed 003, "Compressed durable model" (external L2 RestoreAttempt) and "Transaction and crash rules"',
)
