"""Ports and worker registries: what lower apps ask, and who answers (ARCHITECTURE.md section 2).

A lower app declares a single-provider port; the higher app registers into
it in ``AppConfig.ready()``. Asking a port nobody answers is a clear error
naming the expected provider; a second, different provider is refused. The
worker roles and open-work counters are registered per app into
:mod:`nexusflow.kernel.workers`: the roles are exactly the ones ``run_workers``
offers, and ``open_work`` counts one open row of each kind.
"""
from __future__ import annotations

import pytest

from nexusflow.kernel.ports import Port, PortAlreadyRegistered, PortNotRegistered
from nexusflow.kernel.store import load_all_stores
from nexusflow.kernel.workers import (
    open_work,
    open_work_kinds,
    register_open_work,
    register_role,
    roles,
    units_for,
)

from . import rows

ORG = "ports-org"


def _ports():
    """``(name, port, ask, a different provider)`` for every single-provider port of the code base."""
    from nexusflow.kernel import workers
    from nexusflow.records import owner, remote_links
    from runtime_outbox import ports, replay_guard

    def nothing(**kwargs):
        return None

    return [
        ("records owner work", owner._OWNER_WORK,
         lambda: owner.owner_intents_read(org_id=ORG, object_name="X", record_key="k"),
         lambda: owner.register_owner_work(check=nothing, read=nothing)),
        ("records remote links", remote_links._REMOTE_LINKS, remote_links.remote_links,
         lambda: remote_links.register_remote_links(remote_links.RemoteLinks(nothing, nothing, nothing, nothing,
                                                                             nothing))),
        ("push-binding freezer", ports._FREEZER,
         lambda: ports.push_binding_freeze(org_id=ORG, contract_key="c", record=None, intent_key="k",
                                           effect_root_id="", effect_generation_id="", successor=None, origin=None),
         lambda: ports.register_push_binding_freezer(nothing)),
        ("no-effect proof", ports._NO_EFFECT_PROOF,
         lambda: ports.no_effect_unsettled_attempt(org_id=ORG, command_id=1),
         lambda: ports.register_no_effect_proof(nothing)),
        ("predecessor effect", ports._PREDECESSOR,
         lambda: ports.predecessor_effect(org_id=ORG, command=None),
         lambda: ports.register_predecessor_effect(nothing)),
        ("inbound links", ports._INBOUND_LINKS,
         lambda: ports.inbound_link_find(org_id=ORG, owner_key="o", destination_slot_id="d", remote_scope="s",
                                         remote_id="r"),
         lambda: ports.register_inbound_links(find=nothing, create=nothing)),
        ("flow-run trigger", replay_guard._FLOW_TRIGGER,
         lambda: replay_guard.outbound_authoring_check(org_id=ORG, origin_flow_run_id=1),
         lambda: replay_guard.register_flow_trigger_lookup(nothing)),
        ("worker processes", workers._PROCESSES, lambda: workers.holder_termination_proof("w"),
         lambda: workers.register_worker_processes(register=nothing, termination_proof=nothing)),
    ]


PORTS = _ports()
PORT_IDS = [p[0] for p in PORTS]

EXPECTED_PROVIDERS = {"records owner work": "runtime_outbox", "records remote links": "connectors",
                      "push-binding freezer": "connectors", "no-effect proof": "connectors",
                      "predecessor effect": "connectors", "inbound links": "connectors",
                      "flow-run trigger": "nexusflow.flows", "worker processes": "connectors"}


# --- single-provider ports ---------------------------------------------------------------
def test_a_port_with_nothing_registered_names_the_app_that_should_answer():
    port: Port = Port("widget lookup", provider="widgets")
    with pytest.raises(PortNotRegistered, match="no widget lookup is registered: the widgets app registers it"):
        port.get()
    port.register(len)
    assert port.get() is len


@pytest.mark.parametrize("name,port,ask,other", PORTS, ids=PORT_IDS)
def test_every_port_is_answered_by_its_app_and_fails_clearly_without_it(name, port, ask, other):
    assert port.registered, f"{name}: nothing registered after the apps' ready()"
    assert port.provider == EXPECTED_PROVIDERS[name]
    with port.replaced(None):
        with pytest.raises(PortNotRegistered, match=f"the {port.provider} app registers it"):
            ask()


@pytest.mark.parametrize("name,port,ask,other", PORTS, ids=PORT_IDS)
def test_a_second_provider_of_a_port_is_refused(name, port, ask, other):
    registered = port.get()
    with pytest.raises(PortAlreadyRegistered, match="only one app may answer it"):
        other()
    assert port.get() is registered
    port.register(registered)  # the same provider again (a repeated ready()) is a no-op
    assert port.get() is registered


# --- worker roles --------------------------------------------------------------------------
#: The units each role runs, in priority order (as before the registry).
ROLE_UNITS = {
    "connector": ["receipt.reconcile", "window.close", "dependency.expire", "execution.run", "execution.recover"],
    "runtime": ["outbox.deliver", "outbox.reconcile"],
    "flow": ["flow.wake", "flow.resume_due", "flow.step", "flow.recover", "flow.expire", "flow.repair",
             "flow.cancel_cleanup", "flow.schedule"],
    "egress": ["permit.abandon", "effect.finalize", "effect.reconcile", "effect.dispatch"],
    "egress-deferred": ["permit.abandon", "effect.finalize", "effect.reconcile", "effect.dispatch"],
    "stream": ["stream.poll"],
}


def _run_workers_role_choices() -> list[str]:
    from runtime_outbox.management.commands.run_workers import Command

    parser = Command().create_parser("manage.py", "run_workers")
    (action,) = [a for a in parser._actions if "--role" in a.option_strings]
    return list(action.choices)


#: The V1 runtime being retired: starting the role records its process generation (a database row).
V1_UNITS = ["v1.event.recover", "v1.event.complete", "v1.event.run", "v1.stream.poll"]


def test_the_role_registry_lists_exactly_the_roles_run_workers_offers():
    assert roles() == (*ROLE_UNITS, "v1")
    assert _run_workers_role_choices() == [*roles(), "all"]
    # ``--role all`` leaves out the narrow deferred-association egress worker.
    assert roles(all_only=True) == ("connector", "runtime", "flow", "egress", "stream")


@pytest.mark.parametrize("role", list(ROLE_UNITS))
def test_each_role_yields_its_named_units(role):
    units = units_for(role, "w-1")
    assert [name for name, _unit in units] == ROLE_UNITS[role]
    assert all(callable(unit) for _name, unit in units)


@pytest.mark.django_db(databases=["default", "control"])  # the V1 start check reads the control database
def test_the_v1_role_yields_its_units_and_records_its_process_generation():
    from connectors.models import V1ProcessGeneration

    units = units_for("v1", "v1:w-1")
    assert [name for name, _unit in units] == V1_UNITS
    assert V1ProcessGeneration.objects.get().worker_id == "v1:w-1"


def test_the_role_registry_refuses_an_unknown_role_and_a_second_factory():
    with pytest.raises(ValueError, match="unknown worker role 'nope'"):
        units_for("nope", "w-1")
    with pytest.raises(ValueError, match="worker role 'runtime' is registered already"):
        register_role("runtime", lambda worker_id: [], order=20)
    assert [name for name, _ in units_for("runtime", "w-1")] == ["outbox.deliver", "outbox.reconcile"]


# --- open work ---------------------------------------------------------------------------
def test_every_app_registers_its_open_work():
    assert set(open_work_kinds(parked=False)) == {"executions", "effects", "permits", "outbox", "flow_runs"}
    assert set(open_work_kinds(parked=True)) == {"uncertain_effects", "reconcilable", "v1_events", "v1_calls"}
    with pytest.raises(ValueError, match="open-work counter 'outbox' is registered already"):
        register_open_work("outbox", lambda: 0)
    with pytest.raises(ValueError, match="no parked open-work counter"):
        open_work(parked=("outbox",))


#: ``kind: (machine, open states, settled states)``; every state of each machine is listed once.
KINDS = {
    "executions": ("connectors.Execution", ("ready", "waiting_dependency"), ("completed", "quarantined", "superseded")),
    "effects": ("connectors.RemoteEffect", ("prepared", "dispatching", "remote_confirmed"),
                ("uncertain", "finalized", "no_effect", "quarantined")),
    "permits": ("connectors.DispatchPermit", ("granted", "sending"), ("returned", "abandoned")),
    "outbox": ("runtime_outbox.OutboxMessage", ("pending", "reconciling"),
               ("delivered", "handoff_rejected", "dead_lettered")),
    "flow_runs": ("flows.FlowRun", ("Accepted", "Runnable", "Running", "Waiting", "CancelRequested"),
                  ("Succeeded", "TerminalFailed", "Quarantined", "Cancelled")),
}


def test_the_kinds_cover_every_state_of_their_machines():
    from nexusflow.kernel.transitions import load_all_machines

    machines = load_all_machines()
    for kind, (machine, open_states, settled) in KINDS.items():
        assert set(open_states) | set(settled) == machines[machine].states, kind
        assert set(settled) == machines[machine].settled, kind


@pytest.mark.django_db(databases=["default", "control"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_open_work_counts_an_open_row_of_each_kind_and_no_settled_one(kind):
    machine, open_states, settled = KINDS[kind]
    store = load_all_stores()[machine]
    builder = rows.RowBuilder(ORG)
    before = open_work()[kind]
    for state in open_states:
        builder.row(store, state)
    assert open_work()[kind] == before + len(open_states)
    for state in settled:
        builder.row(store, state)
    assert open_work()[kind] == before + len(open_states)


@pytest.mark.django_db(databases=["default", "control"])
def test_parked_uncertain_effects_count_only_when_the_caller_names_them():
    from connectors import reasons
    from connectors.models import RemoteEffect

    before_all = open_work(parked=("uncertain_effects", "reconcilable"))
    rows.make(RemoteEffect, org_id=ORG, state="uncertain", version=1, reason_code=reasons.CREATE_CONFLICT_EXISTING)
    rows.make(RemoteEffect, org_id=ORG, state="uncertain", version=1, reason_code=reasons.RESPONSE_AMBIGUOUS)

    after = open_work(parked=("uncertain_effects", "reconcilable"))
    assert after["uncertain_effects"] == before_all["uncertain_effects"] + 2
    assert after["reconcilable"] == before_all["reconcilable"] + 1  # only the create conflict resolves by itself
    assert after["effects"] == before_all["effects"]
    unnamed = open_work()
    assert "uncertain_effects" not in unnamed and "reconcilable" not in unnamed
    assert open_work(parked=("reconcilable",))["reconcilable"] == after["reconcilable"]
