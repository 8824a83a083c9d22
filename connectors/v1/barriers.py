"""V1 owner-level maintenance barriers (seed 003 "Offline V1 shutdown, cold rollback, and V2 cutover").

Three barriers per org, created open by ``cutover v1-install``:

| kind | who checks it | closed means |
| --- | --- | --- |
| ``ingress`` | V1 webhook admission and the V1 stream poller | 503 + Retry-After: the pushed delivery stays unacknowledged and the source retries; a pulled cursor does not move |
| ``root_outbound`` | ``v1_push`` (a new root outbound request) | 503 + Retry-After before any pre-I/O row |
| ``configuration`` | ``connector_config_apply`` | 503 + Retry-After: no new configuration generation |

They stop new roots only; V1 work already accepted keeps running. Each check
share-locks its barrier in the caller's transaction, so ``cutover halt-v1``'s
close waits for every admission already past the check: a transaction crossing
the close commits and is part of what the cutover remeasures and drains.
"""
from __future__ import annotations

from django.db import IntegrityError, transaction

from connectors.v1.models import V1MaintenanceBarrier
from connectors.v1.store import V1MaintenanceBarrierStore
from nexusflow.kernel.errors import NexusError

KINDS = ("configuration", "ingress", "root_outbound")
RETRY_AFTER_SECONDS = 30


class V1MaintenanceClosed(NexusError):
    """A V1 maintenance barrier is closed for a cutover: retry later (HTTP 503 + Retry-After)."""

    code = "v1_maintenance"
    http_status = 503
    retry_after = RETRY_AFTER_SECONDS


def v1_barrier_admit(*, org_id: str, kind: str) -> None:
    """Admit one new root of ``kind`` for ``org_id`` inside the caller's transaction, or refuse it.

    Must run inside the transaction that writes the root, first; the shared lock it
    takes lasts until that transaction ends. An org without barrier rows (never
    installed as V1) is admitted.

    Raises:
        V1MaintenanceClosed: the barrier is closed.
        RuntimeError: called outside a transaction.
    """
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("a maintenance barrier is checked inside the transaction that writes the root")
    if V1MaintenanceBarrierStore.share_state(org_id, kind) == "closed":
        raise V1MaintenanceClosed(f"the V1 {kind} maintenance barrier of {org_id} is closed for a cutover; "
                                  "retry later")


def v1_barrier_is_closed(*, org_id: str, kind: str) -> bool:
    """Whether the ``kind`` barrier of ``org_id`` is closed now (a non-locking read, for skipping work early)."""
    return V1MaintenanceBarrier.objects.filter(org_id=org_id, kind=kind, state="closed").exists()


def v1_barriers_install(*, org_id: str) -> int:
    """Create the org's missing barriers, open; returns how many were created (0 on a rerun)."""
    created = 0
    for kind in KINDS:
        if V1MaintenanceBarrier.objects.filter(org_id=org_id, kind=kind).exists():
            continue
        try:
            with transaction.atomic(durable=True):
                V1MaintenanceBarrierStore.create(org_id=org_id, kind=kind, state="open")
            created += 1
        except IntegrityError:
            continue
    return created
