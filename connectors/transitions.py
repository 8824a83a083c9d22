"""Connector V2 state machines as data (seed 003 "State machines").

``Execution.superseded`` is the terminal form of the append-only superseded
ordering decision of seed 003 "Durable source ordering": a lower or late
source position is recorded as superseded without calling Runtime.

States that store a reason code (``reason_required``; seed 003 "Operational
liveness and maintenance admission"; codes in ``connectors/reasons.py`` and
``cutover/reasons.py``):

| machine | reason_required | why |
| --- | --- | --- |
| AccountServingGate | halting_v1, v1_stopped, v1_drained, v2_validating, halting_v2, v2_halted | every state in which the account serves neither protocol is a halt; the code is cleared on serving again |
| ServingEpoch | rejected | a refused candidate |
| CredentialGenerationDispatchGate | revoked | dispatch halted for the credential |
| Execution | quarantined, superseded | halted, or decided without calling Runtime |
| ProjectionWindow | quarantined | a window that cannot be applied |
| RemoteEffect | uncertain, no_effect, quarantined | parked, refused, halted |
| RemoteLink | suspended_drift | PATCH authority halted |
| OrderingLane, OrderingHandoff, DispatchPermit, ExecutionAttempt, RemoteEffectAttempt, ExecutionDependency | none | lane hand-off is not a halt; an abandoned handoff is cited by the handoff that replaces it; Permits and attempts are evidence, their RemoteEffect / Execution carries the code |
| StreamCursor | none | a stopped poller is an operator pause that keeps its position, not a halt |
"""
from nexusflow.kernel.transitions import machine

SEED = 'Seed 003, "State machines"'

ACCOUNT_SERVING_GATE = machine(
    "connectors.AccountServingGate",
    {
        "v1_serving": {"halting_v1"},
        "halting_v1": {"v1_serving", "v1_stopped"},
        "v1_stopped": {"v1_drained"},
        "v1_drained": {"v1_serving", "v2_validating"},
        "v2_validating": {"v1_drained", "v2_serving"},
        "v2_serving": {"halting_v2"},
        "halting_v2": {"v2_halted"},
        "v2_halted": {"v2_serving"},
    },
    initial={"v1_serving"},
    seed=SEED,
    reason_required={"halting_v1", "v1_stopped", "v1_drained", "v2_validating", "halting_v2", "v2_halted"},
    # The cutover coordinator halts and walks gates with its own codes.
    reason_owners={"connectors", "cutover"},
)

SERVING_EPOCH = machine(
    "connectors.ServingEpoch",
    {
        "prepared": {"verified", "rejected"},
        "verified": {"active", "rejected"},
        "active": {"draining"},
        "draining": {"retired"},
        "retired": set(),
        "rejected": set(),
    },
    initial={"prepared"},
    seed=SEED,
    reason_required={"rejected"},
)

CREDENTIAL_DISPATCH_GATE = machine(
    "connectors.CredentialGenerationDispatchGate",
    {"enabled": {"revoked"}, "revoked": {"enabled"}},
    initial={"enabled"},
    seed=SEED,
    parked={"revoked"},
    reason_required={"revoked"},
)

EXECUTION = machine(
    "connectors.Execution",
    {
        "ready": {"waiting_dependency", "completed", "quarantined", "superseded"},
        "waiting_dependency": {"ready", "quarantined"},
        "completed": set(),
        "quarantined": set(),
        "superseded": set(),
    },
    initial={"ready"},
    seed=SEED + ' and "Durable source ordering"',
    reason_required={"quarantined", "superseded"},
)

ORDERING_LANE = machine(
    "connectors.OrderingLane",
    {"open": {"handed_off"}, "handed_off": set()},
    initial={"open"},
    seed='Seed 003, "Durable source ordering"',
)

ORDERING_HANDOFF = machine(
    "connectors.OrderingHandoff",
    {"frozen": {"activated", "abandoned"}, "activated": set(), "abandoned": set()},
    initial={"frozen"},
    seed='Seed 003, "Durable source ordering" (OrderingHandoff) and "Generation and replay"',
)

STREAM_CURSOR = machine(
    "connectors.StreamCursor",
    {"active": {"stopped"}, "stopped": {"active"}},
    initial={"active"},
    seed='Seed 003, "ingress owner can stop pollers and streams without advancing its durable cursor"',
)

REMOTE_EFFECT = machine(
    "connectors.RemoteEffect",
    {
        "prepared": {"dispatching", "quarantined"},
        "dispatching": {"remote_confirmed", "uncertain", "no_effect", "prepared"},
        "uncertain": {"remote_confirmed", "no_effect", "quarantined", "prepared"},
        "remote_confirmed": {"finalized"},
        "finalized": set(),
        "no_effect": set(),
        "quarantined": set(),
    },
    initial={"prepared"},
    seed=SEED,
    parked={"uncertain"},
    reason_required={"uncertain", "no_effect", "quarantined"},
)

DISPATCH_PERMIT = machine(
    "connectors.DispatchPermit",
    {
        "granted": {"sending", "abandoned"},
        "sending": {"returned", "abandoned"},
        "returned": set(),
        "abandoned": set(),
    },
    initial={"granted"},
    seed=SEED,
)

REMOTE_LINK = machine(
    "connectors.RemoteLink",
    {
        "active": {"retired", "suspended_drift"},
        "suspended_drift": {"active", "retired"},
        "retired": set(),
    },
    initial={"active"},
    seed='Seed 002, "Remote Link State"; seed 003 "State machines"',
    parked={"suspended_drift"},
    reason_required={"suspended_drift"},
)

EXECUTION_ATTEMPT = machine(
    "connectors.ExecutionAttempt",
    {"started": {"completed", "expired"}, "completed": set(), "expired": set()},
    initial={"started"},
    seed='Seed 003, "Inbound facts" (ExecutionAttempt)',
)

REMOTE_EFFECT_ATTEMPT = machine(
    "connectors.RemoteEffectAttempt",
    {"started": {"confirmed", "no_effect", "uncertain"}, "confirmed": set(), "no_effect": set(), "uncertain": set()},
    initial={"started"},
    seed='Seed 003, "Outbound facts" (Attempt evidence is immutable once settled)',
)

# ProjectionWindow and ExecutionDependency rows are written by
# connectors/inbound/windows.py and connectors/contracts/ordering.py. The barrier set is fixed
# here before its rows exist (tests/kernel/test_transition_pairs.py lists it as
# "table only" until a store claims it).

PROJECTION_WINDOW = machine(
    "connectors.ProjectionWindow",
    {"open": {"sealed", "quarantined"}, "sealed": set(), "quarantined": set()},
    initial={"open"},
    seed=SEED + ' (ProjectionWindow); "Inbound facts"',
    reason_required={"quarantined"},
)

EXECUTION_DEPENDENCY = machine(
    "connectors.ExecutionDependency",
    {"waiting": {"satisfied", "expired", "rejected"}, "satisfied": set(), "expired": set(), "rejected": set()},
    initial={"waiting"},
    seed=SEED + " (ExecutionDependency)",
)

SERVING_PUBLICATION_BARRIER_SET = machine(
    "connectors.ServingPublicationBarrierSet",
    {
        "acquiring": {"held", "released"},
        "held": {"activation_committed", "released"},
        "activation_committed": {"released"},
        "released": set(),
    },
    initial={"acquiring"},
    seed=SEED + " (ServingPublicationBarrierSet)",
)

# Seed 002 "Create Attempt State" is not a second lifecycle: ARCHITECTURE.md
# section 4 maps it onto RemoteEffect / DispatchPermit / RemoteLink. The table
# is kept as data so the mapping can be checked edge by edge
# (tests/kernel/test_push_attempt_projection.py) and shown by state_graph.
PUSH_ATTEMPT_STATUS = machine(
    "connectors.PushAttemptStatus",
    {
        "pending": {"processing", "terminal_failed"},
        "processing": {"post_sent", "writeback_pending", "ambiguous_remote_effect", "terminal_failed", "pending"},
        "post_sent": {"writeback_pending", "ambiguous_remote_effect", "terminal_failed"},
        "ambiguous_remote_effect": {"writeback_pending"},
        "writeback_pending": {"finalized", "terminal_failed"},
        "finalized": set(),
        "terminal_failed": {"superseded"},
        "superseded": set(),
    },
    initial={"pending"},
    seed='Seed 002, "Create Attempt State" (a status projection; ARCHITECTURE.md section 4)',
    parked={"ambiguous_remote_effect"},
)

#: How each seed 002 create-attempt edge happens on the one effect model
#: (ARCHITECTURE.md section 4). Each step is ``(machine, src, dst)``; ``src``
#: ``None`` means the row is inserted in ``dst``. An edge with no steps is
#: realized outside the row's lifecycle and says how in ``REALIZED_ELSEWHERE``.
PUSH_ATTEMPT_REALIZATION: dict[tuple[str, str], tuple[tuple[str, str | None, str], ...]] = {
    ("pending", "processing"): (("connectors.RemoteEffectAttempt", None, "started"),
                                ("connectors.DispatchPermit", None, "granted"),
                                ("connectors.RemoteEffect", "prepared", "dispatching")),
    ("pending", "terminal_failed"): (("connectors.RemoteEffect", "prepared", "quarantined"),),
    ("processing", "pending"): (("connectors.DispatchPermit", "granted", "abandoned"),
                                ("connectors.RemoteEffect", "dispatching", "prepared")),
    ("processing", "post_sent"): (("connectors.DispatchPermit", "granted", "sending"),),
    ("processing", "writeback_pending"): (("connectors.DispatchPermit", "granted", "sending"),
                                          ("connectors.DispatchPermit", "sending", "returned"),
                                          ("connectors.RemoteEffect", "dispatching", "remote_confirmed")),
    ("processing", "ambiguous_remote_effect"): (("connectors.DispatchPermit", "sending", "abandoned"),
                                                ("connectors.RemoteEffect", "dispatching", "uncertain")),
    ("processing", "terminal_failed"): (("connectors.DispatchPermit", "granted", "abandoned"),
                                        ("connectors.RemoteEffect", "dispatching", "no_effect")),
    ("post_sent", "writeback_pending"): (("connectors.DispatchPermit", "sending", "returned"),
                                         ("connectors.RemoteEffect", "dispatching", "remote_confirmed")),
    ("post_sent", "ambiguous_remote_effect"): (("connectors.DispatchPermit", "sending", "returned"),
                                               ("connectors.RemoteEffect", "dispatching", "uncertain")),
    ("post_sent", "terminal_failed"): (("connectors.DispatchPermit", "sending", "returned"),
                                       ("connectors.RemoteEffect", "dispatching", "no_effect")),
    ("ambiguous_remote_effect", "writeback_pending"): (("connectors.RemoteEffect", "uncertain", "remote_confirmed"),),
    ("writeback_pending", "finalized"): (("connectors.RemoteLink", None, "active"),
                                         ("connectors.RemoteEffect", "remote_confirmed", "finalized")),
    ("writeback_pending", "terminal_failed"): (),
    ("terminal_failed", "superseded"): (),
}
REALIZED_ELSEWHERE = {
    ("writeback_pending", "terminal_failed"): (
        "the remote identity is known, so the effect still finalizes; a mirror writeback that cannot be applied "
        "is recorded as skipped on the link (seed 002 `finalized`: 'mirror is written or recorded as skipped')"),
    ("terminal_failed", "superseded"): (
        "a successor EffectGeneration authored by explicit operator intent after a proven terminal no_effect; "
        "the old effect row never moves again"),
}

# The V1 runtime's machines (connectors/v1/transitions.py) register with the connector app's.
from connectors.v1 import transitions as _v1_transitions  # noqa: F401 - importing registers the machines
