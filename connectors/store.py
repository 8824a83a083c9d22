"""Connector CAS stores: the only writers of connector rows (ARCHITECTURE.md section 6).

Lock classes (ARCHITECTURE.md section 6): gates, epochs and credential
gates are ``SERVING_GATE`` in the sub-order AccountServingGate -> its exact
ServingEpoch -> CredentialGenerationDispatchGate -> StreamCursor; lanes, executions, effects
and permits are ``CONNECTOR_WORK`` in the sub-order OrderingLane ->
Projection/Window -> Execution -> ExecutionAttempt -> RemoteEffect ->
DispatchPermit -> RemoteEffectAttempt -> RemoteLink -> OrderingHandoff. The ranks below encode
both; :mod:`nexusflow.kernel.locks` refuses a reversal.
"""
from __future__ import annotations

from django.db import connections

from nexusflow.kernel import locks
from nexusflow.kernel.errors import FenceRejected
from nexusflow.kernel.locks import LockClass

# Sub-order ranks inside SERVING_GATE and CONNECTOR_WORK.
RANK_GATE, RANK_EPOCH, RANK_CREDENTIAL_GATE, RANK_STREAM_CURSOR = 0, 1, 2, 3
RANK_LANE, RANK_PROJECTION, RANK_EXECUTION, RANK_EXECUTION_ATTEMPT = 0, 1, 2, 3
RANK_EFFECT, RANK_PERMIT, RANK_EFFECT_ATTEMPT, RANK_LINK = 4, 5, 6, 7
# OrderingHandoff rows are locked after the lanes they join (predecessor and successor lanes).
RANK_HANDOFF = 8
# The ServingPublicationBarrierSet is locked after the gates it freezes and before their epoch.
RANK_PUBLICATION_BARRIER = 0.5
from connectors import models, transitions
from nexusflow.kernel.store import CasStore


class AccountServingGateStore(CasStore):
    model = models.AccountServingGate
    machine = transitions.ACCOUNT_SERVING_GATE
    lock_class = LockClass.SERVING_GATE
    lock_rank, lock_label = RANK_GATE, "gate"
    stale_error = FenceRejected

    @classmethod
    def lock_by_account(cls, org_id: str, account_key: str) -> models.AccountServingGate:
        return cls.lock_where(org_id, account_key=account_key)

    @classmethod
    def share_lock_by_account(cls, org_id: str, account_key: str) -> models.AccountServingGate:
        """The account's gate, share-locked (:meth:`~nexusflow.kernel.store.CasStore.lock_shared`): the outbound
        writes' side of the gate fence (``serving_lock(..., shared=True)``); every gate transition locks it
        ``FOR UPDATE`` and so waits for them."""
        return cls.lock_where_shared(org_id, account_key=account_key)


    @classmethod
    def share_lock_org(cls, org_id: str) -> int:
        """Share-lock every gate of ``org_id`` until the caller's transaction ends; return how many.

        A writer that changes the org's ServingPublicationBarrierSet locks the same gates ``FOR UPDATE``
        first, so it waits for every publication already past this lock, and a publication arriving later
        waits for it (``LOCK IN SHARE MODE``: MariaDB and MySQL).
        """
        locks.note(cls.lock_class, cls.db(), rank=cls.lock_rank, label=cls.lock_label)
        table = cls.model._meta.db_table
        with connections[cls.db()].cursor() as cursor:
            # ``state`` is not in the (org_id, account_key) index: the read visits, and so share-locks, the
            # clustered rows a FOR UPDATE of the same gates locks, whichever index either plan uses.
            cursor.execute(f"SELECT id, state FROM {table} WHERE org_id = %s ORDER BY id LOCK IN SHARE MODE",
                           [org_id])
            return len(cursor.fetchall())


class ServingPublicationBarrierSetStore(CasStore):
    """The activation attempt's publication barrier set; every write compares ``holder_fence``."""

    model = models.ServingPublicationBarrierSet
    machine = transitions.SERVING_PUBLICATION_BARRIER_SET
    lock_class = LockClass.SERVING_GATE
    lock_rank, lock_label = RANK_PUBLICATION_BARRIER, "publication barrier set"
    stale_error = FenceRejected


class ServingEpochStore(CasStore):
    model = models.ServingEpoch
    machine = transitions.SERVING_EPOCH
    lock_class = LockClass.SERVING_GATE
    lock_rank, lock_label = RANK_EPOCH, "epoch"
    stale_error = FenceRejected


class CredentialDispatchGateStore(CasStore):
    model = models.CredentialGenerationDispatchGate
    machine = transitions.CREDENTIAL_DISPATCH_GATE
    lock_class = LockClass.SERVING_GATE
    lock_rank, lock_label = RANK_CREDENTIAL_GATE, "credential gate"
    stale_error = FenceRejected


class StreamCursorStore(CasStore):
    """A pulled route's durable cursor: an ingress owner, after the gate and epoch it admits under."""

    model = models.StreamCursor
    machine = transitions.STREAM_CURSOR
    lock_class = LockClass.SERVING_GATE
    lock_rank, lock_label = RANK_STREAM_CURSOR, "stream cursor"
    stale_error = FenceRejected


class OrderingLaneStore(CasStore):
    model = models.OrderingLane
    machine = transitions.ORDERING_LANE
    lock_class = LockClass.CONNECTOR_WORK
    lock_rank, lock_label = RANK_LANE, "lane"
    stale_error = FenceRejected


class ExecutionStore(CasStore):
    model = models.Execution
    machine = transitions.EXECUTION
    lock_class = LockClass.CONNECTOR_WORK
    lock_rank, lock_label = RANK_EXECUTION, "execution"

    @classmethod
    def lock_lane_members(cls, org_id: str, lane_id: int, states: tuple[str, ...]) -> list[models.Execution]:
        """Lock and return the Executions of one lane in ``states``, in ascending id order.

        The read goes through ``execution_state_lane_idx`` only (``FORCE INDEX``, which TiDB also
        accepts), so it locks the lane's own rows and nothing else. Left to the optimizer, the same
        filter may be answered through a rowid filter built from ``execution_org_state_idx`` (the
        whole org's ``ready`` rows): the claim then waits on, or deadlocks with, the completion of an
        Execution of another lane (the ``events_applied`` stall, docs/performance.md).

        Raises:
            LockOrderViolation: taken after a higher position (mode ``raise``).
        """
        if not states:
            return []
        cls._note()
        table = cls.model._meta.db_table
        rows = list(cls.model.objects.raw(
            f"SELECT * FROM {table} FORCE INDEX (execution_state_lane_idx) WHERE state IN "
            f"({', '.join(['%s'] * len(states))}) AND lane_id = %s AND org_id = %s ORDER BY id FOR UPDATE",
            [*states, int(lane_id), org_id]))
        for row in rows[:1] + rows[-1:]:  # the lowest key against what is held, then the highest is held
            cls._note(org_id, row.pk)
        return rows


class ExecutionAttemptStore(CasStore):
    model = models.ExecutionAttempt
    machine = transitions.EXECUTION_ATTEMPT
    lock_class = LockClass.CONNECTOR_WORK
    lock_rank, lock_label = RANK_EXECUTION_ATTEMPT, "execution attempt"
    stale_error = FenceRejected


class RemoteEffectStore(CasStore):
    model = models.RemoteEffect
    machine = transitions.REMOTE_EFFECT
    lock_class = LockClass.CONNECTOR_WORK
    lock_rank, lock_label = RANK_EFFECT, "effect"


class RemoteEffectAttemptStore(CasStore):
    model = models.RemoteEffectAttempt
    machine = transitions.REMOTE_EFFECT_ATTEMPT
    lock_class = LockClass.CONNECTOR_WORK
    lock_rank, lock_label = RANK_EFFECT_ATTEMPT, "effect attempt"


class DispatchPermitStore(CasStore):
    model = models.DispatchPermit
    machine = transitions.DISPATCH_PERMIT
    lock_class = LockClass.CONNECTOR_WORK
    lock_rank, lock_label = RANK_PERMIT, "permit"
    stale_error = FenceRejected


class RemoteLinkStore(CasStore):
    model = models.RemoteLink
    machine = transitions.REMOTE_LINK
    lock_class = LockClass.CONNECTOR_WORK
    lock_rank, lock_label = RANK_LINK, "link"

    @classmethod
    def lock_by_link_key(cls, org_id: str, link_key: str) -> models.RemoteLink | None:
        """Lock and return the link of ``link_key`` in ``org_id``, or ``None`` if there is none.

        The resource key is ``(org_id, link_key)``: a transaction locking several
        links by key takes them in ascending (byte-wise) link_key order, the
        stable LinkKey order of seed 002 "2026-07-22 Finalized Mapping
        Revalidation CARVE_DOWN" (L0 invariant 2); a lower key after a higher
        one is refused like any reversal.

        Raises:
            LockOrderViolation: taken after a higher position or key (mode ``raise``).
            InvalidIdentity: ``link_key`` is not canonical (before SQL).
        """
        from nexusflow.kernel import locks

        locks.note(cls.lock_class, cls.db(), rank=cls.lock_rank, label=cls.lock_label, key=(org_id, link_key))
        return cls.model.objects.select_for_update().filter(org_id=org_id, link_key=link_key).first()


# Sub-order ranks of the inbound-chain rows added after the first ranks were
# fixed: a window locks after its lane and before Executions; a dependency
# after its Execution and before ExecutionAttempts (ARCHITECTURE.md section 6,
# "OrderingLane -> Projection/Window -> Execution").
RANK_WINDOW, RANK_DEPENDENCY = 0.5, 2.5


class ProjectionWindowStore(CasStore):
    model = models.ProjectionWindow
    machine = transitions.PROJECTION_WINDOW
    lock_class = LockClass.CONNECTOR_WORK
    lock_rank, lock_label = RANK_WINDOW, "window"
    immutable_columns = frozenset({"grouping_key", "grouping", "policy", "close_policy", "close_at", "epoch_id",
                                   "route_key", "account_key", "lane_id"})


class ExecutionDependencyStore(CasStore):
    model = models.ExecutionDependency
    machine = transitions.EXECUTION_DEPENDENCY
    lock_class = LockClass.CONNECTOR_WORK
    lock_rank, lock_label = RANK_DEPENDENCY, "dependency"
    immutable_columns = frozenset({"deadline_at", "requirement", "required_position", "disposition",
                                   "execution_id", "lane_id"})
class OrderingHandoffStore(CasStore):
    model = models.OrderingHandoff
    machine = transitions.ORDERING_HANDOFF
    lock_class = LockClass.CONNECTOR_WORK
    lock_rank, lock_label = RANK_HANDOFF, "handoff"
    stale_error = FenceRejected


class WorkerProcessStore:
    """The holder registry's one write after registration: the proven end of a process generation."""

    @staticmethod
    def record_termination(*, worker_id: str, proof: dict, at) -> bool:
        """Set ``terminated_at`` and ``termination_proof`` once; ``False`` if already recorded or unknown."""
        import json

        from django.db import connections, router

        with connections[router.db_for_write(models.WorkerProcess)].cursor() as cursor:
            cursor.execute(
                "UPDATE connectors_workerprocess SET terminated_at = %s, termination_proof = %s "
                "WHERE worker_id = %s AND terminated_at IS NULL", [at, json.dumps(proof, sort_keys=True), worker_id])
            return cursor.rowcount == 1


# The V1 runtime's stores (connectors/v1/store.py) register with the connector app's.
from connectors.v1 import store as _v1_store  # noqa: F401 - importing registers the stores
