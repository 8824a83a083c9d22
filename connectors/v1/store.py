"""V1 CAS stores: the only writers of V1 rows (ARCHITECTURE.md section 6; seed 003 "V1 concepts to retire").

Lock positions: the SchedulerLease and the stream cursor are ``SERVING_GATE``
rows after every V2 gate rank (V1 takes no V2 gate, so they never meet one in
a transaction); V1 events and provider calls are ``CONNECTOR_WORK`` after every
V2 work rank. A V1 transaction therefore locks lease -> event -> Runtime rows.
"""
from __future__ import annotations

import datetime as dt

from django.db import connections

from connectors.v1 import models, transitions
from nexusflow.kernel import locks
from nexusflow.kernel.errors import FenceRejected
from nexusflow.kernel.locks import LockClass
from nexusflow.kernel.store import CasStore

RANK_V1_BARRIER, RANK_V1_SCHEDULER_LEASE, RANK_V1_STREAM_CURSOR = 9, 10, 11
RANK_V1_EVENT, RANK_V1_PROVIDER_CALL = 20, 21


class V1SchedulerLeaseStore(CasStore):
    model = models.V1SchedulerLease
    machine = transitions.V1_SCHEDULER_LEASE
    lock_class = LockClass.SERVING_GATE
    lock_rank, lock_label = RANK_V1_SCHEDULER_LEASE, "v1 scheduler lease"
    stale_error = FenceRejected

    @classmethod
    def lock_by_name(cls, org_id: str, name: str) -> models.V1SchedulerLease | None:
        """Lock and return the lease ``name`` of ``org_id``, or ``None`` when it was never created."""
        try:
            return cls.lock_where(org_id, name=name)
        except cls.model.DoesNotExist:
            return None


class V1StreamCursorStore(CasStore):
    model = models.V1StreamCursor
    machine = transitions.V1_STREAM_CURSOR
    lock_class = LockClass.SERVING_GATE
    lock_rank, lock_label = RANK_V1_STREAM_CURSOR, "v1 stream cursor"
    stale_error = FenceRejected


class V1EventStore(CasStore):
    model = models.V1Event
    machine = transitions.V1_EVENT
    lock_class = LockClass.CONNECTOR_WORK
    lock_rank, lock_label = RANK_V1_EVENT, "v1 event"
    stale_error = FenceRejected

    @classmethod
    def lock_due(cls, org_id: str, now: dt.datetime) -> models.V1Event | None:
        """Lock the oldest due ``pending`` event of ``org_id`` (``SKIP LOCKED``), or ``None``."""
        locks.note(cls.lock_class, cls.db(), rank=cls.lock_rank, label=cls.lock_label)
        return (cls.model.objects.select_for_update(skip_locked=True)
                .filter(org_id=org_id, state="pending")
                .exclude(next_attempt_at__gt=now).order_by("id").first())


class V1ProviderCallStore(CasStore):
    model = models.V1ProviderCall
    machine = transitions.V1_PROVIDER_CALL
    lock_class = LockClass.CONNECTOR_WORK
    lock_rank, lock_label = RANK_V1_PROVIDER_CALL, "v1 provider call"


class V1MaintenanceBarrierStore(CasStore):
    """The V1 owner-level maintenance barriers: a ``SERVING_GATE`` row before the V1 lease and cursor."""

    model = models.V1MaintenanceBarrier
    machine = transitions.V1_MAINTENANCE_BARRIER
    lock_class = LockClass.SERVING_GATE
    lock_rank, lock_label = RANK_V1_BARRIER, "v1 maintenance barrier"
    stale_error = FenceRejected

    @classmethod
    def share_state(cls, org_id: str, kind: str) -> str | None:
        """Share-lock the ``kind`` barrier of ``org_id`` and return its state (``None``: the org has none).

        The shared lock lasts until the caller's transaction ends, so a close (``FOR UPDATE``) waits for
        every admission already past this check (``LOCK IN SHARE MODE``: MariaDB and MySQL; TiDB needs
        ``tidb_enable_noop_functions`` off and pessimistic mode).
        """
        locks.note(cls.lock_class, cls.db(), rank=cls.lock_rank, label=cls.lock_label, key=(org_id, kind))
        table = cls.model._meta.db_table
        with connections[cls.db()].cursor() as cursor:
            cursor.execute(f"SELECT state FROM {table} WHERE org_id = %s AND kind = %s LOCK IN SHARE MODE",
                           [org_id, kind])
            row = cursor.fetchone()
        return None if row is None else row[0]


#: The barrier row whose lock serializes V1 egress with its denial (any state: the row is the mutex).
EGRESS_MUTEX_KIND = "root_outbound"


def v1_egress_denied(org_id: str, generation_id: int) -> models.V1EgressDenial | None:
    """Share-lock the org's egress mutex and return the denial covering ``generation_id``, or ``None``.

    Must run inside the transaction that commits the pre-I/O row or marker: ``cutover stop`` takes the
    same row ``FOR UPDATE`` before it inserts a denial, so a marker either committed first (an interrupted
    call the cutover reconciles) or sees the denial. An org without barrier rows has no denial either.
    """
    V1MaintenanceBarrierStore.share_state(org_id, EGRESS_MUTEX_KIND)
    return (models.V1EgressDenial.objects.filter(org_id=org_id, through_generation__gte=generation_id)
            .order_by("id").first())


def v1_egress_mutex_lock(org_id: str) -> models.V1MaintenanceBarrier:
    """Lock the org's egress mutex row ``FOR UPDATE`` (before inserting a V1EgressDenial).

    Raises:
        V1MaintenanceBarrier.DoesNotExist: the org has no V1 barriers.
    """
    return V1MaintenanceBarrierStore.lock_where(org_id, kind=EGRESS_MUTEX_KIND)
