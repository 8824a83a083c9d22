"""Reconciliation decides on an unlocked read; it must not act on a row that moved since.

Seed 003 "State machines": ``uncertain -> prepared`` only with proof or the
frozen exact-repeat contract. If, between the read and the lock, another
worker dispatched and settled the effect back into ``uncertain`` with an
operator-only reason, the repeat would re-send an effect parked for an
operator.
"""
from __future__ import annotations

import threading

import pytest
from django.db import connections, transaction

from connectors.models import RemoteEffect, RemoteEffectAttempt
from connectors.outbound import egress, recovery
from connectors.reasons import OPERATOR_ONLY_UNCERTAIN, RESPONSE_AMBIGUOUS
from connectors.store import RemoteEffectStore
from tests.kernel import rows

ORG = "reconcile-org"
pytestmark = pytest.mark.django_db(transaction=True)


def _parked_uncertain_effect() -> RemoteEffect:
    effect = rows.make(RemoteEffect, org_id=ORG, state="uncertain", version=1, reason_code=RESPONSE_AMBIGUOUS)
    rows.make(RemoteEffectAttempt, org_id=ORG, effect=effect, attempt_number=1, state="uncertain",
              idempotency_key="idem-1")
    return effect


def _replay_safe(monkeypatch):
    profile = {"idempotency": {"replay_safe": True, "header": "Idempotency-Key"}, "retry": {"max_attempts": 10},
               "outcomes": {}}
    monkeypatch.setattr(recovery, "frozen_contract", lambda effect: ({}, {}, profile))


def test_an_effect_that_moved_after_the_read_is_left_alone(monkeypatch):
    _replay_safe(monkeypatch)
    effect = _parked_uncertain_effect()
    operator_only = sorted(OPERATOR_ONLY_UNCERTAIN)[0]
    real_lock = RemoteEffectStore.lock.__func__

    def moved_before_lock(cls, org_id, pk, **kwargs):
        # Another worker's transaction commits first: it parks the effect with an operator-only reason.
        def other():
            with transaction.atomic():
                RemoteEffectStore.touch(org_id=ORG, pk=effect.pk, state="uncertain", version=1,
                                        set_fields={"reason_code": operator_only})
            connections.close_all()
        thread = threading.Thread(target=other)
        thread.start()
        thread.join(10)
        return real_lock(cls, org_id, pk, **kwargs)

    monkeypatch.setattr(RemoteEffectStore, "lock", classmethod(moved_before_lock))
    assert egress.effect_try_reconcile_one() is False
    row = RemoteEffect.objects.get(org_id=ORG, pk=effect.pk)
    assert (row.state, row.version, row.reason_code) == ("uncertain", 2, operator_only)


def test_an_unmoved_replay_safe_effect_is_released_for_the_exact_repeat(monkeypatch):
    _replay_safe(monkeypatch)
    effect = _parked_uncertain_effect()
    assert egress.effect_try_reconcile_one() is True
    row = RemoteEffect.objects.get(org_id=ORG, pk=effect.pk)
    assert (row.state, row.version, row.reason_code) == ("prepared", 2, "")
