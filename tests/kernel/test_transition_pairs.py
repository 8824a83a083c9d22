"""Every (source, target) pair of every state machine, against its real store.

CONVENTIONS.md "State machines" and seed 003 "Required proof": listed pairs
are accepted by the store (the row really moves and its version advances);
every other pair, self-loops and unknown states included, is rejected with
``IllegalTransition`` before any SQL is sent. The per-machine counts are
printed at the end of the run (tests/conftest.py terminal summary).
"""
from __future__ import annotations

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext

from nexusflow.kernel.errors import IllegalTransition
from nexusflow.kernel.store import load_all_stores
from nexusflow.kernel.transitions import load_all_machines

from . import rows

ORG = "pairs-org"
UNKNOWN_STATE = "no_such_state"

#: Machines whose rows the walking slice does not build yet: the table is the
#: contract, the store arrives with the issue named. A machine listed here
#: must not have a store (the test below fails when one appears).
TABLE_ONLY = {
    "connectors.PushAttemptStatus": "never: seed 002 status projection (test_push_attempt_projection.py)",
}

MACHINES = load_all_machines()
STORES = load_all_stores()
STORED = sorted(name for name in MACHINES if name in STORES)


def reason_fields(machine, dst: str) -> dict:
    """``set_fields`` a move into ``dst`` needs: a registered reason code where one is required."""
    if dst in machine.reason_required:
        return {"reason_code": rows.reason_for(machine)}
    return {}


def test_every_machine_has_a_store_or_is_table_only():
    assert sorted(set(MACHINES) - set(STORES)) == sorted(TABLE_ONLY)
    assert not set(TABLE_ONLY) & set(STORES), "a table-only machine has a store now: move it to STORED"
    assert set(STORES) <= set(MACHINES)


def test_every_store_persists_the_model_its_machine_names():
    for name, store in STORES.items():
        assert f"{store.model._meta.app_label}.{store.model.__name__}" == name


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_every_state_is_reachable_from_an_initial_state(name):
    machine = MACHINES[name]
    reachable, frontier = set(machine.initial), list(machine.initial)
    while frontier:
        for nxt in machine.transitions[frontier.pop()]:
            if nxt not in reachable:
                reachable.add(nxt)
                frontier.append(nxt)
    assert reachable == set(machine.states), f"{name}: unreachable {sorted(set(machine.states) - reachable)}"


@pytest.mark.django_db(databases=["default", "control"])
@pytest.mark.parametrize("name", sorted(MACHINES))
def test_unlisted_pairs_are_rejected_before_sql(name, pair_counts):
    machine = MACHINES[name]
    states = sorted(machine.states) + [UNKNOWN_STATE]
    store = STORES.get(name)
    rejected = 0
    for src in states:
        for dst in states:
            if machine.allows(src, dst):
                continue
            if store is None:
                with pytest.raises(IllegalTransition):
                    machine.assert_transition(src, dst)
            else:
                with CaptureQueriesContext(connections[store.db()]) as queries:
                    with pytest.raises(IllegalTransition):
                        store.transition(org_id=ORG, pk=1, src=src, dst=dst, version=1,
                                         set_fields=reason_fields(machine, dst))
                assert len(queries) == 0, f"{name}: {src} -> {dst} reached SQL"
            rejected += 1
    assert rejected == len(states) ** 2 - len(machine.pairs())
    pair_counts[name]["rejected"] = rejected
    if store is None:
        for src, dst in machine.pairs():
            machine.assert_transition(src, dst)
        pair_counts[name]["table_only"] = len(machine.pairs())


@pytest.mark.django_db(databases=["default", "control"])
@pytest.mark.parametrize("name", STORED)
def test_listed_pairs_are_accepted_by_the_store(name, pair_counts):
    machine, store = MACHINES[name], STORES[name]
    builder = rows.RowBuilder(ORG)
    if not machine.pairs():
        # An insert-only machine: rows are created in their final state and never move (e.g. an
        # InboxAcceptance, accepted or a rejected tombstone). Every state must be terminal and insertable.
        assert machine.initial == machine.states == machine.terminal, name
        for state in sorted(machine.initial):
            assert store.model.objects.get(org_id=ORG, pk=builder.row(store, state).pk).state == state
        pair_counts[name]["accepted"] = 0
        return
    accepted = 0
    for src, dst in machine.pairs():
        row = builder.row(store, src)
        new_version = store.transition(org_id=ORG, pk=row.pk, src=src, dst=dst, version=1,
                                       set_fields=reason_fields(machine, dst))
        stored = store.model.objects.get(org_id=ORG, pk=row.pk)
        assert (stored.state, stored.version, new_version) == (dst, 2, 2), f"{name}: {src} -> {dst}"
        accepted += 1
    assert accepted == len(machine.pairs()) > 0
    pair_counts[name]["accepted"] = accepted


@pytest.mark.django_db(databases=["default", "control"])
@pytest.mark.parametrize("name", STORED)
def test_rows_are_created_only_in_initial_states(name):
    machine, store = MACHINES[name], STORES[name]
    for state in sorted(machine.states - machine.initial):
        with CaptureQueriesContext(connections[store.db()]) as queries:
            with pytest.raises(IllegalTransition):
                store.create(org_id=ORG, state=state)
        assert len(queries) == 0
