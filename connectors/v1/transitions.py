"""V1 runtime state machines as data (seed 003 "V1 concepts to retire"; seed 002 "Scope").

| machine | reason_required | why |
| --- | --- | --- |
| V1Event | quarantined, failed | an item V1 cannot run, or a run that gave up |
| V1ProviderCall | refused, ambiguous | a definite refusal, or I/O that may have happened without a proven answer |
| V1SchedulerLease, V1StreamCursor | none | a lease and a cursor are positions, not halts |
| V1MaintenanceBarrier | none | the cutover attempt that closed it is on the row and in its evidence |
"""
from nexusflow.kernel.transitions import machine

SEED = 'Seed 003, "V1 concepts to retire"'

V1_EVENT = machine(
    "connectors.V1Event",
    {
        #: Claimed under the org's SchedulerLease; the lease owner and expiry live on the event (V1 style).
        "pending": {"running"},
        #: ``handed_off``: the Runtime command message is published; ``pending``: lease lost or a retry.
        "running": {"handed_off", "pending", "failed"},
        #: Runtime handoff acceptance is V1 completion; a refused handoff fails the event.
        "handed_off": {"completed", "failed"},
        "completed": set(),
        "failed": set(),
        "quarantined": set(),
    },
    initial={"pending", "quarantined"},
    seed=SEED,
    reason_required={"failed", "quarantined"},
)

V1_PROVIDER_CALL = machine(
    "connectors.V1ProviderCall",
    {
        #: The durable pre-I/O row; ``abandoned``: the request could not be built, nothing was sent.
        "prepared": {"sending", "abandoned"},
        #: ``sending`` is the committed pre-I/O marker (``io_may_have_started_at``): I/O may have started.
        "sending": {"confirmed", "refused", "ambiguous"},
        "confirmed": set(),
        "refused": set(),
        "abandoned": set(),
        #: Parked for cutover reconciliation: remote-finalized or proved-no-effect evidence only.
        "ambiguous": {"confirmed", "refused"},
    },
    initial={"prepared"},
    seed=SEED + ' and seed 002 "Scope"',
    parked={"ambiguous"},
    reason_required={"refused", "ambiguous"},
)

V1_SCHEDULER_LEASE = machine(
    "connectors.V1SchedulerLease",
    {"free": {"held"}, "held": {"free"}},
    initial={"free", "held"},
    seed=SEED + " (SchedulerLease participation in durable execution ownership)",
)

V1_STREAM_CURSOR = machine(
    "connectors.V1StreamCursor",
    {"polling": {"stopped"}, "stopped": {"polling"}},
    initial={"polling"},
    seed=SEED + ' (cursor of a pulled route)',
)

V1_MAINTENANCE_BARRIER = machine(
    "connectors.V1MaintenanceBarrier",
    {
        #: ``cutover halt-v1`` closes it; new roots are refused retryably, accepted work continues.
        "open": {"closed"},
        #: Reopened only by the fenced abort back to ``v1_serving`` (a remeasure breach).
        "closed": {"open"},
    },
    initial={"open"},
    seed='Seed 003, "Offline V1 shutdown, cold rollback, and V2 cutover" (owner-level maintenance barriers)',
)
