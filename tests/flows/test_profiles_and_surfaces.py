"""Execution profiles through the records hooks, and the operator surfaces (seed 004 sections 9, 18.2, 19)."""
from __future__ import annotations

import io
import json

import pytest
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import transaction

from nexusflow.flows import transitions as t
from nexusflow.flows.errors import FlowExecutionError
from nexusflow.flows.models import FlowAuditEvent, FlowCheckpoint, FlowRun, FlowStepExecution
from nexusflow.flows.services import flow_deploy
from nexusflow.records.metadata import InvalidFieldValue
from nexusflow.records.models import Record

from . import executor_flows as ef
from .conftest import run_until_idle, save_record, update_record

pytestmark = pytest.mark.django_db(transaction=True)

CUSTOMER = {"lifecyclestage": "customer", "email": "a@example.com"}


def _run_of(org, record) -> FlowRun:
    return FlowRun.objects.filter(org_id=org.org_id, record_key=record.record_key).order_by("id").first()


def test_bounded_atomic_commits_its_one_mutation_step_with_checkpoint_and_audit(org):
    plan = flow_deploy(org=org, source=ef.atomic_set_firstname(), flow_api_name="Atomic_Set_Name").plan
    assert plan.execution_profile == "bounded_atomic"
    record = save_record(org, CUSTOMER)
    run = _run_of(org, record)
    # The root is persisted and bound to its plan before any mutation begins.
    assert (run.state, run.plan_id, run.execution_profile) == (t.RUN_RUNNABLE, plan.pk, "bounded_atomic")
    assert Record.objects.get(pk=record.pk).fields.get("firstname") is None
    run_until_idle()
    run.refresh_from_db()
    assert (run.state, run.legacy_status) == (t.RUN_SUCCEEDED, t.LEGACY_FINISHED)
    step = FlowStepExecution.objects.get(run=run, plan_step_key="atomic")
    out = step.output_checkpoint.context_payload["output"]
    assert out["writes"] == [{"op": "update", "object": "Contact", "record_key": record.record_key,
                              "changed": ["firstname"]}]
    assert Record.objects.get(pk=record.pk).fields["firstname"] == "Flowed"
    assert FlowAuditEvent.objects.filter(run=run, event="step_committed").count() == 2


def test_durable_orchestration_carries_variables_across_steps_in_checkpoints(org):
    flow_deploy(org=org, source=ef.durable_counter(), flow_api_name="Durable_Counter")
    record = save_record(org, CUSTOMER)
    run_until_idle(max_rounds=100)
    run = _run_of(org, record)
    assert run.state == t.RUN_SUCCEEDED
    steps = list(FlowStepExecution.objects.filter(run=run).order_by("id"))
    assert [s.plan_step_key for s in steps] == ["assign:Count", "decide:Is_One", "write:Mark", "end"]
    decide = steps[1].output_checkpoint.context_payload
    assert decide["output"] == {"rule": "One", "next": "write:Mark"}
    assert decide["context"]["vars"] == {"counter": "1"}
    assert Record.objects.get(pk=record.pk).fields["lastname"] == "counted-once"
    sequences = list(FlowCheckpoint.objects.filter(run=run).order_by("sequence").values_list("sequence", flat=True))
    assert sequences == [1, 2, 3, 4, 5]


def test_embedded_before_save_transforms_the_record_in_the_callers_transaction(org):
    plan = flow_deploy(org=org, source=ef.before_save_set_lastname(), flow_api_name="Before_Save_Stamp").plan
    assert plan.execution_profile == "embedded_before_save"
    stamped = save_record(org, CUSTOMER)
    untouched = save_record(org, {"lifecyclestage": "lead"})
    assert Record.objects.get(pk=stamped.pk).fields["lastname"] == "Before-Saved"
    assert Record.objects.get(pk=stamped.pk).version == 1  # one write: no second transaction or update
    assert "lastname" not in Record.objects.get(pk=untouched.pk).fields
    assert not FlowRun.objects.filter(org_id=org.org_id).exists()  # no durable root on the hot path
    update_record(org, untouched, {"lifecyclestage": "customer"})
    assert Record.objects.get(pk=untouched.pk).fields["lastname"] == "Before-Saved"


def test_a_failing_before_save_flow_fails_the_record_mutation(org):
    flow_deploy(org=org, source=ef.before_save_set_lastname("x" * 500), flow_api_name="Before_Save_Stamp")
    with pytest.raises((InvalidFieldValue, FlowExecutionError)):
        save_record(org, CUSTOMER)
    assert not Record.objects.filter(org_id=org.org_id).exists()


# --- operator surfaces ------------------------------------------------------------------------
def _command(*args: str) -> dict:
    out = io.StringIO()
    call_command("flows", *args, stdout=out)
    return json.loads(out.getvalue())


def test_flows_run_cancel_show_commands(org):
    flow_deploy(org=org, source=ef.atomic_set_firstname(), flow_api_name="Atomic_Set_Name")
    record = save_record(org, CUSTOMER)
    run = _run_of(org, record)
    assert _command("run", str(run.pk), "--org", org.org_id) == {"run_id": int(run.pk), "state": t.RUN_SUCCEEDED}
    shown = _command("show", str(run.pk), "--org", org.org_id)
    assert shown["state"] == t.RUN_SUCCEEDED and shown["plan"]["execution_profile"] == "bounded_atomic"
    assert [[a["outcome"] for a in s["attempts"]] for s in shown["steps"]] == [["Committed"], []]
    other = save_record(org, {**CUSTOMER, "email": "b@example.com"})
    cancelled = _command("cancel", str(_run_of(org, other).pk), "--org", org.org_id)
    assert (cancelled["state"], cancelled["is_deleted"]) == (t.RUN_CANCELLED, True)
    for args, code in ((["show", "abc", "--org", org.org_id], 2), (["show", str(run.pk), "--org", " bad"], 2),
                       (["show", str(run.pk), "--org", "flows-other-org"], 3),
                       (["cancel", "999999", "--org", org.org_id], 3),
                       (["show", str(_run_of(org, other).pk), "--org", org.org_id], 3),
                       (["run", str(run.pk), "--org", org.org_id, "--max-steps", "0"], 2)):
        with pytest.raises(CommandError) as exc:
            call_command("flows", *args, stdout=io.StringIO())
        assert exc.value.returncode == code, args
    assert _command("show", str(_run_of(org, other).pk), "--org", org.org_id, "--include-deleted")["is_deleted"]


def test_support_read_endpoint_is_scoped_by_the_operators_trusted_org(org, client):
    flow_deploy(org=org, source=ef.atomic_set_firstname(), flow_api_name="Atomic_Set_Name")
    run = _run_of(org, save_record(org, CUSTOMER))
    operator = User.objects.create_user("op", password="pw", is_staff=True)
    with transaction.atomic():
        operator.groups.add(Group.objects.create(name=f"org:{org.org_id}"))
    client.force_login(operator)
    ok = client.get(f"/api/v2/flows/orgs/{org.org_id}/runs/{int(run.pk)}/")
    assert ok.status_code == 200 and ok.json()["run_id"] == int(run.pk) and ok.json()["org_id"] == org.org_id
    assert client.get(f"/api/v2/flows/runs/{int(run.pk)}/").json()["error"] == "flow_run_org_required"
    forbidden = client.get(f"/api/v2/flows/orgs/flows-other-org/runs/{int(run.pk)}/")
    assert (forbidden.status_code, forbidden.json()["error"]) == (403, "org_not_authorized")
    assert client.get(f"/api/v2/flows/orgs/{org.org_id}/runs/x1/").status_code == 400
    for odd in ("%C2%B2", "9223372036854775808", "01"):  # a superscript two, 2**63, a leading zero: never a 500
        refused = client.get(f"/api/v2/flows/orgs/{org.org_id}/runs/{odd}/")
        assert (refused.status_code, refused.json()["error"]) == (400, "invalid_identity"), odd
    missing = client.get(f"/api/v2/flows/orgs/{org.org_id}/runs/99999999/")
    assert (missing.status_code, missing.json()["error"]) == (404, "flow_run_not_found")
    assert client.get(f"/api/v2/flows/orgs/{org.org_id}/runs/{int(run.pk)}/?include_deleted=yes").status_code == 400
    admin_page = client.get(f"/admin/flows/flowrun/{int(run.pk)}/change/")
    assert admin_page.status_code == 200
    client.logout()
    assert client.get(f"/api/v2/flows/orgs/{org.org_id}/runs/{int(run.pk)}/").status_code in (401, 403)
