"""Runtime state machines as data.

OutboundCommand, ApplicationResult and IntentResultReceipt are immutable
facts; only transport delivery of the outbox message has a lifecycle. An
InboxAcceptance is inserted ``accepted`` or ``rejected`` and never moves.
No state here needs a reason code (``reason_required``): a quarantined or
no-effect intent receipt copies the RemoteEffect's code into its evidence.
"""
from nexusflow.kernel.transitions import machine

OUTBOX_MESSAGE = machine(
    "runtime_outbox.OutboxMessage",
    # reconciling: a flow.effect.submit message whose delivery budget is spent, waiting for the owner's
    # RejectIfUnaccepted answer; handoff_rejected / dead_lettered commit only with the Flow's own transition
    # (seed 004 section 15.4; runtime_outbox/handoff.py).
    {"pending": {"delivered", "reconciling"}, "reconciling": {"delivered", "handoff_rejected", "dead_lettered"},
     "delivered": set(), "handoff_rejected": set(), "dead_lettered": set()},
    initial={"pending"},
    seed='ARCHITECTURE.md section 4; seed 004 section 10.7',
)

INBOX_ACCEPTANCE = machine(
    "runtime_outbox.InboxAcceptance",
    #: ``accepted``: the consumer's record committed with this row; ``rejected``: the RejectIfUnaccepted
    #: tombstone, proof that no acceptance committed and that none ever will (seed 004 section 10.7).
    {"accepted": set(), "rejected": set()},
    initial={"accepted", "rejected"},
    seed="seed 004 sections 10.7 and 15.4",
)

APPLICATION_RESULT_OUTCOMES = frozenset({"applied", "noop", "rejected", "failed"})
#: ``superseded``: nothing was sent because this record version, or a newer one, already reached the
#: remote through the same link (seed 002 "Retry And Recovery Semantics" 2); the intent's goal holds.
INTENT_RESULT_OUTCOMES = frozenset({"finalized", "superseded", "no_effect", "quarantined"})
