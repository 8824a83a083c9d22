"""Connector CAS stores: the only writers of connector rows (ARCHITECTURE.md section 6).

Lock classes: gates, epochs and credential gates are ``SERVING_GATE``;
lanes, executions, effects and permits are ``CONNECTOR_WORK``, and inside
that class rows are taken in the order OrderingLane -> Projection ->
Execution -> RemoteEffect -> DispatchPermit.
"""
from __future__ import annotations

from nexusflow.kernel.errors import FenceRejected
from nexusflow.kernel.locks import LockClass
from nexusflow.kernel.store import CasStore

from . import models, transitions


class AccountServingGateStore(CasStore):
    model = models.AccountServingGate
    machine = transitions.ACCOUNT_SERVING_GATE
    lock_class = LockClass.SERVING_GATE
    stale_error = FenceRejected

    @classmethod
    def lock_by_account(cls, org_id: str, account_key: str) -> models.AccountServingGate:
        from nexusflow.kernel import locks

        locks.note(cls.lock_class)
        return cls.model.objects.select_for_update().get(org_id=org_id, account_key=account_key)


class ServingEpochStore(CasStore):
    model = models.ServingEpoch
    machine = transitions.SERVING_EPOCH
    lock_class = LockClass.SERVING_GATE
    stale_error = FenceRejected


class CredentialDispatchGateStore(CasStore):
    model = models.CredentialGenerationDispatchGate
    machine = transitions.CREDENTIAL_DISPATCH_GATE
    lock_class = LockClass.SERVING_GATE
    stale_error = FenceRejected


class OrderingLaneStore(CasStore):
    model = models.OrderingLane
    machine = transitions.ORDERING_LANE
    lock_class = LockClass.CONNECTOR_WORK
    stale_error = FenceRejected


class ExecutionStore(CasStore):
    model = models.Execution
    machine = transitions.EXECUTION
    lock_class = LockClass.CONNECTOR_WORK


class ExecutionAttemptStore(CasStore):
    model = models.ExecutionAttempt
    machine = transitions.EXECUTION_ATTEMPT
    lock_class = LockClass.CONNECTOR_WORK
    stale_error = FenceRejected


class RemoteEffectStore(CasStore):
    model = models.RemoteEffect
    machine = transitions.REMOTE_EFFECT
    lock_class = LockClass.CONNECTOR_WORK


class RemoteEffectAttemptStore(CasStore):
    model = models.RemoteEffectAttempt
    machine = transitions.REMOTE_EFFECT_ATTEMPT
    lock_class = LockClass.CONNECTOR_WORK


class DispatchPermitStore(CasStore):
    model = models.DispatchPermit
    machine = transitions.DISPATCH_PERMIT
    lock_class = LockClass.CONNECTOR_WORK
    stale_error = FenceRejected


class RemoteLinkStore(CasStore):
    model = models.RemoteLink
    machine = transitions.REMOTE_LINK
    lock_class = LockClass.CONNECTOR_WORK
