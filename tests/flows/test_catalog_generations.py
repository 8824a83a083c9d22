"""Capability catalog generations, plan identity and activation bindings (seed 004 sections 7.4, 8 and 22.1)."""
from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction

from nexusflow.flows import models as m
from nexusflow.flows import transitions as t
from nexusflow.flows.binding import flow_runtime_binding
from nexusflow.flows.catalog import (
    CatalogBuilder,
    CatalogError,
    CatalogMismatch,
    catalog_build,
    catalog_current,
    catalog_snapshot_from_row,
    catalog_source_load,
)
from nexusflow.flows.compiler import CompileError, compile_flow
from nexusflow.flows.errors import ActivationRejected, FlowAdmissionRejected
from nexusflow.flows.inventory import flow_inventory
from nexusflow.flows.services import admission, deploy, flow_compile_check, flow_deploy
from nexusflow.flows.store import catalog_insert, plan_insert
from nexusflow.kernel import canonical_json
from nexusflow.kernel.digests import digest_json_v2, digest_v2
from nexusflow.kernel.errors import ImmutableRow
from nexusflow.kernel.scope import OrgScope
from nexusflow.records.metadata import MetadataView, current_view

from . import flowxml as fx
from .conftest import DEMO_FLOW, FLOW_ORG, decision_flow_xml, save_record

DEMO = "Contact_Push_Customer_To_Billing"


def _binding(org: str = FLOW_ORG):
    return flow_runtime_binding(org_id=org, metadata_view_digest=current_view().digest)


def _with_push(source: dict, **changes) -> dict:
    return {**source, "entries": [{**e, **changes} if e["action_name"] == "PushToConnector" else e
                                  for e in source["entries"]]}


def _plan(catalog, source: bytes = None):
    return compile_flow(source=source or DEMO_FLOW.read_bytes(), flow_api_name=DEMO, catalog=catalog,
                        view=current_view())


# --- section 8.1 digest order ----------------------------------------------------------------
def test_catalog_digests_are_computed_in_the_section_8_1_order():
    snapshot = catalog_current(binding=_binding())
    raw = next(e for e in catalog_source_load()["entries"] if e["action_name"] == "PushToConnector")
    entry = snapshot.entry("apex", "PushToConnector")
    # 1. descriptor digest
    descriptor = {"kind": raw["kind"], "effect_family": raw["effect_family"],
                  "inputs": sorted([i["name"], i["source"], i["required"]] for i in raw["inputs"]),
                  "capabilities": raw["capabilities"]}
    descriptor_digest = digest_json_v2("flows.catalog.descriptor", canonical_json.dumps(descriptor)).hexdigest
    assert entry.descriptor_digest == descriptor_digest
    # 2. binding fingerprint: algorithm, owner, handler ref, handler version, descriptor digest
    fingerprint = digest_v2("flows.catalog.binding-fingerprint", [
        ("algorithm", "flows.binding-fingerprint.v1"), ("owner_registration_id", raw["owner_registration_id"]),
        ("handler_ref", raw["handler_ref"]), ("handler_version", raw["handler_version"]),
        ("descriptor_digest", descriptor_digest)]).hexdigest
    assert entry.binding_fingerprint == fingerprint
    # 3. entry digest over the complete entry including the fingerprint
    body = {"action_key": "apex:PushToConnector", "owner_registration_id": raw["owner_registration_id"],
            "owner_class": raw["owner_class"], "handler_ref": raw["handler_ref"],
            "handler_version": raw["handler_version"], "descriptor": descriptor, "binding_fingerprint": fingerprint}
    assert entry.entry_digest == digest_json_v2("flows.catalog.entry", canonical_json.dumps(body)).hexdigest
    # 4. catalog digest: complete binding digest plus the sorted entry digests
    fields = [("binding_digest", _binding().digest), ("contract_version", snapshot.contract_version),
              ("entry_count", len(snapshot.entries))]
    fields += [("entry_digest", snapshot.entries[k].entry_digest) for k in sorted(snapshot.entries)]
    assert snapshot.digest == digest_v2("flows.catalog", fields).hexdigest
    assert snapshot.generation_id == f"cg_{snapshot.digest[:32]}"


def test_builder_conflict_policy_rejects_the_generation():
    source = catalog_source_load()
    push = next(e for e in source["entries"] if e["action_name"] == "PushToConnector")
    builder = CatalogBuilder(binding=_binding(), contract_version=source["contract_version"])
    builder.submit(push)
    builder.submit(dict(push))  # byte-identical re-submission is idempotent
    with pytest.raises(CatalogError, match="platform-owned"):
        builder.submit({**push, "owner_class": "pack", "owner_registration_id": "pack.other"})
    with pytest.raises(CatalogError, match="another RuntimeWorkBinding"):
        builder.submit(push, scope=_binding("another-org"))
    with pytest.raises(CatalogError, match="reserved"):
        catalog_build(binding=_binding(), source={**source, "entries": [
            {**source["entries"][0], "owner_class": "pack"}]})
    missing = {k: v for k, v in push["capabilities"].items() if k != "replay_policy"}
    with pytest.raises(CatalogError, match="capabilities must declare"):
        catalog_build(binding=_binding(), source=_with_push(source, capabilities=missing))
    with pytest.raises(CatalogError, match="unknown replay_policy"):
        catalog_build(binding=_binding(), source=_with_push(
            source, capabilities={**push["capabilities"], "replay_policy": "sometimes"}))
    sealed = builder.seal()
    with pytest.raises(CatalogError, match="sealed"):
        builder.submit(push)
    assert list(sealed.entries) == ["apex:PushToConnector"]


def test_reserved_contract_only_action_does_not_compile_as_executable():
    source = _with_push(catalog_source_load(), handler_ref=None, handler_version=None)
    catalog = catalog_build(binding=_binding(), source=source)
    assert not catalog.entry("apex", "PushToConnector").executable
    with pytest.raises(CompileError) as exc:
        _plan(catalog)
    assert "capability_not_executable:apex:PushToConnector" in {d.code for d in exc.value.diagnostics}


# --- section 22.1 identity proofs --------------------------------------------------------------
def test_changed_action_capability_changes_plan_identity():
    source = catalog_source_load()
    base = catalog_build(binding=_binding(), source=source)
    push = base.entry("apex", "PushToConnector")
    changed = catalog_build(binding=_binding(), source=_with_push(
        source, capabilities={**push.capabilities, "lock_plan_contract": "metadata_derived_keys"}))
    new = changed.entry("apex", "PushToConnector")
    assert new.descriptor_digest != push.descriptor_digest and new.entry_digest != push.entry_digest
    assert changed.digest != base.digest
    before, after = _plan(base), _plan(changed)
    assert after.plan_digest != before.plan_digest
    assert after.steps[0]["entry_digest"] == new.entry_digest
    # An unrelated entry's change still changes the catalog digest and hence the plan identity.
    other = catalog_build(binding=_binding(), source={**source, "entries": [
        {**e, "handler_version": "7"} if e["action_name"] == "loops" else e for e in source["entries"]]})
    assert _plan(other).plan_digest != before.plan_digest


def test_changed_handler_version_changes_fingerprint_generation_and_plan_identity():
    source = catalog_source_load()
    base = catalog_build(binding=_binding(), source=source)
    bumped = catalog_build(binding=_binding(), source=_with_push(source, handler_version="2"))
    old, new = base.entry("apex", "PushToConnector"), bumped.entry("apex", "PushToConnector")
    assert new.descriptor_digest == old.descriptor_digest  # same capability, other implementation
    assert new.binding_fingerprint != old.binding_fingerprint
    assert bumped.generation_id != base.generation_id
    assert _plan(bumped).plan_digest != _plan(base).plan_digest
    assert _plan(bumped).steps[0]["binding_fingerprint"] == new.binding_fingerprint


@pytest.mark.django_db
def test_plan_cannot_outlive_or_silently_rebind_its_catalog_generation(org, demo_source, monkeypatch):
    first = flow_deploy(org=org, source=demo_source, flow_api_name=DEMO).plan
    generation = first.catalog
    with pytest.raises(ImmutableRow):
        m.FlowExecutionPlan.objects.filter(org_id=org.org_id, pk=first.pk).update(catalog=generation)
    with pytest.raises(ImmutableRow):
        generation.delete()
    with pytest.raises(IntegrityError):  # the database refuses too (ON DELETE RESTRICT)
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute("DELETE FROM flows_flowactioncataloggeneration WHERE id = %s AND org_id = %s",
                        [generation.pk, org.org_id])
    # A new release (another handler version) seals a new generation and compiles a new plan;
    # the old plan keeps its own generation.
    source = _with_push(catalog_source_load(), handler_version="2")
    monkeypatch.setattr(deploy, "catalog_current", lambda *, binding: catalog_build(binding=binding, source=source))
    from nexusflow.flows import handlers
    monkeypatch.setitem(handlers.IN_BINARY_HANDLERS, "runtime_outbox.services.outbound_command_author", "2")
    second = flow_deploy(org=org, source=demo_source, flow_api_name=DEMO).plan
    assert second.pk != first.pk and second.catalog_id != first.catalog_id
    first.refresh_from_db()
    assert first.catalog_id == generation.pk and first.catalog_digest == generation.digest
    assert m.FlowActionCatalogGeneration.objects.filter(org_id=org.org_id).count() == 2


@pytest.mark.django_db
def test_catalog_from_another_scope_cannot_satisfy_the_plan_even_when_ids_and_digests_collide(org, demo_source):
    plan = flow_deploy(org=org, source=demo_source, flow_api_name=DEMO).plan
    mine = plan.catalog
    other_org = OrgScope("another-flow-org")
    values = {f.attname: getattr(mine, f.attname) for f in m.FlowActionCatalogGeneration._meta.fields
              if f.attname != "id"}
    forged = []
    for change in ({"org_id": other_org.org_id}, {"app_installation_id": "another-install"},
                   {"runtime_capability_id": "another-capability"}, {"binding_digest": "b" * 64}):
        forged.append(catalog_insert(**{**values, **change}))  # same generation id, digest and entries
    plan_values = {f.attname: getattr(plan, f.attname) for f in m.FlowExecutionPlan._meta.fields
                   if f.attname != "id"}
    for row in forged:
        with pytest.raises(IntegrityError):
            with transaction.atomic():
                plan_insert(**{**plan_values, "plan_id": f"plan_forged{row.pk}", "plan_digest": "f" * 63 + "0",
                               "metadata_digest": "e" * 64, "catalog_id": row.pk})
    # Runtime lookup: the plan's binding cannot read a generation of another scope.
    binding = _binding()
    for row in forged:
        with pytest.raises(CatalogMismatch):
            catalog_snapshot_from_row(binding=binding, row=row)
    assert catalog_snapshot_from_row(binding=binding, row=mine).digest == mine.digest


@pytest.mark.django_db
def test_runtime_view_or_trigger_change_invalidates_the_activation_binding_and_plan_identity(org, monkeypatch):
    first = flow_deploy(org=org, source=decision_flow_xml(), flow_api_name="Decide_Only")
    activation = first.activation
    assert (activation.runtime_work_binding_digest, activation.trigger_binding_digest) == (
        first.plan.runtime_work_binding_digest, first.plan.trigger_binding_digest)
    save_record(org, {"lifecyclestage": "customer"})
    assert m.FlowRun.objects.filter(org_id=org.org_id).count() == 1
    # A metadata publication: the request-bound view now has another digest.
    view = current_view()
    published = MetadataView(objects=view.objects, digest="d" * 64)
    monkeypatch.setattr(admission, "current_view", lambda: published)
    with pytest.raises(FlowAdmissionRejected):
        save_record(org, {"lifecyclestage": "customer"})
    assert m.FlowRun.objects.filter(org_id=org.org_id).count() == 1  # nothing admitted, the save rolled back
    binding = flow_runtime_binding(org_id=org.org_id, metadata_view_digest=published.digest)
    recompiled = compile_flow(source=decision_flow_xml(), flow_api_name="Decide_Only",
                              catalog=catalog_current(binding=binding), view=published)
    assert recompiled.plan_digest != first.plan.plan_digest
    assert recompiled.trigger_binding_digest != first.plan.trigger_binding_digest
    monkeypatch.undo()
    # A trigger-subscription change is a new trigger binding digest and a new plan; the old binding is superseded.
    second = flow_deploy(org=org, source=decision_flow_xml(record_trigger_type="Create"), flow_api_name="Decide_Only")
    assert second.plan.trigger_binding_digest != first.plan.trigger_binding_digest
    assert m.FlowActivation.objects.get(org_id=org.org_id, pk=activation.pk).state == t.ACTIVATION_SUPERSEDED


@pytest.mark.django_db
def test_v2_trigger_admission_uses_the_request_bound_binding_and_never_a_live_fallback(org, monkeypatch):
    plan = flow_deploy(org=org, source=decision_flow_xml(), flow_api_name="Decide_Only").plan

    def forbidden(*args, **kwargs):
        raise AssertionError("admission must not re-resolve through the catalog, compiler or flow files")

    for module in (admission, deploy):  # admission names none of them; deploy holds them all
        for name in ("catalog_current", "compile_flow", "flow_plan_compile"):
            monkeypatch.setattr(module, name, forbidden, raising=False)
    record = save_record(org, {"lifecyclestage": "customer"})
    run = m.FlowRun.objects.get(org_id=org.org_id, record_key=record.record_key)
    assert (run.plan_id, run.binding_digest) == (plan.pk, plan.runtime_work_binding_digest)
    # A forged activation binding (trigger digest of another subscription) fails admission closed.
    with connection.cursor() as cur:
        cur.execute("UPDATE flows_flowactivation SET trigger_binding_digest = %s WHERE org_id = %s",
                    ["c" * 64, org.org_id])
    with pytest.raises(FlowAdmissionRejected):
        save_record(org, {"lifecyclestage": "customer"})
    assert m.FlowRun.objects.filter(org_id=org.org_id).count() == 1


@pytest.mark.django_db
def test_activation_and_setup_verification_use_the_same_compiler_result(org, demo_source, tmp_path):
    checked = flow_compile_check(source=demo_source, flow_api_name=DEMO, org=org)
    deployed = flow_deploy(org=org, source=demo_source, flow_api_name=DEMO).plan
    assert deployed.plan_digest == checked.plan_digest and deployed.plan_payload == checked.payload
    out = io.StringIO()
    call_command("flow_compile", "--org", org.org_id, str(DEMO_FLOW), stdout=out)
    assert f"plan_digest={deployed.plan_digest}" in out.getvalue()
    # The inventory runs the same compiler: same plan for the same binding.
    (tmp_path / f"{DEMO}.flow-meta.xml").write_bytes(demo_source)
    row, = flow_inventory(str(tmp_path), schema="strict")
    compile_only = flow_compile_check(source=demo_source, flow_api_name=DEMO, org=OrgScope("compile-check"))
    assert row.plan_digest == compile_only.plan_digest and row.profile == deployed.execution_profile
    # A rejected flow is rejected with the same diagnostics by every path.
    bad = demo_source.replace(b"PushToConnector", b"Nope")
    with pytest.raises(CompileError) as check_exc:
        flow_compile_check(source=bad, flow_api_name=DEMO, org=org)
    with pytest.raises(CompileError) as deploy_exc:
        flow_deploy(org=org, source=bad, flow_api_name=DEMO)
    assert check_exc.value.diagnostics == deploy_exc.value.diagnostics
    (tmp_path / f"{DEMO}.flow-meta.xml").write_bytes(bad)
    row, = flow_inventory(str(tmp_path), schema="strict")
    assert row.reasons == [d.as_json() for d in check_exc.value.diagnostics]


@pytest.mark.django_db
def test_activation_refuses_what_this_engine_cannot_run(org):
    # Bounded Atomic assignments are executable now (issue #8) and activate ...
    atomic = fx.flow(fx.assignment("Set", None, [("v", "Assign", "<stringValue>x</stringValue>")]),
                     fx.variable("v"), start=fx.start("Set", trigger="RecordAfterSave"))
    assert flow_deploy(org=org, source=atomic, flow_api_name="Atomic_Flow").plan.execution_profile == "bounded_atomic"
    # ... an assignment value the interpreter does not evaluate (an Apex-defined value) is still refused at
    # activation (every assignment operator runs now).
    unsupported = fx.flow(fx.assignment("Set", None, [("v", "Assign", "<apexValue>x</apexValue>")]),
                          fx.variable("v"), start=fx.start("Set", trigger="RecordAfterSave"))
    with pytest.raises(ActivationRejected) as exc:
        flow_deploy(org=org, source=unsupported, flow_api_name="Unsupported_Flow")
    assert "engine_unsupported:value" in {d.code for d in exc.value.diagnostics}
    assert not m.FlowActivation.objects.filter(org_id=org.org_id, flow_api_name="Unsupported_Flow").exists()
    # the deploy transaction rolled back: no plan of the refused flow either
    assert not m.FlowExecutionPlan.objects.filter(org_id=org.org_id, flow_api_name="Unsupported_Flow").exists()


@pytest.mark.django_db
def test_deploy_persists_the_metadata_view_artifact_it_compiled_against(org, demo_source):
    plan = flow_deploy(org=org, source=demo_source, flow_api_name=DEMO).plan
    view = m.FlowRuntimeMetadataView.objects.get(org_id=org.org_id, view_digest=plan.metadata_view_digest)
    assert sorted(view.objects_payload) == sorted(current_view().objects)
    with pytest.raises(IntegrityError):  # a referenced view cannot be deleted
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute("DELETE FROM flows_flowruntimemetadataview WHERE id = %s AND org_id = %s",
                        [view.pk, org.org_id])
    values = {f.attname: getattr(plan, f.attname) for f in m.FlowExecutionPlan._meta.fields if f.attname != "id"}
    with pytest.raises(IntegrityError):  # nor can a plan name a view that was never persisted
        with transaction.atomic():
            plan_insert(**{**values, "plan_id": "plan_noview", "plan_digest": "9" * 64, "metadata_digest": "8" * 64,
                           "metadata_view_digest": "7" * 64})
