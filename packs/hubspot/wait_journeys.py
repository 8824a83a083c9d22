"""HubSpot journeys whose push waits (``manage.py journeys run push-after-cooling-off | push-when-customer``).

Set-up: as :mod:`packs.hubspot.journeys`, with ``journey_service_waits.json``
whose Flow ``Contact_Push_Customer_After_Cooling_Off`` (written in
Salesforce's metadata format) waits on a Wait element's ``AlarmEvent``
(``$Flow.CurrentDateTime`` plus 0.002 hours, about seven seconds: a real
wait, the journey's processes run on the real database clock) before it
pushes the customer contact, then waits for the provider's answer (the
owner's completion receipt).

``push-after-cooling-off``
    A contact becomes a customer. While its run waits for the cooling-off
    time, the flow worker is killed and a new one started; while the push's
    create is held in flight at the provider (its delay fault) and the run
    waits for the owner's receipt, the flow and runtime workers are killed and
    restarted. The run resumes from its rows each time: one create POST, one
    contact at the provider, one RemoteEffect, and the run succeeded.

``push-when-customer`` (``journey_service_record_wait.json``, Flow
``Contact_Push_When_Customer``)
    A contact becomes an opportunity; its run waits on a record event (the
    contact's ``lifecyclestage`` becomes ``customer``, producer
    ``record.condition``) while the flow worker is killed and restarted. The
    CRM's webhook then makes it a customer: the inbound save signals the run,
    which waits for its cooling-off time (flow worker killed again), pushes and
    waits for the owner's receipt. One create POST, one remote effect, and the
    record event resolved by the signal of the save that made it a customer.
"""
from __future__ import annotations

from packs.hubspot.journeys import PACK_DIR, crm, local_contact, provider_report, push_facts
from packs.hubspot.journeys import stage as hubspot_stage
from packs.journeys import Harness, Journey, register

SERVICE_FILE = PACK_DIR / "journey_service_waits.json"
RECORD_WAIT_SERVICE_FILE = PACK_DIR / "journey_service_record_wait.json"
PRODUCER_CLOCK, PRODUCER_RECEIPT = "runtime.clock", "runtime.intent_result"
PRODUCER_RECORD = "record.condition"


def stage(h: Harness) -> None:
    hubspot_stage(h, SERVICE_FILE)


def stage_record_wait(h: Harness) -> None:
    hubspot_stage(h, RECORD_WAIT_SERVICE_FILE)


def _waiting_on(producer_kind: str) -> bool:
    from nexusflow.flows.models import FlowDependency, FlowRun

    return (FlowRun.objects.filter(state="Waiting").exists()
            and FlowDependency.objects.filter(state="waiting", producer_kind=producer_kind).exists())


def push_after_cooling_off(h: Harness) -> None:
    from connectors.models import RemoteEffect
    from nexusflow.flows.models import FlowDependency, FlowRun
    from runtime_outbox.models import OutboundCommand

    c = crm(h)
    c.contact_created(9301, email="lin@example.com", firstname="Lin", lastname="Cho")
    h.wait_idle()
    c.contact_changed(9301, lifecyclestage="customer")
    h.wait_until("the push run waits for its cooling-off time", lambda: _waiting_on(PRODUCER_CLOCK))
    h.restart_worker("flow", during="while the run waits for its cooling-off time")
    c.set_faults(delay_seconds=4)  # hold the create in flight at the provider
    h.wait_until("the create reached the provider", lambda: c.pushed_creates() == 1, timeout=60)
    h.check("the run waits for the owner's receipt while the create is in flight", _waiting_on(PRODUCER_RECEIPT),
            "no waiting runtime.intent_result dependency")
    h.restart_worker("flow", during="while the create is held in flight and the run waits for the receipt")
    h.restart_worker("runtime", during="while the create is held in flight and the run waits for the receipt")
    c.set_faults(delay_seconds=0)
    h.wait_idle()
    record = local_contact(9301)
    runs = list(FlowRun.objects.filter(record_key=record.record_key).values_list("state", flat=True))
    h.check_equal("one push run, succeeded", runs, ["Succeeded"])
    waits = sorted(FlowDependency.objects.filter(run__record_key=record.record_key)
                   .values_list("producer_kind", "state"))
    h.check_equal("the run waited on the clock, then on the receipt; both resolved", waits,
                  [(PRODUCER_CLOCK, "satisfied"), (PRODUCER_RECEIPT, "satisfied")])
    clock = FlowDependency.objects.filter(run__record_key=record.record_key, producer_kind=PRODUCER_CLOCK).first()
    command = OutboundCommand.objects.filter(source_record_key=record.record_key).first()
    h.check("the intent was authored only after the cooling-off time resolved",
            clock is not None and command is not None and clock.resolved_at is not None
            and command.created_at >= clock.resolved_at >= clock.deadline,
            f"clock wait {clock and (clock.deadline, clock.resolved_at)}, intent {command and command.created_at}")
    h.check_equal("NexusFlow sent exactly one create POST", c.pushed_creates(), 1)
    h.check_equal("one intent and one remote effect", (
        OutboundCommand.objects.filter(source_record_key=record.record_key).count(),
        RemoteEffect.objects.filter(command__source_record_key=record.record_key).count()), (1, 1))
    facts = push_facts(9301)
    live = [x for x in c.state()["contacts"] if not x["archived"]]
    h.check_equal("the provider holds exactly one contact", len(live), 1)
    h.check("the push finalized against that contact",
            len(facts["receipts"]) == 1 and facts["receipts"][0] == ("finalized", live[0]["id"] if live else None),
            f"{facts['receipts']}")


def push_when_customer(h: Harness) -> None:
    from connectors.models import RemoteEffect
    from nexusflow.flows.models import FlowDependency, FlowRun, FlowWakeSignal
    from nexusflow.records.models import Record
    from runtime_outbox.models import OutboundCommand

    c = crm(h)
    c.contact_created(9302, email="ada@example.com", firstname="Ada", lastname="Moss")
    h.wait_idle()
    c.contact_changed(9302, lifecyclestage="opportunity")
    h.wait_until("the run waits for the contact to become a customer", lambda: _waiting_on(PRODUCER_RECORD))
    h.restart_worker("flow", during="while the run waits for the contact to become a customer")
    record = local_contact(9302)
    h.check_equal("nothing was pushed while the contact was an opportunity", c.pushed_creates(), 0)
    c.contact_changed(9302, lifecyclestage="customer")
    h.wait_until("the run waits for its cooling-off time", lambda: _waiting_on(PRODUCER_CLOCK))
    h.restart_worker("flow", during="while the run waits for its cooling-off time")
    h.wait_idle()
    runs = list(FlowRun.objects.filter(record_key=record.record_key).values_list("state", flat=True))
    h.check_equal("one push run, succeeded", runs, ["Succeeded"])
    waits = sorted(FlowDependency.objects.filter(run__record_key=record.record_key)
                   .values_list("producer_kind", "state"))
    h.check_equal("the run waited on the record, the clock and the receipt; all resolved", waits,
                  [(PRODUCER_RECORD, "satisfied"), (PRODUCER_CLOCK, "satisfied"), (PRODUCER_RECEIPT, "satisfied")])
    record_wait = FlowDependency.objects.get(run__record_key=record.record_key, producer_kind=PRODUCER_RECORD)
    consumed = list(FlowWakeSignal.objects.filter(dependency=record_wait).values_list("state", "wake_version"))
    stage_now = Record.objects.get(pk=record.pk).fields.get("lifecyclestage")
    h.check("the record event resolved on the signal of the save that made the contact a customer",
            record_wait.resolution["event"] == "Became_Customer" and len(consumed) == 1
            and consumed[0] == ("consumed", record_wait.resolution["record_version"]) and stage_now == "customer",
            f"resolution {record_wait.resolution}, consumed signals {consumed}, lifecyclestage {stage_now!r}")
    h.check_equal("NexusFlow sent exactly one create POST", c.pushed_creates(), 1)
    h.check_equal("one intent and one remote effect", (
        OutboundCommand.objects.filter(source_record_key=record.record_key).count(),
        RemoteEffect.objects.filter(command__source_record_key=record.record_key).count()), (1, 1))
    live = [x for x in c.state()["contacts"] if not x["archived"]]
    h.check_equal("the provider holds exactly one contact", len(live), 1)


register(Journey("push-when-customer",
                 "A push waits until its contact becomes a customer (a record event met by the CRM's webhook), then "
                 "for a cooling-off time and the provider's answer, with the flow worker killed in the waits; one "
                 "create, one remote effect.", stage_record_wait, push_when_customer, provider_report))
register(Journey("push-after-cooling-off",
                 "A customer push waits for a cooling-off time and then for the provider's answer, with the flow "
                 "and runtime workers killed in both waits; one create, one remote effect.", stage,
                 push_after_cooling_off, provider_report))
