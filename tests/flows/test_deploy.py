"""Plans, catalog generations, activations and the operator commands (seed 004 sections 7.4 and 8.4)."""
from __future__ import annotations

import io

import pytest
from django.contrib import admin
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import IntegrityError, transaction

from nexusflow.flows import models as m
from nexusflow.flows import transitions as t
from nexusflow.flows.binding import flow_runtime_binding
from nexusflow.flows.catalog import catalog_snapshot_from_row
from nexusflow.flows.compiler import CompileError
from nexusflow.flows.services import flow_deploy
from nexusflow.flows.store import plan_insert
from nexusflow.kernel.clock import db_now
from nexusflow.kernel.errors import ImmutableRow
from nexusflow.records.metadata import current_view

from .conftest import DEMO_FLOW, decision_flow_xml, save_record

pytestmark = pytest.mark.django_db


def test_deploy_is_idempotent_and_pins_the_catalog(org, demo_source):
    first = flow_deploy(org=org, source=demo_source, flow_api_name="Contact_Push_Customer_To_Billing")
    second = flow_deploy(org=org, source=demo_source, flow_api_name="Contact_Push_Customer_To_Billing")
    assert first.plan_created and first.activated
    assert not second.plan_created and not second.activated
    assert second.plan.pk == first.plan.pk and second.activation.pk == first.activation.pk
    assert m.FlowExecutionPlan.objects.filter(org_id=org.org_id).count() == 1
    assert m.FlowActionCatalogGeneration.objects.filter(org_id=org.org_id).count() == 1
    plan = first.plan
    catalog = plan.catalog
    assert plan.catalog_digest == catalog.digest
    assert (plan.org_id, plan.app_installation_id, plan.runtime_capability_id, plan.runtime_work_binding_digest) == (
        catalog.org_id, catalog.app_installation_id, catalog.runtime_capability_id, catalog.binding_digest)
    assert plan.metadata_view_digest == current_view().digest
    assert plan.flow_version == plan.metadata_digest
    assert plan.trigger_object_name == "Contact"
    # The persisted generation reproduces its digest from its entries.
    binding = flow_runtime_binding(org_id=org.org_id, metadata_view_digest=current_view().digest)
    assert catalog_snapshot_from_row(binding=binding, row=catalog).digest == catalog.digest


def test_plans_and_catalogs_are_immutable(org, demo_source):
    plan = flow_deploy(org=org, source=demo_source, flow_api_name="Contact_Push_Customer_To_Billing").plan
    plan.diagnostic_summary = "edited"
    with pytest.raises(ImmutableRow):
        plan.save()
    with pytest.raises(ImmutableRow):
        m.FlowExecutionPlan.objects.filter(pk=plan.pk).update(plan_payload={})
    with pytest.raises(ImmutableRow):
        plan.catalog.delete()


def test_plan_catalog_reference_is_composite_in_the_database(org, demo_source):
    plan = flow_deploy(org=org, source=demo_source, flow_api_name="Contact_Push_Customer_To_Billing").plan
    values = {f.attname: getattr(plan, f.attname) for f in m.FlowExecutionPlan._meta.fields if f.attname != "id"}
    values.update(plan_id="plan_forged", plan_digest="f" * 64, metadata_digest="e" * 64,
                  catalog_digest="0" * 64)  # every other component still matches
    with pytest.raises(IntegrityError):
        with transaction.atomic():
            plan_insert(**values)
    values.update(catalog_digest=plan.catalog_digest, runtime_capability_id="another-capability")
    with pytest.raises(IntegrityError):
        with transaction.atomic():
            plan_insert(**values)


def test_activating_a_new_plan_supersedes_and_runs_keep_theirs(org):
    first = flow_deploy(org=org, source=decision_flow_xml(), flow_api_name="Decide_Only")
    record = save_record(org, {"lifecyclestage": "customer", "email": "a@example.com"})
    run = m.FlowRun.objects.get(org_id=org.org_id, record_key=record.record_key)
    second = flow_deploy(org=org, source=decision_flow_xml(filter_value="lead"), flow_api_name="Decide_Only")
    assert second.activated and second.plan.pk != first.plan.pk
    old = m.FlowActivation.objects.get(pk=first.activation.pk)
    assert old.state == t.ACTIVATION_SUPERSEDED and old.active_slot is None and old.superseded_at is not None
    assert m.FlowActivation.objects.get(pk=second.activation.pk).state == t.ACTIVATION_ACTIVE
    assert m.FlowActivation.objects.filter(org_id=org.org_id, state=t.ACTIVATION_ACTIVE).count() == 1
    run.refresh_from_db()
    assert run.plan_id == first.plan.pk
    # The superseded plan no longer admits; the new one does.
    save_record(org, {"lifecyclestage": "customer"})
    lead = save_record(org, {"lifecyclestage": "lead"})
    assert m.FlowRun.objects.filter(org_id=org.org_id).count() == 2
    assert m.FlowRun.objects.get(org_id=org.org_id, record_key=lead.record_key).plan_id == second.plan.pk


def test_compile_error_writes_no_plan(org, demo_source):
    bad = demo_source.replace(b"PushToConnector", b"Unknown")
    with pytest.raises(CompileError):
        flow_deploy(org=org, source=bad, flow_api_name="Contact_Push_Customer_To_Billing")
    assert not m.FlowExecutionPlan.objects.exists() and not m.FlowActivation.objects.exists()


def test_flow_deploy_command(org, tmp_path):
    out = io.StringIO()
    call_command("flow_deploy", "--org", org.org_id, str(DEMO_FLOW), stdout=out)
    plan = m.FlowExecutionPlan.objects.get(org_id=org.org_id)
    assert f"plan_id={plan.plan_id}" in out.getvalue() and "activated" in out.getvalue()
    out = io.StringIO()
    call_command("flow_deploy", "--org", org.org_id, str(DEMO_FLOW), stdout=out)
    assert "unchanged" in out.getvalue()
    assert m.FlowExecutionPlan.objects.count() == 1 and m.FlowActivation.objects.count() == 1

    bad = tmp_path / "Broken.flow-meta.xml"
    bad.write_bytes(DEMO_FLOW.read_bytes().replace(b"<actionType>apex</actionType>", b"<actionType>flow</actionType>"))
    err = io.StringIO()
    with pytest.raises(CommandError) as exc:
        call_command("flow_deploy", "--org", org.org_id, str(bad), stderr=err)
    assert exc.value.returncode == 1
    assert "unknown_action:flow:PushToConnector" in err.getvalue()
    assert m.FlowExecutionPlan.objects.count() == 1


def test_flow_compile_command(tmp_path):
    out = io.StringIO()
    call_command("flow_compile", str(DEMO_FLOW), stdout=out)
    assert "submit:Push_Customer_To_Billing(EffectSubmit)" in out.getvalue()
    assert not m.FlowExecutionPlan.objects.exists() and not m.FlowActionCatalogGeneration.objects.exists()
    bad = tmp_path / "Looping.flow-meta.xml"
    bad.write_bytes(b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY e "e">]><Flow/>')
    out = io.StringIO()
    with pytest.raises(CommandError) as exc:
        call_command("flow_compile", str(DEMO_FLOW), str(bad), stdout=out)
    assert exc.value.returncode == 1
    assert "xml_forbidden_declaration" in out.getvalue()


def test_every_flow_model_has_a_read_only_admin(rf, admin_user):
    from nexusflow.kernel.admin import ReadOnlyAdmin

    request = rf.get("/admin/")
    request.user = admin_user
    for model in (m.FlowActionCatalogGeneration, m.FlowExecutionPlan, m.FlowActivation, m.FlowRun,
                  m.FlowStepExecution, m.FlowStepAttempt, m.FlowCheckpoint, m.FlowDependency, m.FlowWakeSignal,
                  m.FlowEffectLink):
        model_admin = admin.site._registry[model]
        assert isinstance(model_admin, ReadOnlyAdmin)
        assert not model_admin.has_add_permission(request)
        assert not model_admin.has_change_permission(request)
        assert not model_admin.has_delete_permission(request)


def test_created_at_comes_from_the_database_clock(org, demo_source):
    before = db_now()
    plan = flow_deploy(org=org, source=demo_source, flow_api_name="Contact_Push_Customer_To_Billing").plan
    assert plan.created_at >= before


def test_flow_deploy_run_atomically_fails_with_the_blocker_and_writes_nothing(org):
    err = io.StringIO()
    with pytest.raises(CommandError) as exc:
        call_command("flow_deploy", "--org", org.org_id, "--run-atomically", str(DEMO_FLOW), stderr=err)
    assert exc.value.returncode == 1
    assert "unsafe_atomic_request [Push_Customer_To_Billing (apex:PushToConnector: external_effect)]" in err.getvalue()
    assert not m.FlowExecutionPlan.objects.filter(org_id=org.org_id).exists()
    assert not m.FlowActivation.objects.filter(org_id=org.org_id).exists()
