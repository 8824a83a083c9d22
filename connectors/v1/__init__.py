"""The V1 connector runtime being retired (seed 003 "V1 concepts to retire"; seed 002 "Scope").

This is the unchanged V1 service a fresh V1 install serves until the whole-service
cutover drains and stops it. It deliberately keeps the V1 concepts seed 003 retires:

- webhook ingress on its own route with its own transport-idempotency table
  (:class:`~connectors.v1.models.V1TransportKey`);
- one Event table carrying execution status, lease, retry and owner
  (:class:`~connectors.v1.models.V1Event`) under a per-org
  :class:`~connectors.v1.models.V1SchedulerLease`;
- Runtime handoff acceptance as its completion: a V1 event is complete when the
  Runtime command inbox accepted its application command (the
  ``runtime.command.handoff`` Runtime message family), never by reading an
  ApplicationResult;
- synchronous PATCH-only push of existing links (seed 002 "Scope": no POST/create),
  each provider call preceded by a durable pre-I/O row
  (:class:`~connectors.v1.models.V1ProviderCall`);
- a cursor poller for pulled routes (:class:`~connectors.v1.models.V1StreamCursor`);
- one :class:`~connectors.v1.models.V1ProcessGeneration` row per started V1 worker.

V1 reads the live (latest) configuration generation and pack documents, never an
AccountServingGate or ServingEpoch (seed 003 "State machines": "V1 is not
retrofitted to read AccountServingGate"). Models keep the ``connectors`` app label.
"""
