"""The corpus flows that compile to a profile, deployed and run against generated records (issue #8 evidence).

Each of the twelve files of ``tests/corpus/flows`` that compiles (see
``fixtures/corpus_inventory.json``) is deployed for a test org against the
metadata view in ``fixtures/corpus_metadata`` (the objects and fields the
flows name), exactly as ``flow_deploy`` does in production:

- Embedded Before-Save flows must change the saved record inside the same
  save (one write, record version 1 on create) and leave no FlowRun row;
  records that miss the entry conditions keep the values they were saved with.
- Autolaunched flows (no start object) are started by the operator with
  input variables (``flow_run_start``, ``flows start``), driven by the
  in-process workers, and must end ``Succeeded`` with the record outcomes the
  metadata prescribes; a second start with the same request id returns the
  same run and writes nothing.
- A flow this engine generation cannot run is refused at activation with the
  precise ``engine_unsupported:*`` diagnostics; nothing is persisted or
  activated, and saving records its trigger would match starts no run and
  changes nothing.

The expected outcomes are written from the Flow metadata (the branch each
record takes), independently of the interpreter. Records are generated from
fixed seeds, with the decision boundaries added explicitly.
"""
from __future__ import annotations

import datetime as dt
import inspect
import io
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from nexusflow.flows import transitions as t
from nexusflow.flows.compiler import PROFILE_ATOMIC, PROFILE_DURABLE, PROFILE_EMBEDDED
from nexusflow.flows.conditions import condition_holds
from nexusflow.flows.errors import ActivationRejected, FlowInputRejected, FlowNotStartable, FlowStartConflict
from nexusflow.flows.handlers import traverses_relationship
from nexusflow.flows.models import FlowActivation, FlowCheckpoint, FlowExecutionPlan, FlowRun
from nexusflow.flows.services import flow_compile_check, flow_deploy, flow_run_start, plan_inputs
from nexusflow.kernel.clock import db_now
from nexusflow.kernel.scope import OrgScope
from nexusflow.records.models import Record
from runtime_outbox.models import OutboundCommand

from .conftest import CORPUS, run_until_idle, save_record, serve_message_relay, update_record

FIXTURES = Path(__file__).parent / "fixtures"
ORG = OrgScope("corpus-org")
INVENTORY = json.loads((FIXTURES / "corpus_inventory.json").read_text(encoding="utf-8"))
PROFILED = {row["flow"]: row for row in INVENTORY if row["profile"]}
#: Every corpus file by API name: subflow elements resolve against the folder, as the inventory does.
CORPUS_SOURCES = {Path(row["file"]).name.rsplit("__", 1)[-1].removesuffix(".flow-meta.xml"): Path(row["file"])
                  for row in INVENTORY}


def _source(name: str) -> bytes:
    return (CORPUS / CORPUS_SOURCES[name].name).read_bytes()


def _subflows() -> dict[str, bytes]:
    return {name: _source(name) for name in CORPUS_SOURCES}


def _deploy(name: str):
    return flow_deploy(org=ORG, source=_source(name), flow_api_name=name, subflows=_subflows())


def _stored(record) -> dict:
    row = Record.objects.get(org_id=ORG.org_id, object_name=record.object_name, record_key=record.record_key)
    return {"fields": row.fields, "version": row.version}


def _num(text: str | None) -> Decimal | None:
    return None if text in (None, "") else Decimal(text)


def _assert_no_flow_rows() -> None:
    """Embedded Before-Save runs inside the save: no FlowRun root, no checkpoint, nothing for workers."""
    assert not FlowRun.objects.exists()
    assert not FlowCheckpoint.objects.exists()
    assert run_until_idle() == 0


# =============================================================================
# Embedded Before-Save flows
# =============================================================================
def _run_before_save(name: str, object_name: str, creates: list[dict], expect: Callable[[dict, dict | None], tuple],
                     branches: set[str], updates: list[tuple[int, dict]] = (), existing: list[dict] = ()) -> None:
    """Deploy ``name``, create every record of ``creates``, then apply ``updates`` ``(index, changes)``.

    ``existing`` records are saved before the deploy (the flow is not active yet, they keep their values);
    ``updates`` index ``existing + creates``. ``expect(fields_saved, prior)`` returns ``(branch, fields)``:
    the path the Flow metadata takes and the fields it must leave on the record. Every one of
    ``branches`` must be taken at least once.
    """
    before_deploy = [save_record(ORG, values, object_name=object_name) for values in existing]
    assert [record.fields for record in before_deploy] == list(existing)
    deployed = _deploy(name)
    assert deployed.activated and deployed.plan.execution_profile == PROFILE_EMBEDDED
    assert deployed.activation.state == t.ACTIVATION_ACTIVE
    # Setup verification and activation share one compiler result.
    check = flow_compile_check(source=_source(name), flow_api_name=name, org=ORG, subflows=_subflows())
    assert check.plan_digest == deployed.plan.plan_digest

    taken: set[str] = set()
    saved = list(before_deploy)
    for values in creates:
        record = save_record(ORG, values, object_name=object_name)
        branch, want = expect(dict(values), None)
        taken.add(branch)
        assert record.fields == want, (values, record.fields)
        assert _stored(record) == {"fields": want, "version": 1}, values  # one write: the flow ran inside it
        saved.append(record)
    for index, changes in updates:
        record = saved[index]
        before = _stored(record)
        update_record(ORG, record, changes)
        branch, want = expect({**before["fields"], **changes}, before["fields"])
        taken.add(branch)
        after = _stored(record)
        assert after["fields"] == want, (before, changes, after)
        assert after["version"] == before["version"] + (after["fields"] != before["fields"])
    assert taken == branches, taken
    _assert_no_flow_rows()


def _breed_name_update_flow() -> None:
    """Breed__c, before save on create and update: Name = Type__c + " - " + Species__c (blank text for null)."""
    rng = random.Random(8101)
    kinds = ["Dog", "Cat", "Rabbit", "Horse", None]
    species = ["Beagle", "Siamese", "Lop", "Arabian", "Mixed", None]
    creates = [{"Name": f"breed-{i}", "Type__c": rng.choice(kinds), "Species__c": rng.choice(species)}
               for i in range(10)]
    creates.append({"Type__c": "Dog", "Species__c": "Poodle"})  # no Name given: the flow sets it

    def expect(fields, prior):
        return "Update_Breed_Name", {**fields,
                                     "Name": f"{fields.get('Type__c') or ''} - {fields.get('Species__c') or ''}"}

    existing = [{"Name": "legacy name", "Type__c": "Bird", "Species__c": "Parrot"}]
    _run_before_save("Breed_Name_Update_Flow", "Breed__c", creates, expect, {"Update_Breed_Name"},
                     updates=[(0, {"Species__c": "Macaw"}), (1, {"Species__c": "Greyhound"}),
                              (4, {"Type__c": "Cat", "Species__c": "Persian"}), (6, {"Name": "hand-typed"})],
                     existing=existing)


def _tour_request_set_realtor() -> None:
    """Tour_Request__c, before save on create and update: Realtor_User__c = $Record.Property__r.Broker__r
    .Realtor_User__c, two relationship hops (Property__c and Broker__c are lookups in the metadata view), read
    inside the save. A request without a property, a property without a broker, or a lookup naming no record
    leaves the realtor empty, as the Flow metadata's assignment of a null relationship value does."""
    rng = random.Random(8108)
    brokers = [save_record(ORG, {"Name": f"broker-{i}", "Realtor_User__c": f"005{i:015d}"}, object_name="Broker__c")
               for i in range(3)]
    properties = [save_record(ORG, {"Name": f"property-{i}", "Broker__c": b.record_key if b else None},
                              object_name="Property__c") for i, b in enumerate(brokers + [None])]
    realtor = {p.record_key: (p.fields.get("Broker__c") and next(
        b.fields["Realtor_User__c"] for b in brokers if b.record_key == p.fields["Broker__c"])) or None
        for p in properties}
    gone = "a0P999999999999999"  # a well-formed key that names no property
    creates = [{"Name": f"tour-{i}", "Property__c": rng.choice([p.record_key for p in properties] + [None]),
                "Realtor_User__c": rng.choice([None, "005000000000000777"])} for i in range(8)]
    creates += [{"Name": "dangling", "Property__c": gone}, {"Name": "brokerless", "Property__c": properties[3].record_key},
                {"Name": "direct", "Property__c": properties[1].record_key, "Realtor_User__c": "hand-typed"}]

    def expect(fields, prior):
        return "Set_Realtor_From_Property_Broker", {**fields, "Realtor_User__c": realtor.get(fields.get("Property__c"))}

    _run_before_save("Tour_Request_Set_Realtor", "Tour_Request__c", creates, expect,
                     {"Set_Realtor_From_Property_Broker"},
                     updates=[(0, {"Property__c": properties[2].record_key}), (1, {"Name": "renamed"}),
                              (8, {"Property__c": properties[0].record_key}), (9, {"Property__c": None})])


def _populate_vehicle_range() -> None:
    """Vehicle__c, before save when Price__c is not null: < 10000 Short, (10000, 25000] Medium, > 25000 Long."""
    rng = random.Random(8102)
    prices = [str(rng.randint(1000, 60000)) for _ in range(9)]
    prices += ["9999.99", "10000", "10000.01", "25000", "25000.01", None, ""]  # boundaries and no price

    def expect(fields, prior):
        price = _num(fields.get("Price__c"))
        if price is None:
            return "not_entered", fields  # the start filter Price__c IsNull false does not hold
        if price < 10000:
            return "Short_Range", {**fields, "Range__c": "Short_Range"}
        if 10000 < price <= 25000:
            return "Medium_Range", {**fields, "Range__c": "Medium_Range"}
        if price > 25000:
            return "Long_Range", {**fields, "Range__c": "Long_Range"}
        return "default", fields  # exactly 10000: no outcome matches, the record keeps its Range__c

    creates = [{"Name": f"vehicle-{i}", "Price__c": p, "Range__c": "Unknown"} for i, p in enumerate(prices)]
    _run_before_save("Populate_Vehicle_Range", "Vehicle__c", creates, expect,
                     {"Short_Range", "Medium_Range", "Long_Range", "default", "not_entered"},
                     updates=[(0, {"Price__c": "5000"}), (1, {"Price__c": "20000"}), (2, {"Price__c": "90000"}),
                              (len(prices) - 2, {"Price__c": "12000"}), (3, {"Range__c": "Hand_Set"}),
                              (4, {"Price__c": None, "Range__c": "Cleared"})])


def _pmt_task_before_automation() -> None:
    """PMT_Task__c, before save: keep Status__c and Percentage_Completion__c in step (four chained decisions)."""
    statuses = ["Not Started", "In Progress", "On Hold", "Completed", "Closed, not Completed"]
    rng = random.Random(8103)
    # Saved before the flow is active: a closed task at 100% (the flow itself would have completed it).
    existing = [{"Name": "legacy-closed", "Status__c": "Closed, not Completed", "Percentage_Completion__c": "100"},
                {"Name": "legacy-closed-half", "Status__c": "Closed, not Completed", "Percentage_Completion__c": "60"}]
    creates = [{"Name": f"task-{i}", "Status__c": rng.choice(statuses),
                "Percentage_Completion__c": rng.choice(["0", "25", "50", "99", "100", None])} for i in range(10)]
    creates += [{"Name": "started-half", "Status__c": "Not Started", "Percentage_Completion__c": "50"},
                {"Name": "done-by-status", "Status__c": "Completed", "Percentage_Completion__c": "10"},
                {"Name": "done-by-percent", "Status__c": "In Progress", "Percentage_Completion__c": "100"},
                {"Name": "untouched", "Status__c": "On Hold", "Percentage_Completion__c": "40"},
                {"Name": "reopen-completed", "Status__c": "Completed", "Percentage_Completion__c": "100"}]
    reopen_completed = len(existing) + len(creates) - 1
    untouched = reopen_completed - 1

    def expect(fields, prior):
        status, pct = fields.get("Status__c"), _num(fields.get("Percentage_Completion__c"))
        prior_status = (prior or {}).get("Status__c")
        prior_pct = _num((prior or {}).get("Percentage_Completion__c"))
        reopened = status in ("Not Started", "On Hold", "In Progress")
        if prior is not None and prior_status == "Completed" and reopened:
            return "Status_Changed_from_Completed_to_Not_Started", {**fields, "Percentage_Completion__c": "0"}
        if prior is not None and prior_status == "Closed, not Completed" and reopened and prior_pct == 100:
            return "Status_Changed_from_Closed_to_Not_Completed", {**fields, "Percentage_Completion__c": "0"}
        if pct == 100 or status == "Completed":
            return "Status_Is_Completed_OR_Percentage_Is_100", {**fields, "Percentage_Completion__c": "100",
                                                                "Status__c": "Completed"}
        if pct is not None and 0 < pct < 100 and status == "Not Started":
            return "Task_Completion_In_Between_0_to_100", {**fields, "Status__c": "In Progress"}
        return "no_change", fields

    _run_before_save("PMT_Task_Before_Automation", "PMT_Task__c", creates, expect,
                     {"Status_Changed_from_Completed_to_Not_Started", "Status_Changed_from_Closed_to_Not_Completed",
                      "Status_Is_Completed_OR_Percentage_Is_100", "Task_Completion_In_Between_0_to_100", "no_change"},
                     updates=[(reopen_completed, {"Status__c": "In Progress"}),
                              (0, {"Status__c": "On Hold"}),  # closed at 100% reopened: back to 0%
                              (1, {"Status__c": "In Progress"}),  # closed at 60% reopened: unchanged
                              (2, {"Percentage_Completion__c": "100"}),
                              (untouched, {"Status__c": "Not Started", "Percentage_Completion__c": "30"})],
                     existing=existing)


# =============================================================================
# Autolaunched flows started by the operator with input variables
# =============================================================================
def _deploy_autolaunched(name: str, profile: str, inputs: dict[str, dict]) -> None:
    deployed = _deploy(name)
    assert deployed.activated and deployed.plan.execution_profile == profile
    assert deployed.plan.plan_payload["trigger"] == {"trigger_type": "none"}
    # The plan records the metadata's input variables: name, data type, isCollection (and record object).
    assert plan_inputs(deployed.plan.plan_payload) == inputs


def _context_vars(run: FlowRun) -> dict:
    """The variables of the run's last checkpoint that carries an interpreter context."""
    for payload in (FlowCheckpoint.objects.filter(org_id=ORG.org_id, run_id=run.pk).order_by("-sequence")
                    .values_list("context_payload", flat=True)):
        if "context" in payload:
            return payload["context"]["vars"]
    raise AssertionError("no checkpoint context")


def _start_and_drive(name: str, inputs: dict, request_id: str) -> FlowRun:
    """Start ``name``, drive the workers until idle, check the run succeeded and that a retried start converges."""
    started = flow_run_start(org=ORG, flow_api_name=name, inputs=inputs, request_id=request_id)
    assert started.created and started.run.state == t.RUN_RUNNABLE
    first = FlowCheckpoint.objects.get(org_id=ORG.org_id, run_id=started.run.pk, sequence=1).context_payload
    assert set(first["context"]["vars"]) == set(inputs) | {k for k, d in _inputs_of(name).items() if d["collection"]}
    assert run_until_idle() > 0
    run = FlowRun.objects.get(org_id=ORG.org_id, pk=started.run.pk)
    assert (run.state, run.legacy_status, run.reason_code) == (t.RUN_SUCCEEDED, t.LEGACY_FINISHED, ""), run.state
    again = flow_run_start(org=ORG, flow_api_name=name, inputs=inputs, request_id=request_id)
    assert (again.run.pk, again.created, again.run.state) == (run.pk, False, t.RUN_SUCCEEDED)
    assert run_until_idle() == 0
    return run


def _inputs_of(name: str) -> dict:
    plan = FlowActivation.objects.get(org_id=ORG.org_id, flow_api_name=name, state=t.ACTIVATION_ACTIVE).plan
    return plan_inputs(plan.plan_payload)


def _assert_start_refused(name: str, inputs: dict, code: str, error=FlowInputRejected) -> None:
    runs = FlowRun.objects.count()
    with pytest.raises(error) as caught:
        flow_run_start(org=ORG, flow_api_name=name, inputs=inputs, request_id=f"bad-{code}")
    assert caught.value.code == code
    assert FlowRun.objects.count() == runs  # nothing written


def _tenant_contact_set_is_current() -> None:
    """Input Tenant_Contact_ID (String): read that contact; Is_Current_Contact__c = (End null or End >= today)
    and Start <= today, written back with one update (the lookup's own record, a late lock discovery)."""
    _deploy_autolaunched("TTS_Tenant_Contact_Set_IsCurrent_Field", PROFILE_ATOMIC,
                         {"Tenant_Contact_ID": {"data_type": "String", "collection": False, "object": None}})
    today = db_now().date()
    day = dt.timedelta(days=1)
    rng = random.Random(8106)
    values = [{"Name": f"tenant-{i}", "Start_Date__c": (today + rng.randint(-400, 30) * day).isoformat(),
               "End_Date__c": rng.choice([None, (today + rng.randint(-200, 200) * day).isoformat()]),
               "Is_Current_Contact__c": "unset"} for i in range(8)]
    values += [  # the decision boundaries
        {"Name": "starts-today", "Start_Date__c": today.isoformat(), "End_Date__c": None},
        {"Name": "starts-tomorrow", "Start_Date__c": (today + day).isoformat(), "End_Date__c": None},
        {"Name": "ends-today", "Start_Date__c": "2020-01-01", "End_Date__c": today.isoformat()},
        {"Name": "ended-yesterday", "Start_Date__c": "2020-01-01", "End_Date__c": (today - day).isoformat(),
         "Is_Current_Contact__c": "true"},
        {"Name": "blank-end", "Start_Date__c": "2020-01-01", "End_Date__c": ""},
    ]
    contacts = [save_record(ORG, v, object_name="TTS_Space_Tenant_Contact__c") for v in values]
    bystander = save_record(ORG, {"Name": "bystander", "Start_Date__c": "2020-01-01"},
                            object_name="TTS_Space_Tenant_Contact__c")
    taken = set()
    for contact, given in zip(contacts, values, strict=True):
        _start_and_drive("TTS_Tenant_Contact_Set_IsCurrent_Field", {"Tenant_Contact_ID": contact.record_key},
                         request_id=f"tenant-{contact.record_key}")
        end, start = given.get("End_Date__c"), dt.date.fromisoformat(given["Start_Date__c"])
        current = (end in (None, "") or dt.date.fromisoformat(end) >= today) and start <= today
        taken.add(current)
        assert _stored(contact) == {"fields": {**given, "Is_Current_Contact__c": "true" if current else "false"},
                                    "version": 2}, given
    assert taken == {True, False}
    assert _stored(bystander)["version"] == 1  # only the contact named by the input is read and written
    # A contact key that names no record: the lookup finds nothing and the update faults (no write).
    started = flow_run_start(org=ORG, flow_api_name="TTS_Tenant_Contact_Set_IsCurrent_Field",
                             inputs={"Tenant_Contact_ID": "a0S-missing"}, request_id="tenant-missing")
    run_until_idle()
    assert FlowRun.objects.get(org_id=ORG.org_id, pk=started.run.pk).state == t.RUN_TERMINAL_FAILED
    _assert_start_refused("TTS_Tenant_Contact_Set_IsCurrent_Field", {}, "flow_input_missing")
    _assert_start_refused("TTS_Tenant_Contact_Set_IsCurrent_Field", {"Tenant_Contact_ID": 7}, "flow_input_type")
    _assert_start_refused("TTS_Tenant_Contact_Set_IsCurrent_Field",
                          {"Tenant_Contact_ID": contacts[0].record_key, "Other": "x"}, "flow_input_unknown")


def _track_shipment() -> None:
    """Inputs tracking_number, carrier (String); one assignment sets the outputs; no record is read or written."""
    _deploy_autolaunched("TrackShipment", PROFILE_ATOMIC,
                         {"carrier": {"data_type": "String", "collection": False, "object": None},
                          "tracking_number": {"data_type": "String", "collection": False, "object": None}})
    rng = random.Random(8107)
    from nexusflow.records.models import Record
    records = Record.objects.count()
    for i in range(4):
        inputs = {"tracking_number": f"1Z{rng.randint(10**9, 10**10 - 1)}", "carrier": rng.choice(["UPS", "FedEx"])}
        run = _start_and_drive("TrackShipment", inputs, request_id=f"track-{i}")
        assert _context_vars(run) == {**inputs, "status": "In Transit", "estimated_delivery": "2026-02-01",
                                      "success": True}
    assert Record.objects.count() == records
    _assert_start_refused("TrackShipment", {"tracking_number": "1Z1"}, "flow_input_missing")
    _assert_start_refused("TrackShipment", {"tracking_number": "1Z1", "carrier": ["UPS"]}, "flow_input_type")
    _assert_start_refused("TrackShipment", {"tracking_number": "1Z1", "carrier": "UPS", "status": "x"},
                          "flow_input_unknown")  # an output variable is not an input
    # Same request id, other inputs: a conflict, not a second run.
    runs = FlowRun.objects.count()
    with pytest.raises(FlowStartConflict):
        flow_run_start(org=ORG, flow_api_name="TrackShipment", inputs={"tracking_number": "x", "carrier": "UPS"},
                       request_id="track-0")
    assert FlowRun.objects.count() == runs
    # The operator command: prints the run id; a retried start prints the same run; exit 2 on bad input.
    out = io.StringIO()
    call_command("flows", "start", "TrackShipment", "--org", ORG.org_id, "--input", "tracking_number=1Z9",
                 "--input", "carrier=DHL", "--request-id", "cli-1", stdout=out)
    printed = json.loads(out.getvalue())
    assert printed["created"] is True and printed["state"] == t.RUN_RUNNABLE
    run_until_idle()
    out = io.StringIO()
    call_command("flows", "start", "TrackShipment", "--org", ORG.org_id, "--input", "tracking_number=1Z9",
                 "--input", "carrier=DHL", "--request-id", "cli-1", stdout=out)
    assert json.loads(out.getvalue()) == {"run_id": printed["run_id"], "created": False, "state": t.RUN_SUCCEEDED}
    for bad in (["--input", "tracking_number=1Z9"], ["--input", "carrier=DHL", "--input", "nope=1",
                                                      "--input", "tracking_number=1"], ["--input", "carrier"]):
        with pytest.raises(CommandError) as caught:
            call_command("flows", "start", "TrackShipment", "--org", ORG.org_id, *bad)
        assert caught.value.returncode == 2
    with pytest.raises(CommandError) as caught:
        call_command("flows", "start", "Breed_Name_Update_Flow", "--org", ORG.org_id)
    assert caught.value.returncode == 3
    with pytest.raises(FlowNotStartable):
        flow_run_start(org=OrgScope("other-org"), flow_api_name="TrackShipment",
                       inputs={"tracking_number": "1", "carrier": "UPS"})


def _issue_bulk_resort_credits() -> None:
    """Inputs amount (Number) and contactRecords (Contact records): loop the contacts, one Credit__c each with
    Contact__c = the contact's Id and Amount__c = amount, created together; message counts them."""
    _deploy_autolaunched("Issue_Bulk_Resort_Credits", PROFILE_DURABLE,
                         {"amount": {"data_type": "Number", "collection": False, "object": None},
                          "contactRecords": {"data_type": "SObject", "collection": True, "object": "Contact"}})
    from nexusflow.records.models import Record
    rng = random.Random(8108)
    contacts = [save_record(ORG, {"firstname": f"guest-{i}", "lastname": rng.choice(["Reyes", "Okafor", "Lind"]),
                                  "email": f"guest{i}@example.test"}, object_name="Contact") for i in range(6)]
    batches = [(rng.sample(contacts, 3), "50"), (contacts[:1], "125.0"), (contacts, 10)]
    expected: list[dict] = []
    for index, (batch, amount) in enumerate(batches):
        keys = [c.record_key for c in batch]
        run = _start_and_drive("Issue_Bulk_Resort_Credits", {"amount": amount, "contactRecords": keys},
                               request_id=f"credits-{index}")
        text = format(Decimal(str(amount)).normalize(), "f")
        expected += [{"Contact__c": key, "Amount__c": text} for key in keys]
        assert _context_vars(run)["message"] == f"Issued ${text} resort credit to {len(keys)} customers."
    credits = list(Record.objects.filter(org_id=ORG.org_id, object_name="Credit__c").order_by("id")
                   .values_list("fields", "version"))
    assert credits == [(want, 1) for want in expected]
    assert all(_stored(c)["version"] == 1 for c in contacts)  # the contacts are read, never written
    _assert_start_refused("Issue_Bulk_Resort_Credits", {"amount": "lots", "contactRecords": []}, "flow_input_type")
    _assert_start_refused("Issue_Bulk_Resort_Credits", {"amount": True, "contactRecords": []}, "flow_input_type")
    _assert_start_refused("Issue_Bulk_Resort_Credits", {"amount": "5", "contactRecords": contacts[0].record_key},
                          "flow_input_type")
    _assert_start_refused("Issue_Bulk_Resort_Credits", {"amount": "5", "contactRecords": ["003-nobody"]},
                          "flow_input_record_missing")
    _assert_start_refused("Issue_Bulk_Resort_Credits", {"contactRecords": []}, "flow_input_missing")
    assert Record.objects.filter(org_id=ORG.org_id, object_name="Credit__c").count() == len(expected)


def _aim_filter_existing_incident_related_items() -> None:
    """Inputs IncidentId (String), CaseIds and AssetIds (String collections, also outputs): the cases and assets
    already related to the incident (CaseRelatedIssue.RelatedIssueId, IncidentRelatedItem.IncidentId) are
    removed from the lists with RemoveAll, so the outputs name only what is new; nothing is written."""
    _deploy_autolaunched("AIM_FilterExistingIncidentRelatedItems", PROFILE_DURABLE, {
        "AssetIds": {"data_type": "String", "collection": True, "object": None},
        "CaseIds": {"data_type": "String", "collection": True, "object": None},
        "IncidentId": {"data_type": "String", "collection": False, "object": None}})
    from nexusflow.records.models import Record
    rng = random.Random(8109)
    incidents = ["0IN-storm", "0IN-outage"]
    related = {incident: {"cases": rng.sample([f"500-{i}" for i in range(8)], 3),
                          "assets": rng.sample([f"02i-{i}" for i in range(8)], 2)} for incident in incidents}
    for incident, items in related.items():
        for case in items["cases"]:
            save_record(ORG, {"RelatedIssueId": incident, "CaseId": case}, object_name="CaseRelatedIssue")
        for asset in items["assets"]:
            save_record(ORG, {"IncidentId": incident, "AssetId": asset}, object_name="IncidentRelatedItem")
    records = Record.objects.count()
    for index, incident in enumerate(incidents):
        known = related[incident]
        # The candidates: some already related (one of them twice), some new, some related to the other incident.
        other = related[incidents[1 - index]]
        cases = [known["cases"][0], "500-new-a", known["cases"][1], known["cases"][0], other["cases"][0]]
        assets = ["02i-new-b", known["assets"][0], other["assets"][0]]
        run = _start_and_drive("AIM_FilterExistingIncidentRelatedItems",
                               {"IncidentId": incident, "CaseIds": cases, "AssetIds": assets},
                               request_id=f"aim-{index}")
        out = _context_vars(run)
        assert out["CaseIds"] == [c for c in cases if c not in known["cases"]]
        assert out["AssetIds"] == [a for a in assets if a not in known["assets"]]
    # An incident with nothing related: the lists come back whole; empty lists stay empty.
    run = _start_and_drive("AIM_FilterExistingIncidentRelatedItems",
                           {"IncidentId": "0IN-quiet", "CaseIds": ["500-1"], "AssetIds": []}, request_id="aim-quiet")
    assert (_context_vars(run)["CaseIds"], _context_vars(run)["AssetIds"]) == (["500-1"], [])
    assert Record.objects.count() == records  # read only
    _assert_start_refused("AIM_FilterExistingIncidentRelatedItems",
                          {"IncidentId": "0IN-storm", "CaseIds": "500-1", "AssetIds": []}, "flow_input_type")


def _location_change_unit_status() -> None:
    """Inputs unitsForStatusChange (Locations__c records), newStatus, newUnavailabilityReason (String) and
    ignoreAllocatedUnits (Boolean). Unless told to ignore allocations, it collects the units' ids, reads them
    back with an ``Id In`` filter, filters the allocated ones (Allocation__c > 0 and not Unavailable) with a
    Collection Filter and counts them: any allocated unit sets the unitsHaveAllocation output and changes
    nothing. Otherwise every unit gets the new status (Available clears the reason; anything else makes it
    Unavailable with the given reason) in one Update Records of the assembled collection."""
    _deploy_autolaunched("Location_Change_Unit_Status_SubFlow", PROFILE_DURABLE, {
        "ignoreAllocatedUnits": {"data_type": "Boolean", "collection": False, "object": None},
        "newStatus": {"data_type": "String", "collection": False, "object": None},
        "newUnavailabilityReason": {"data_type": "String", "collection": False, "object": None},
        "unitsForStatusChange": {"data_type": "SObject", "collection": True, "object": "Locations__c"}})
    name = "Location_Change_Unit_Status_SubFlow"

    def units(*specs: tuple[str, str, str]) -> list:
        return [save_record(ORG, {"Name": n, "Unit_Status__c": status, "Unavailability_Reason__c": "",
                                  "Allocation__c": allocation}, object_name="Locations__c")
                for n, status, allocation in specs]

    def inputs(batch: list, status: str, reason: str = "", ignore: bool = False) -> dict:
        return {"unitsForStatusChange": [u.record_key for u in batch], "newStatus": status,
                "newUnavailabilityReason": reason, "ignoreAllocatedUnits": ignore}

    # No unit allocated (an allocated one that is already Unavailable does not count): every unit changes.
    free = units(("kennel-1", "Available", "0"), ("kennel-2", "Available", ""), ("kennel-3", "Unavailable", "2"))
    bystander = units(("kennel-9", "Available", "5"))[0]
    run = _start_and_drive(name, inputs(free, "Unavailable", "Cleaning"), request_id="units-clean")
    assert _context_vars(run)["unitsHaveAllocation"] is False
    for unit in free:
        assert _stored(unit)["fields"]["Unit_Status__c"] == "Unavailable"
        assert _stored(unit)["fields"]["Unavailability_Reason__c"] == "Cleaning"
    assert _stored(bystander)["version"] == 1  # not among the inputs: neither read into the filter nor written
    # One allocated, available unit among them: the flag is set and nothing is written.
    busy = units(("run-1", "Available", "0"), ("run-2", "Available", "1"))
    run = _start_and_drive(name, inputs(busy, "Unavailable", "Repairs"), request_id="units-busy")
    assert _context_vars(run)["unitsHaveAllocation"] is True
    assert [_stored(u)["version"] for u in busy] == [1, 1]
    # Told to ignore allocations: the allocated unit changes too; Available clears the reason.
    run = _start_and_drive(name, inputs(busy + free[:1], "Available", ignore=True), request_id="units-ignore")
    assert _context_vars(run)["unitsHaveAllocation"] is False
    for unit in busy + free[:1]:
        fields = _stored(unit)["fields"]
        assert (fields["Unit_Status__c"], fields["Unavailability_Reason__c"]) == ("Available", "")
    _assert_start_refused(name, {**inputs(busy, "Available"), "ignoreAllocatedUnits": "yes"}, "flow_input_type")


def _update_tenant_contact_on_change() -> None:
    """Record-triggered after save on TTS_Space_Tenant_Contact__c, entry criteria ``(1 OR 2) AND 3``: End_Date__c
    changed or Start_Date__c changed, and Start_Date__c not null (IsChanged is false on create). Its only element
    calls TTS_Tenant_Contact_Set_IsCurrent_Field with Tenant_Contact_ID = $Record.Id; that subflow runs inline, in
    the run's one transaction, reads the contact and writes Is_Current_Contact__c = (End_Date__c null or >= today)
    and Start_Date__c <= today back to it: one write per run, and its own save does not run the flow again (it
    changes neither date)."""
    deployed = _deploy("TTS_Update_Tenant_Contact_on_Change")
    assert deployed.activated and deployed.plan.execution_profile == PROFILE_ATOMIC
    # The called flow's plan is persisted beside its caller (not activated): the subflow runs that exact plan.
    child = FlowExecutionPlan.objects.get(org_id=ORG.org_id, flow_api_name="TTS_Tenant_Contact_Set_IsCurrent_Field")
    assert deployed.plan.plan_payload["steps"][0]["graph"][0]["subflow_plan_digest"] == child.plan_digest
    assert not FlowActivation.objects.filter(org_id=ORG.org_id, plan=child).exists()
    today = db_now().date()
    day = dt.timedelta(days=1)
    created = [save_record(ORG, values, object_name="TTS_Space_Tenant_Contact__c") for values in _tenant_contacts()]
    assert not FlowRun.objects.exists() and run_until_idle() == 0  # created: no date "changed"
    rng = random.Random(8107)
    cases = []
    for record in created:
        change = rng.choice(["End_Date__c", "Start_Date__c"])
        value = (today + rng.randint(-30, 30) * day).isoformat()
        cases.append((record, {change: value}))
    cases += [  # the decision boundaries of the subflow and the entry criteria
        (save_record(ORG, {"Name": "ends-today", "Start_Date__c": "2020-01-01", "End_Date__c": None},
                     object_name="TTS_Space_Tenant_Contact__c"), {"End_Date__c": today.isoformat()}),
        (save_record(ORG, {"Name": "starts-tomorrow", "Start_Date__c": "2020-01-01"},
                     object_name="TTS_Space_Tenant_Contact__c"), {"Start_Date__c": (today + day).isoformat()}),
        (save_record(ORG, {"Name": "ended-yesterday", "Start_Date__c": "2020-01-01", "Is_Current_Contact__c": "true"},
                     object_name="TTS_Space_Tenant_Contact__c"), {"End_Date__c": (today - day).isoformat()}),
    ]
    for record, changes in cases:
        before = _stored(record)["fields"]
        update_record(ORG, record, changes)
        run_until_idle()
        fields = {**before, **changes}
        end, start = fields.get("End_Date__c"), fields["Start_Date__c"]
        current = (end in (None, "") or dt.date.fromisoformat(end) >= today) and dt.date.fromisoformat(start) <= today
        assert _stored(record) == {"fields": {**fields, "Is_Current_Contact__c": "true" if current else "false"},
                                   "version": 3}, (before, changes)
    runs = FlowRun.objects.filter(org_id=ORG.org_id)
    assert runs.count() == len(cases) and {r.state for r in runs} == {t.RUN_SUCCEEDED}
    assert {r.save_depth for r in runs} == {0}  # the subflow's write re-saved the contact without a new run
    path = FlowCheckpoint.objects.filter(org_id=ORG.org_id, run=runs.first()).order_by("-sequence").values_list(
        "context_payload", flat=True)
    assert any("Check_if_Tenant_Contact_is_Active>Get_Tenant_Contact_Record" in (p.get("output") or {}).get(
        "path", []) for p in path)
    # Entry criteria not met: a Name-only change, a date change that clears Start_Date__c.
    quiet = created[0]
    version = _stored(quiet)["version"]
    update_record(ORG, quiet, {"Name": "renamed"})
    update_record(ORG, quiet, {"Start_Date__c": None, "End_Date__c": "2031-01-01"})
    assert run_until_idle() == 0 and runs.count() == len(cases)
    assert _stored(quiet)["version"] == version + 2


def _tenant_contact_scheduled_actions(db_clock_advance) -> None:
    """Schedule-triggered, Daily from 2023-02-08 00:00 UTC, over TTS_Space_Tenant_Contact__c records whose
    Start_Date__c is not null; each run calls TTS_Tenant_Contact_Set_IsCurrent_Field for its record (a durable
    subflow step: a child run), which writes Is_Current_Contact__c = (End_Date__c null or >= today) and
    Start_Date__c <= today. An activation runs from the next occurrence on, once per occurrence however often
    the schedule is swept; a record that fails the filter gets no run."""
    name = "TTS_Tenant_Contact_Scheduled_Actions"
    deployed = _deploy(name)
    assert deployed.activated and deployed.plan.execution_profile == PROFILE_DURABLE
    contacts = [save_record(ORG, values, object_name="TTS_Space_Tenant_Contact__c") for values in _tenant_contacts()]
    undated = save_record(ORG, {"Name": "no-start", "End_Date__c": None, "Is_Current_Contact__c": "unset"},
                          object_name="TTS_Space_Tenant_Contact__c")
    assert run_until_idle() == 0 and not FlowRun.objects.exists()  # today's 00:00 came before the activation
    now = db_now()
    midnight = dt.datetime.combine(now.date() + dt.timedelta(days=1), dt.time(), tzinfo=dt.UTC)
    db_clock_advance((midnight - now).total_seconds() + 60)
    assert run_until_idle() > 0
    today = db_now().date()
    for contact, given in zip(contacts, _tenant_contacts(), strict=True):
        end, start = given.get("End_Date__c"), dt.date.fromisoformat(given["Start_Date__c"])
        current = (end in (None, "") or dt.date.fromisoformat(end) >= today) and start <= today
        assert _stored(contact) == {"fields": {**given, "Is_Current_Contact__c": "true" if current else "false"},
                                    "version": 2}, given
    assert _stored(undated)["version"] == 1
    runs = FlowRun.objects.filter(org_id=ORG.org_id, plan=deployed.plan)
    assert sorted(r.record_key for r in runs) == sorted(c.record_key for c in contacts)
    assert {(r.state, r.entry_path) for r in runs} == {(t.RUN_SUCCEEDED, f"@schedule:{midnight:%Y-%m-%dT%H:%M:%SZ}")}
    assert FlowRun.objects.filter(org_id=ORG.org_id, parent_run__in=runs, state=t.RUN_SUCCEEDED).count() == len(runs)
    # The next day's occurrence runs again, once.
    db_clock_advance(86400)
    run_until_idle()
    again = FlowRun.objects.filter(org_id=ORG.org_id, plan=deployed.plan).exclude(pk__in=[r.pk for r in runs])
    assert sorted(r.record_key for r in again) == sorted(c.record_key for c in contacts)
    assert run_until_idle() == 0


def _accounts(seed: int, industries: list[str | None]) -> list:
    rng = random.Random(seed)
    return [save_record(ORG, {"Name": f"account-{i}", "OwnerId": f"005{rng.randint(0, 10**14):015d}",
                              "Industry": industry}, object_name="Account") for i, industry in enumerate(industries)]


def _records_of(object_name: str) -> list[dict]:
    return [{"Id": key, **fields} for key, fields in Record.objects.filter(
        org_id=ORG.org_id, object_name=object_name, is_deleted=False).order_by("record_key").values_list(
        "record_key", "fields")]


def _adopter_match_clean_up_subflow(message_relay) -> None:
    """Inputs animalRecord (Animal__c) and adopterProfile (Adopter_Profile__c), at most one of them set.

    - adopterProfile only: its Adoption_Match__c rows with Successful_Adoption__c false are deleted; its
      successful match and another profile's match stay.
    - animalRecord only, status not Adopted: every match of the animal is deleted (the Not Adopted path).
    - neither: the default path's emailSimple sends one email to ``$User.Email`` (the user Flows run as)
      with the subject of the metadata and the ErrorMessageOnNullValues template as its body, through the
      outbound effect model: one message record, one intent, one email at the relay, even when the workers
      run again and the start is retried.
    """
    from tests.conftest import drain

    serve_message_relay(ORG, message_relay.base_url)
    _deploy_autolaunched("Adopter_Match_clean_up_Subflow", PROFILE_DURABLE, {
        "adopterProfile": {"data_type": "SObject", "collection": False, "object": "Adopter_Profile__c"},
        "animalRecord": {"data_type": "SObject", "collection": False, "object": "Animal__c"}})
    profile, other = (save_record(ORG, {"Name": n}, object_name="Adopter_Profile__c") for n in ("Ann", "Bo"))
    fostered = save_record(ORG, {"Name": "Rex", "Animal_Status__c": "Fostered"}, object_name="Animal__c")
    match = lambda profile_key, animal_key, ok: save_record(ORG, {
        "Name": f"m-{profile_key}-{ok}", "Adopter_Profile__c": profile_key, "Animal__c": animal_key,
        "Successful_Adoption__c": ok}, object_name="Adoption_Match__c")
    failed = [match(profile.record_key, "a0A-none", "false") for _ in range(2)]
    kept = [match(profile.record_key, "a0A-none", "true"), match(other.record_key, "a0A-none", "false")]
    of_animal = [match(other.record_key, fostered.record_key, "true") for _ in range(2)]

    _start_and_drive("Adopter_Match_clean_up_Subflow", {"adopterProfile": profile.record_key,
                                                       "animalRecord": None}, request_id="profile")
    remaining = {r["Id"] for r in _records_of("Adoption_Match__c")}
    assert remaining == {m.record_key for m in kept + of_animal} and not {m.record_key for m in failed} & remaining
    _start_and_drive("Adopter_Match_clean_up_Subflow", {"animalRecord": fostered.record_key,
                                                       "adopterProfile": None}, request_id="animal")
    assert {r["Id"] for r in _records_of("Adoption_Match__c")} == {m.record_key for m in kept}

    neither = {"animalRecord": None, "adopterProfile": None}
    run = flow_run_start(org=ORG, flow_api_name="Adopter_Match_clean_up_Subflow", inputs=neither,
                         request_id="neither").run
    assert run_until_idle() > 0 and FlowRun.objects.get(pk=run.pk).state == t.RUN_WAITING  # on the email's result
    assert not message_relay.state()["emails"]  # the egress worker sends it
    drain()
    run.refresh_from_db()
    assert (run.state, run.reason_code) == (t.RUN_SUCCEEDED, "")
    again = flow_run_start(org=ORG, flow_api_name="Adopter_Match_clean_up_Subflow", inputs=neither,
                           request_id="neither")
    assert (again.run.pk, again.created) == (run.pk, False)
    [message] = _records_of("EmailMessage")
    assert (message["ToAddress"], message["Subject"]) == ("shelter-admin@example.org",
                                                          "An occurred in the Adopter Matching Flow")
    assert "Expected inputs are Null!" in message["TextBody"] and "Error:  at" in message["TextBody"]
    command = OutboundCommand.objects.get(org_id=ORG.org_id, origin_flow_run_id=run.pk)
    assert (command.source_object, command.source_record_key) == ("EmailMessage", message["Id"])
    [email] = message_relay.state()["emails"]
    assert (email["to"], email["subject"], email["text"], email["send_requests"]) == (
        ["shelter-admin@example.org"], message["Subject"], message["TextBody"], 1)
    assert drain() == 0 and run_until_idle() == 0 and len(message_relay.state()["emails"]) == 1


def _dml_statement_in_a_loop_fixed() -> None:
    """Input Accounts (Account records): the loop builds one Case per account (AccountId = the account,
    OwnerId = its owner) into a collection and one Create Records inserts them all after the loop. (Its fault
    path runs the FeedItem.NewTaskFromFeedItem quick action, a Create Records of a Task in this engine.)"""
    _deploy_autolaunched("DML_Statement_In_A_Loop_Fixed", PROFILE_DURABLE, {
        "Accounts": {"data_type": "SObject", "collection": True, "object": "Account"}})
    accounts = _accounts(8109, ["Energy", None, "Retail"])
    _start_and_drive("DML_Statement_In_A_Loop_Fixed", {"Accounts": [a.record_key for a in accounts]},
                     request_id="cases-for-accounts")
    cases = _records_of("Case")
    assert sorted((c["AccountId"], c["OwnerId"]) for c in cases) == sorted(
        (a.record_key, a.fields["OwnerId"]) for a in accounts)
    assert all(set(c) == {"Id", "AccountId", "OwnerId"} for c in cases)
    assert not _records_of("Task")  # the fault path did not run
    assert [_stored(a)["version"] for a in accounts] == [1, 1, 1]
    _start_and_drive("DML_Statement_In_A_Loop_Fixed", {"Accounts": []}, request_id="no-accounts")
    assert len(_records_of("Case")) == len(accounts)  # an empty input creates nothing more


def _soql_query_in_a_loop_fixed() -> None:
    """Input Accounts; a loop with no body, then one Get Records of the first Account whose Industry is the text
    "None" (one query, after the loop), and a decision on its result. Nothing is written. (Its fault path runs
    the NewCase quick action, a Create Records of a Case in this engine.)"""
    _deploy_autolaunched("SOQL_Query_In_A_Loop_Fixed", PROFILE_DURABLE, {
        "Accounts": {"data_type": "SObject", "collection": True, "object": "Account"}})
    accounts = _accounts(8110, ["Retail", "None", None, "None"])
    run = _start_and_drive("SOQL_Query_In_A_Loop_Fixed", {"Accounts": [a.record_key for a in accounts[:2]]},
                           request_id="soql")
    elements = next(p["context"]["elements"] for p in FlowCheckpoint.objects.filter(
        org_id=ORG.org_id, run_id=run.pk).order_by("-sequence").values_list("context_payload", flat=True)
        if "context" in p)
    found = elements["SOQL_Query_Example"]
    first_none = min((a for a in accounts if a.fields["Industry"] == "None"), key=lambda a: a.record_key)
    assert (found["Id"], found["Industry"]) == (first_none.record_key, "None")
    assert [_stored(a)["version"] for a in accounts] == [1, 1, 1, 1] and not _records_of("Case")


# =============================================================================
# Flows this engine generation refuses at activation
# =============================================================================
@dataclass(frozen=True)
class Refusal:
    #: ``(code, element)`` of every diagnostic, in the order the activation gate reports them.
    diagnostics: list[tuple[str, str | None]]
    #: Records the flow's trigger would match ``(object, values, changes)``: saved after the refused
    #: deploy, then updated with ``changes``; each must keep exactly the values it was given.
    trigger_records: tuple[str, list[dict], dict] | None = None


def _tenant_contacts() -> list[dict]:
    rng = random.Random(8104)
    return [{"Name": f"tenant-{i}", "Start_Date__c": f"2024-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}",
             "End_Date__c": rng.choice([None, "2030-01-01", "2020-01-01"]), "Is_Current_Contact__c": "unset"}
            for i in range(5)]


TRIGGER_NONE = "engine_unsupported:trigger"
REFUSALS: dict[str, Refusal] = {}


def _assert_refused(name: str) -> None:
    refusal = REFUSALS[name]
    check = flow_compile_check(source=_source(name), flow_api_name=name, org=ORG, subflows=_subflows())
    assert check.execution_profile == PROFILED[name]["profile"]  # it compiles: the engine gate refuses it
    with pytest.raises(ActivationRejected) as caught:
        _deploy(name)
    assert caught.value.code == "flow_activation_rejected"
    assert [(d.code, d.element) for d in caught.value.diagnostics] == refusal.diagnostics
    # The deploy transaction rolled back whole: no plan, no activation.
    assert not FlowExecutionPlan.objects.filter(org_id=ORG.org_id, flow_api_name=name).exists()
    assert not FlowActivation.objects.filter(org_id=ORG.org_id).exists()
    if refusal.trigger_records is not None:
        object_name, creates, changes = refusal.trigger_records
        saved = [save_record(ORG, values, object_name=object_name) for values in creates]
        assert [record.fields for record in saved] == creates
        for record in saved:
            update_record(ORG, record, changes)
        for record, values in zip(saved, creates, strict=True):
            assert _stored(record) == {"fields": {**values, **changes}, "version": 2}
        assert not FlowRun.objects.exists()
        assert run_until_idle() == 0


# =============================================================================
# One test per corpus flow
# =============================================================================
RUNS: dict[str, Callable[..., None]] = {
    "Adopter_Match_clean_up_Subflow": _adopter_match_clean_up_subflow,
    "Breed_Name_Update_Flow": _breed_name_update_flow,
    "Tour_Request_Set_Realtor": _tour_request_set_realtor,
    "Populate_Vehicle_Range": _populate_vehicle_range,
    "PMT_Task_Before_Automation": _pmt_task_before_automation,
    "TTS_Tenant_Contact_Set_IsCurrent_Field": _tenant_contact_set_is_current,
    "TrackShipment": _track_shipment,
    "Issue_Bulk_Resort_Credits": _issue_bulk_resort_credits,
    "AIM_FilterExistingIncidentRelatedItems": _aim_filter_existing_incident_related_items,
    "Location_Change_Unit_Status_SubFlow": _location_change_unit_status,
    "TTS_Update_Tenant_Contact_on_Change": _update_tenant_contact_on_change,
    "TTS_Tenant_Contact_Scheduled_Actions": _tenant_contact_scheduled_actions,
    "DML_Statement_In_A_Loop_Fixed": _dml_statement_in_a_loop_fixed,
    "SOQL_Query_In_A_Loop_Fixed": _soql_query_in_a_loop_fixed,
}


def test_every_profiled_corpus_flow_has_a_case():
    assert len(PROFILED) == 14 and set(PROFILED) == set(RUNS) | set(REFUSALS)
    assert not set(RUNS) & set(REFUSALS)
    profiles = sorted(row["profile"] for row in PROFILED.values())
    assert profiles == ["bounded_atomic"] * 3 + ["durable_orchestration"] * 7 + ["embedded_before_save"] * 4


def test_the_inventory_says_which_corpus_flows_run_and_why_the_others_do_not(corpus_view):
    """``flows inventory``'s ``runs`` / ``blockers`` (issue: "Inventory says what runs") agree with what
    deploying each corpus flow for real does in :func:`test_corpus_flow_record_outcomes`."""
    from nexusflow.flows.inventory import flow_inventory

    rows = {row.flow: row for row in flow_inventory(str(CORPUS))}
    assert {name for name, row in rows.items() if row.runs} == set(RUNS)
    for name, refusal in REFUSALS.items():
        assert [(b["code"], b["element"]) for b in rows[name].blockers] == refusal.diagnostics, name
    for row in rows.values():
        assert row.runs == (not row.blockers)
        assert not row.rejected or row.blockers == row.reasons  # a compile refusal is its own blocker


@pytest.mark.django_db(transaction=True, databases=["default", "control"])
@pytest.mark.parametrize("flow", sorted(PROFILED), ids=sorted(PROFILED))
def test_corpus_flow_record_outcomes(flow, corpus_view, short_lease, request):
    assert set(corpus_view.objects) >= {"Breed__c", "Vehicle__c", "PMT_Task__c", "TTS_Space_Tenant_Contact__c"}
    if flow in RUNS:
        case = RUNS[flow]
        case(**{name: request.getfixturevalue(name) for name in inspect.signature(case).parameters})
    else:
        _assert_refused(flow)



# =============================================================================
# The two executor defects the corpus runs exposed
# =============================================================================
@pytest.mark.parametrize("text,operator,number,holds", [
    ("5000", "LessThan", "10000.0", True), ("51522", "LessThan", "10000.0", False),
    ("51522", "GreaterThan", "25000.0", True), ("25000", "LessThanOrEqualTo", "25000.0", True),
    ("9999.99", "GreaterThanOrEqualTo", "10000", False), ("50", "GreaterThan", "0.0", True),
    ("", "GreaterThan", "0.0", False), ("n/a", "LessThan", "10", False), (None, "LessThan", "10", False),
])
def test_a_number_field_stored_as_text_compares_as_its_number(text, operator, number, holds):
    """Populate_Vehicle_Range and PMT_Task_Before_Automation compare number fields with number literals."""
    condition = {"left": "$Record.Price__c", "operator": operator, "right": {"kind": "numberValue", "value": number}}
    assert condition_holds(condition, {"Price__c": text}) is holds


@pytest.mark.parametrize("ref,traverses", [
    ("$Record.Property__r.Broker__r.Realtor_User__c", True), ("$Record.Account.Name", True),
    ("$Record__Prior.Owner__r.Id", True), ("animalRecord.Previous_Current_Owner__r.Id", True),
    ("$Record.Realtor_User__c", False), ("$Record__Prior.Status__c", False), ("Get_Tenant_Contact_Record.Id", False),
    ("Breed_Name_Formula", False), ("$Flow.CurrentDate", False),
])
def test_a_reference_through_a_relationship_is_recognised(ref, traverses):
    assert traverses_relationship(ref) is traverses


# =============================================================================
# The executor defects the autolaunched corpus runs exposed
# =============================================================================
@pytest.mark.parametrize("text,operator,holds", [
    ("2024-05-01", "LessThanOrEqualTo", True), ("2024-05-02", "LessThanOrEqualTo", False),
    ("2024-05-01", "GreaterThanOrEqualTo", True), ("2024-04-30", "GreaterThanOrEqualTo", False),
    ("2030-01-01", "GreaterThan", True), ("", "GreaterThanOrEqualTo", False), ("soon", "LessThan", False),
])
def test_a_date_field_stored_as_text_compares_with_the_current_date(text, operator, holds):
    """TTS_Tenant_Contact_Set_IsCurrent_Field compares End_Date__c / Start_Date__c with $Flow.CurrentDate."""
    condition = {"left": "$Record.End_Date__c", "operator": operator,
                 "right": {"kind": "elementReference", "value": "$Flow.CurrentDate"}}
    assert condition_holds(condition, {"End_Date__c": text}, lambda ref: dt.date(2024, 5, 1)) is holds


def test_a_number_variable_read_back_from_a_checkpoint_adds_as_a_number():
    """Issue_Bulk_Resort_Credits increments recordCount in a durable loop: the checkpoint holds it as text."""
    from nexusflow.flows.interpreter import run_graph

    payload = {"checkpoint_schema": {"variables": {
        "recordCount": {"kind": "variables", "data_type": "Number", "collection": False},
        "label": {"kind": "variables", "data_type": "String", "collection": False}}}}
    graph = [{"element": "inc", "type": "assignments", "edges": [], "items": [
        {"operator": "Add", "target": "recordCount", "value": {"kind": "numberValue", "value": "1.0"}},
        {"operator": "Add", "target": "label", "value": {"kind": "stringValue", "value": "1"}}]}]
    out = run_graph(plan_payload=payload, graph=graph, entry="inc", record={}, object_name=None,
                    now=dt.datetime(2024, 5, 1), reader=None, state={"vars": {"recordCount": "2", "label": "2"}})
    assert out.state["vars"] == {"recordCount": "3", "label": "21"}
