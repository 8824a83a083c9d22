"""The one lock order (ARCHITECTURE.md section 6; seed 004 sections 13.1-13.2)."""
from __future__ import annotations

import logging
import threading
import time

import pytest
from django.db import OperationalError, connection, connections, transaction
from django.test import override_settings

from connectors.models import AccountServingGate
from connectors.store import (
    AccountServingGateStore,
    DispatchPermitStore,
    OrderingLaneStore,
    RemoteEffectStore,
    ServingEpochStore,
)
from nexusflow.kernel import locks
from nexusflow.kernel.errors import LockOrderViolation

from . import rows

ORG = "lock-org"


def _recording(calls: list, name: str):
    def locker():
        calls.append(name)
        return name
    return locker


def _resource(calls, lock_class, rank, key, name, namespace="ns"):
    return locks.Resource(lock_class, rank, namespace, key, _recording(calls, name), label=name)


@pytest.mark.django_db
def test_acquire_locks_in_class_rank_key_order_and_returns_declaration_order():
    calls: list[str] = []
    declared = [
        _resource(calls, locks.LockClass.CONNECTOR_WORK, 5, (ORG, 1), "permit"),
        _resource(calls, locks.LockClass.CONNECTOR_WORK, 4, (ORG, 10), "effect-10"),
        _resource(calls, locks.LockClass.CONNECTOR_WORK, 4, (ORG, 2), "effect-2"),
        _resource(calls, locks.LockClass.SERVING_GATE, 0, (ORG, "b"), "gate-b"),
        _resource(calls, locks.LockClass.SERVING_GATE, 0, (ORG, "B"), "gate-B"),
        _resource(calls, locks.LockClass.BUSINESS_RECORD, 0, (ORG, "rec"), "record"),
        _resource(calls, locks.LockClass.CONNECTOR_WORK, 4, (ORG, 2), "effect-2-again"),
    ]
    with transaction.atomic():
        got = locks.acquire(declared)
    # Integers numerically (2 before 10), text byte-wise ("B" 0x42 before "b" 0x62); a duplicate once.
    assert calls == ["record", "gate-B", "gate-b", "effect-2", "effect-10", "permit"]
    assert got == ["permit", "effect-10", "effect-2", "gate-b", "gate-B", "record", "effect-2"]


@pytest.mark.django_db
def test_acquire_refuses_a_set_below_a_held_position():
    calls: list[str] = []
    with transaction.atomic():
        locks.note(locks.LockClass.CONNECTOR_WORK, rank=4, label="effect")
        with pytest.raises(LockOrderViolation, match="gate"):
            locks.acquire([_resource(calls, locks.LockClass.SERVING_GATE, 0, (ORG, 1), "gate")])
    assert calls == []


@pytest.mark.django_db
def test_connector_sub_order_is_enforced_on_real_rows():
    gate = rows.make(AccountServingGate, org_id=ORG, state="v1_serving", version=1)
    effect = rows.make(RemoteEffectStore.model, org_id=ORG, state="prepared", version=1)
    permit = rows.make(DispatchPermitStore.model, org_id=ORG, state="granted", version=1)
    with transaction.atomic():
        AccountServingGateStore.lock(ORG, gate.pk)
        RemoteEffectStore.lock(ORG, effect.pk)
        DispatchPermitStore.lock(ORG, permit.pk)
    with transaction.atomic():
        DispatchPermitStore.lock(ORG, permit.pk)
        with pytest.raises(LockOrderViolation, match="effect"):
            RemoteEffectStore.lock(ORG, effect.pk)
    with transaction.atomic():
        RemoteEffectStore.lock(ORG, effect.pk)
        with pytest.raises(LockOrderViolation, match="gate"):
            AccountServingGateStore.lock(ORG, gate.pk)
    epoch = rows.make(ServingEpochStore.model, org_id=ORG, state="prepared", version=1)
    with transaction.atomic():
        ServingEpochStore.lock(ORG, epoch.pk)
        with pytest.raises(LockOrderViolation, match="gate"):
            AccountServingGateStore.lock(ORG, gate.pk)
    lane = rows.make(OrderingLaneStore.model, org_id=ORG, state="open", version=1)
    with transaction.atomic():
        RemoteEffectStore.lock(ORG, effect.pk)
        with pytest.raises(LockOrderViolation, match="lane"):
            OrderingLaneStore.lock(ORG, lane.pk)


@pytest.mark.django_db
def test_production_mode_logs_and_counts_instead_of_raising(caplog):
    before = locks.violations_logged
    with override_settings(NEXUS_LOCK_ORDER="log"), caplog.at_level(logging.ERROR, logger="nexusflow.locks"):
        with transaction.atomic():
            locks.note(locks.LockClass.RUNTIME)
            locks.note(locks.LockClass.BUSINESS_RECORD, label="record")
    assert locks.violations_logged == before + 1
    assert any("record" in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)


def test_resource_keys_must_be_int_text_or_bytes():
    with pytest.raises(TypeError):
        locks.Resource(locks.LockClass.RUNTIME, 0, "ns", (1.5,), lambda: None).sort_key()


# --- real concurrent transactions -------------------------------------------------
def _two_gates():
    return [rows.make(AccountServingGate, org_id=ORG, state="v1_serving", version=1) for _ in range(2)]


def _contend(first, second, *, mode: str) -> list[BaseException]:
    """Two threads lock the two gates in opposite declared orders, holding each lock a moment.

    ``mode``: ``"raw"`` locks with plain ``select_for_update`` in declared
    order (no order check: the database's own behaviour); ``"store"`` locks
    through ``CasStore.lock`` in declared order; ``"acquire"`` hands the
    declared set to :func:`locks.acquire`.
    """
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def take(pk):
        def locker():
            if mode == "raw":
                row = AccountServingGate.objects.select_for_update().get(org_id=ORG, pk=pk)
            else:
                row = AccountServingGateStore.lock(ORG, pk)
            time.sleep(0.2)
            return row
        return locker

    def worker(order):
        try:
            barrier.wait()
            with transaction.atomic():
                resources = [locks.Resource(locks.LockClass.SERVING_GATE, 0, "gates", (ORG, pk), take(pk),
                                            label="gate") for pk in order]
                if mode == "acquire":
                    locks.acquire(resources)
                else:
                    for resource in resources:
                        resource.locker()
        except BaseException as exc:  # collected for the assertion
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker, args=(order,))
               for order in ([first.pk, second.pk], [second.pk, first.pk])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return errors


@pytest.mark.django_db(transaction=True)
def test_opposite_declarations_never_deadlock_through_acquire():
    first, second = _two_gates()
    # Control: the database itself deadlocks on these two transactions, so the
    # setup is able to show a reversal.
    raw = _contend(first, second, mode="raw")
    assert any(isinstance(e, OperationalError) and e.args[0] == 1213 for e in raw), raw
    # Through the store, the descending declaration is refused before it can wait.
    refused = _contend(first, second, mode="store")
    assert len(refused) == 1 and isinstance(refused[0], LockOrderViolation), refused
    for _ in range(3):
        assert _contend(first, second, mode="acquire") == []
    assert connection.vendor == "mysql"


@pytest.mark.django_db
def test_lock_where_and_lock_all_take_part_in_the_key_order():
    low, high = (rows.make(RemoteEffectStore.model, org_id=ORG, state="prepared", version=1) for _ in range(2))
    with transaction.atomic():
        RemoteEffectStore.lock(ORG, high.pk)
        with pytest.raises(LockOrderViolation, match="key"):
            RemoteEffectStore.lock_where(ORG, pk=low.pk)
    with transaction.atomic():
        RemoteEffectStore.lock_where(ORG, pk=high.pk)
        with pytest.raises(LockOrderViolation, match="key"):
            RemoteEffectStore.lock(ORG, low.pk)
    with transaction.atomic():
        RemoteEffectStore.lock(ORG, high.pk)
        with pytest.raises(LockOrderViolation, match="key"):
            RemoteEffectStore.lock_all(ORG, state="prepared")
    with transaction.atomic():
        assert [r.pk for r in RemoteEffectStore.lock_all(ORG, state="prepared")] == [low.pk, high.pk]
        with pytest.raises(LockOrderViolation, match="key"):
            RemoteEffectStore.lock(ORG, low.pk)
