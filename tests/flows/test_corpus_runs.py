"""The corpus flows that compile to a profile, deployed and run against generated records (issue #8 evidence).

Each of the twelve files of ``/work/shared/corpus/flows`` that compiles (see
``fixtures/corpus_inventory.json``) is deployed for a test org against the
metadata view in ``fixtures/corpus_metadata`` (the objects and fields the
flows name), exactly as ``flow_deploy`` does in production:

- Embedded Before-Save flows must change the saved record inside the same
  save (one write, record version 1 on create) and leave no FlowRun row;
  records that miss the entry conditions keep the values they were saved with.
- A flow this engine generation cannot run is refused at activation with the
  precise ``engine_unsupported:*`` diagnostics; nothing is persisted or
  activated, and saving records its trigger would match starts no run and
  changes nothing.

The expected outcomes are written from the Flow metadata (the branch each
record takes), independently of the interpreter. Records are generated from
fixed seeds, with the decision boundaries added explicitly.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Callable

import pytest

from nexusflow.flows import transitions as t
from nexusflow.flows.compiler import PROFILE_EMBEDDED, condition_holds
from nexusflow.flows.handlers import traverses_relationship
from nexusflow.flows.errors import ActivationRejected
from nexusflow.flows.models import FlowActivation, FlowCheckpoint, FlowExecutionPlan, FlowRun
from nexusflow.flows.services import flow_compile_check, flow_deploy
from nexusflow.kernel.scope import OrgScope
from nexusflow.records.metadata import current_view
from nexusflow.records.models import Record

from .conftest import CORPUS, run_until_idle, save_record, update_record

FIXTURES = Path(__file__).parent / "fixtures"
CORPUS_METADATA = FIXTURES / "corpus_metadata"
ORG = OrgScope("corpus-org")
INVENTORY = json.loads((FIXTURES / "corpus_inventory.json").read_text(encoding="utf-8"))
PROFILED = {row["flow"]: row for row in INVENTORY if row["profile"]}
#: Every corpus file by API name: subflow elements resolve against the folder, as the inventory does.
CORPUS_SOURCES = {Path(row["file"]).name.rsplit("__", 1)[-1].removesuffix(".flow-meta.xml"): Path(row["file"])
                  for row in INVENTORY}


@pytest.fixture
def corpus_view(settings):
    """Point the process metadata view at the corpus objects for one test (the view is loaded once per process)."""
    current_view.cache_clear()
    settings.NEXUS_METADATA_DIR = CORPUS_METADATA
    current_view.cache_clear()
    view = current_view()
    yield view
    current_view.cache_clear()


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


def _tour_requests() -> list[dict]:
    rng = random.Random(8105)
    return [{"Name": f"tour-{i}", "Property__c": rng.choice([None, f"a0P{i:015d}"]),
             "Realtor_User__c": rng.choice([None, f"005{i:015d}"])} for i in range(5)]


TRIGGER_NONE = "engine_unsupported:trigger"
REFUSALS: dict[str, Refusal] = {
    # Subflow target with an input variable (Tenant_Contact_ID) and no start trigger: nothing can admit it.
    "TTS_Tenant_Contact_Set_IsCurrent_Field": Refusal([(TRIGGER_NONE, "start")]),
    # Record-triggered after save, but its entry criteria use IsChanged and its only element is a subflow call.
    "TTS_Update_Tenant_Contact_on_Change": Refusal(
        [(TRIGGER_NONE, "start"), (TRIGGER_NONE, "start"),
         ("engine_unsupported:element:subflows", "Check_if_Tenant_Contact_is_Active")],
        trigger_records=("TTS_Space_Tenant_Contact__c", _tenant_contacts(), {"End_Date__c": "2021-06-30"})),
    # Agent action stub (inputs tracking_number/carrier, output variables only): no start trigger.
    "TrackShipment": Refusal([(TRIGGER_NONE, "start")]),
    # Autolaunched with input variables; RemoveAll on text collections is not executed.
    "AIM_FilterExistingIncidentRelatedItems": Refusal(
        [(TRIGGER_NONE, "start"), ("engine_unsupported:assignment", "Remove_Case_from_List"),
         ("engine_unsupported:assignment", "Remove_Asset_from_List")]),
    # Autolaunched subflow with SObject inputs; it compares animalRecord.Previous_Current_Owner__r.Id (a
    # relationship read), and record deletes and an email action have no handler here.
    "Adopter_Match_clean_up_Subflow": Refusal(
        [(TRIGGER_NONE, "start"),
         ("engine_unsupported:reference", "Does_the_Contact_on_the_Animal_match_the_Adopter_Profile"),
         ("engine_unsupported:element:recordDeletes", "Delete_Adoption_Matches"),
         ("engine_unsupported:handler", "Delete_Adoption_Matches"),
         ("engine_unsupported:element:recordDeletes", "Delete_Adoption_Match_records"),
         ("engine_unsupported:handler", "Delete_Adoption_Match_records"),
         ("engine_unsupported:handler", "Send_Email_on_Error")]),
    # Agent action with inputs (contactRecords, amount): no start trigger.
    "Issue_Bulk_Resort_Credits": Refusal([(TRIGGER_NONE, "start")]),
    # Autolaunched subflow with inputs; Id In filters and collection processors are not executed.
    "Location_Change_Unit_Status_SubFlow": Refusal(
        [(TRIGGER_NONE, "start"), ("engine_unsupported:record_filter", "Get_Units_From_Id_List"),
         ("engine_unsupported:element:collectionProcessors", "Filter_Units_for_Allocated_Units"),
         ("engine_unsupported:handler", "Filter_Units_for_Allocated_Units")]),
    # Schedule-triggered (Daily) and a subflow call (DependencyWait step).
    "TTS_Tenant_Contact_Scheduled_Actions": Refusal(
        [(TRIGGER_NONE, "start"),
         ("engine_unsupported:step:DependencyWait", "Check_If_Tenant_Contact_is_still_Active")],
        trigger_records=("TTS_Space_Tenant_Contact__c", _tenant_contacts(), {"Start_Date__c": "2022-02-02"})),
    # Before save: Realtor_User__c from $Record.Property__r.Broker__r.Realtor_User__c. Record fields are
    # stored one object deep, so the path would resolve to null and overwrite the field: refused instead.
    "Tour_Request_Set_Realtor": Refusal(
        [("engine_unsupported:reference", "Set_Realtor_From_Property_Broker")],
        trigger_records=("Tour_Request__c", _tour_requests(), {"Name": "tour-renamed"})),
}


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
        for record, values in zip(saved, creates):
            assert _stored(record) == {"fields": {**values, **changes}, "version": 2}
        assert not FlowRun.objects.exists()
        assert run_until_idle() == 0


# =============================================================================
# One test per corpus flow
# =============================================================================
RUNS: dict[str, Callable[[], None]] = {
    "Breed_Name_Update_Flow": _breed_name_update_flow,
    "Populate_Vehicle_Range": _populate_vehicle_range,
    "PMT_Task_Before_Automation": _pmt_task_before_automation,
}


def test_every_profiled_corpus_flow_has_a_case():
    assert len(PROFILED) == 12 and set(PROFILED) == set(RUNS) | set(REFUSALS)
    assert not set(RUNS) & set(REFUSALS)
    profiles = sorted(row["profile"] for row in PROFILED.values())
    assert profiles == ["bounded_atomic"] * 3 + ["durable_orchestration"] * 5 + ["embedded_before_save"] * 4


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("flow", sorted(PROFILED), ids=sorted(PROFILED))
def test_corpus_flow_record_outcomes(flow, corpus_view):
    assert set(corpus_view.objects) >= {"Breed__c", "Vehicle__c", "PMT_Task__c", "TTS_Space_Tenant_Contact__c"}
    if flow in RUNS:
        RUNS[flow]()
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
