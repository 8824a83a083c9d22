"""Flow runs carry their principal and every durable step reauthorizes (seed 004 sections 17.1, 17.2).

Proofs S004-22.6-07 (a principal disabled while the run waits), S004-22.6-08 (a permission, field-level or
record-access change between two steps) and S004-22.6-09 (a system-mode step needs an explicit declared
identity). Real MariaDB, real durable runs driven by the Flow worker units; a wait is resolved by moving the
database clock, never by sleeping. Each refusal leaves the record unwritten and ends the run with its code.
"""
from __future__ import annotations

import copy

import pytest

from nexusflow.flows import transitions as t
from nexusflow.flows.errors import ActivationRejected
from nexusflow.flows.models import FlowRun
from nexusflow.flows.services import flow_deploy, flow_try_resume_due_one
from nexusflow.records.access_services import access_policy_publish, record_share_set
from nexusflow.records.models import Record
from nexusflow.records.selectors import access_policy

from . import executor_flows as ef
from . import flowxml as fx
from .conftest import OBJECT, run_until_idle, save_record

pytestmark = pytest.mark.django_db(transaction=True)

SYSTEM = "automated_process"
FIELDS = ("email", "firstname", "lastname", "lifecyclestage", "account_id")
DAY = 86400


def _policy(*, active: bool = True, ops=("create", "read", "edit", "delete"), edit_fields=FIELDS,
            modify_all: bool = True) -> dict:
    return {"users": [{"id": SYSTEM, "active": active, "email": "", "name": "Automated Process",
                       "permission_sets": ["flows"], "fields": {}},
                      {"id": "u-ops", "active": True, "email": "", "name": "Ops", "permission_sets": [],
                       "fields": {}}],
            "permission_sets": {"flows": {
                "objects": {OBJECT: list(ops)},
                "fields": {OBJECT: {f: (["read", "edit"] if f in edit_fields else ["read"]) for f in FIELDS}},
                "view_all": [], "modify_all": [OBJECT] if modify_all else []}},
            "sharing": {OBJECT: "private"}}


def _publish(org, document: dict, why: str) -> str:
    access_policy_publish(org_id=org.org_id, document=copy.deepcopy(document), authored_by="ops", reason=why)
    return access_policy(org_id=org.org_id).digest


def _wait_then_mark() -> bytes:
    """After-save, Durable Orchestration: wait two days (Wait element), then update the trigger's lastname."""
    wait = ("<waits><name>Pause</name><label>Pause</label><locationX>1</locationX><locationY>1</locationY>"
            "<defaultConnectorLabel>x</defaultConnectorLabel><waitEvents><name>Later</name>"
            "<conditionLogic>and</conditionLogic>" + fx.conn("Mark")
            + "<eventType>AlarmEvent</eventType><inputParameters><name>AlarmTime</name><value>"
            "<elementReference>$Flow.CurrentDateTime</elementReference></value></inputParameters>"
            "<inputParameters><name>TimeOffset</name><value><numberValue>2</numberValue></value></inputParameters>"
            "<inputParameters><name>TimeOffsetUnit</name><value><stringValue>Days</stringValue></value>"
            "</inputParameters><label>x</label></waitEvents></waits>")
    return fx.flow(wait, ef._update_record("Mark", None, "lastname", "<stringValue>marked</stringValue>"),
                   start=fx.start("Pause", trigger="RecordAfterSave", filters=ef.STAGE_FILTER),
                   profile="DurableOrchestration")


def _run_of(org, record) -> FlowRun:
    """The run the record's own save admitted (the first; a Flow's own write may admit more)."""
    return FlowRun.objects.filter(org_id=org.org_id, record_key=record.record_key).order_by("id").first()


def _lastname(record) -> str | None:
    return Record.objects.get(pk=record.pk).fields.get("lastname")


@pytest.fixture
def waiting(org):
    """A run admitted under the first policy generation, waiting two days before it writes its record."""
    digest = _publish(org, _policy(), "flows may act")
    flow_deploy(org=org, source=_wait_then_mark(), flow_api_name="Wait_Then_Mark")
    record = save_record(org, {"lifecyclestage": "customer", "email": "w@example.com", "lastname": "Before"})
    run_until_idle()
    run = _run_of(org, record)
    assert run.state == t.RUN_WAITING and run.authorization_digest == digest
    return record


def _resume(db_clock_advance) -> None:
    db_clock_advance(2 * DAY + 60)
    assert flow_try_resume_due_one() is True
    run_until_idle()


# --- S004-22.6-09 ---------------------------------------------------------------------------------------
def test_a_system_mode_flow_is_not_activated_without_a_declared_system_identity(org):
    undeclared = _policy()
    undeclared["users"] = [u for u in undeclared["users"] if u["id"] != SYSTEM]
    _publish(org, undeclared, "no system identity")
    with pytest.raises(ActivationRejected) as refused:
        flow_deploy(org=org, source=ef.atomic_set_firstname(), flow_api_name="Atomic_Set_Name")
    assert "flow_system_identity_undeclared" in {d.code for d in refused.value.diagnostics}
    _publish(org, _policy(active=False), "declared but inactive")
    with pytest.raises(ActivationRejected):
        flow_deploy(org=org, source=ef.atomic_set_firstname(), flow_api_name="Atomic_Set_Name")
    digest = _publish(org, _policy(), "declared")
    flow_deploy(org=org, source=ef.atomic_set_firstname(), flow_api_name="Atomic_Set_Name")
    record = save_record(org, {"lifecyclestage": "customer", "email": "a@example.com"})
    run_until_idle()
    run = _run_of(org, record)
    assert run.state == t.RUN_SUCCEEDED
    assert (run.principal_mode, run.execution_principal, run.authorization_digest) == ("system", SYSTEM, digest)


# --- S004-22.6-07 ---------------------------------------------------------------------------------------
def test_a_principal_disabled_while_the_run_waits_fails_the_next_step_and_writes_nothing(org, waiting,
                                                                                         db_clock_advance):
    _publish(org, _policy(active=False), "the system identity is disabled")
    _resume(db_clock_advance)
    run = _run_of(org, waiting)
    assert (run.state, run.reason_code) == (t.RUN_TERMINAL_FAILED, "flow_principal_disabled")
    assert _lastname(waiting) == "Before"


def test_a_principal_still_active_after_the_wait_writes(org, waiting, db_clock_advance):
    _publish(org, _policy(ops=("create", "read", "edit", "delete")), "a new generation, same grants")
    _resume(db_clock_advance)
    assert _run_of(org, waiting).state == t.RUN_SUCCEEDED and _lastname(waiting) == "marked"


# --- S004-22.6-08 ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("change", ["object_permission", "field_level_security", "record_access"])
def test_a_permission_fls_or_rls_change_between_steps_refuses_the_next_write(org, waiting, db_clock_advance,
                                                                              change):
    if change == "object_permission":  # modify_all implies every object permission: gone with it
        _publish(org, _policy(ops=("read",), modify_all=False), "edit revoked")
        record_share_set(org_id=org.org_id, object_name=OBJECT, record_key=waiting.record_key, user_id=SYSTEM,
                         access="edit", authored_by="ops", reason="the record itself stays shared")
    elif change == "field_level_security":
        _publish(org, _policy(edit_fields=("firstname",)), "lastname made read-only")
    else:  # the share that gave the system identity the record is revoked; no modify_all
        _publish(org, _policy(modify_all=False), "sharing enforced")
        record_share_set(org_id=org.org_id, object_name=OBJECT, record_key=waiting.record_key, user_id=SYSTEM,
                         access="edit", authored_by="ops", reason="covering")
        record_share_set(org_id=org.org_id, object_name=OBJECT, record_key=waiting.record_key, user_id=SYSTEM,
                         access="none", authored_by="ops", reason="cover ended")
    _resume(db_clock_advance)
    run = _run_of(org, waiting)
    assert (run.state, run.reason_code) == (t.RUN_TERMINAL_FAILED, "flow_access_denied")
    assert _lastname(waiting) == "Before"


def test_a_share_granting_record_access_lets_the_next_step_write(org, waiting, db_clock_advance):
    _publish(org, _policy(modify_all=False), "sharing enforced")
    record_share_set(org_id=org.org_id, object_name=OBJECT, record_key=waiting.record_key, user_id=SYSTEM,
                     access="edit", authored_by="ops", reason="the flow maintains it")
    _resume(db_clock_advance)
    assert _run_of(org, waiting).state == t.RUN_SUCCEEDED and _lastname(waiting) == "marked"


def test_a_step_that_reads_an_object_the_principal_may_not_read_is_refused(org):
    """S004-22.6-08, reads: a step's Get Records is reauthorized too (the object's read), not only its writes."""
    document = _policy()
    document["permission_sets"]["flows"]["objects"]["Account"] = []  # no permission on Account at all
    _publish(org, document, "accounts are off limits")
    source = fx.flow(fx.lookup("Find_Accounts", "Mark", obj="Account"),
                     ef._update_record("Mark", None, "lastname", "<stringValue>marked</stringValue>"),
                     start=fx.start("Find_Accounts", trigger="RecordAfterSave", filters=ef.STAGE_FILTER),
                     profile="DurableOrchestration")
    flow_deploy(org=org, source=source, flow_api_name="Read_Accounts")
    record = save_record(org, {"lifecyclestage": "customer", "email": "r@example.com", "lastname": "Before"})
    run_until_idle()
    run = _run_of(org, record)
    assert (run.state, run.reason_code) == (t.RUN_TERMINAL_FAILED, "flow_access_denied")
    assert _lastname(record) == "Before"
    document["permission_sets"]["flows"]["objects"]["Account"] = ["read"]
    _publish(org, document, "accounts readable")
    other = save_record(org, {"lifecyclestage": "customer", "email": "s@example.com", "lastname": "Before"})
    run_until_idle()
    assert _run_of(org, other).state == t.RUN_SUCCEEDED and _lastname(other) == "marked"


def test_a_run_records_who_caused_it_an_operator_s_policy_user_and_a_flow_s_own_write_passes_it_on(org):
    """S004-22.6-09 (17.1): the run stores its initiating principal: the policy user an operator's REST edit was
    made for; a run admitted by another run's own write inherits it."""
    from nexusflow.records.edits import record_edit_create
    from nexusflow.records.selectors import access_principal

    document = _policy()
    document["users"][1]["permission_sets"] = ["flows"]  # u-ops may edit Contacts too
    _publish(org, document, "ops edits contacts")
    flow_deploy(org=org, source=ef.atomic_set_firstname(), flow_api_name="Atomic_Set_Name")
    created = record_edit_create(org=org, object_name=OBJECT, fields={"lifecyclestage": "customer",
                                                                      "email": "o@example.com"},
                                 principal=access_principal(org_id=org.org_id, user_id="u-ops"))
    run_until_idle()
    runs = list(FlowRun.objects.filter(org_id=org.org_id, record_key=created.record_key).order_by("id"))
    assert runs and {r.initiating_principal for r in runs} == {"u-ops"}  # the re-save's run inherits it
    assert {r.execution_principal for r in runs} == {SYSTEM}
    plain = save_record(org, {"lifecyclestage": "customer", "email": "p@example.com"})  # no known initiator
    run_until_idle()
    assert _run_of(org, plain).initiating_principal == ""
