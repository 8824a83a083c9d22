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
| RemoteEffect | uncertain, no_effect, quarantined | parked, refused, halted |
| RemoteLink | suspended_drift | PATCH authority halted |
| OrderingLane, DispatchPermit, ExecutionAttempt, RemoteEffectAttempt | none | lane hand-off is not a halt; Permits and attempts are evidence, their RemoteEffect / Execution carries the code |
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
