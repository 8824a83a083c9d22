"""V1 CAS stores: the only writers of V1 rows (ARCHITECTURE.md section 6; seed 003 "V1 concepts to retire").

Lock positions: the SchedulerLease and the stream cursor are ``SERVING_GATE``
rows after every V2 gate rank (V1 takes no V2 gate, so they never meet one in
a transaction); V1 events and provider calls are ``CONNECTOR_WORK`` after every
V2 work rank. A V1 transaction therefore locks lease -> event -> Runtime rows.
"""
from __future__ import annotations

import datetime as dt

from nexusflow.kernel import locks
from nexusflow.kernel.errors import FenceRejected
from nexusflow.kernel.locks import LockClass
from nexusflow.kernel.store import CasStore

from connectors.v1 import models, transitions

RANK_V1_SCHEDULER_LEASE, RANK_V1_STREAM_CURSOR = 10, 11
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
        locks.note(cls.lock_class, cls.db(), rank=cls.lock_rank, label=cls.lock_label, key=(org_id, name))
        return cls.model.objects.select_for_update().filter(org_id=org_id, name=name).first()


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
