"""``cutover preflight`` and the CutoverReadinessCertificate (issue 21 item 2).

Seed 003 "Operational liveness and maintenance admission" and "Compressed durable model";
proofs S003-RP-14, S003-RP-36 (their preflight halves) and S003-RP-37. Real MariaDB; the V1
workload is accepted through the real V1 ingress route.
"""
from __future__ import annotations

import copy
import json
import os
import sys

import pytest

from connectors.models import AccountServingGate, V1Event, V1ProviderCall
from connectors.serving.gates import epoch_prepare
from cutover import reasons, selectors
from cutover.models import CutoverEvidence, CutoverReadinessCertificate
from cutover.preflight import (
    PHASES,
    CertificateInputChanged,
    CutoverPlanInvalid,
    ReadinessRefused,
    cutover_preflight,
    cutover_reason_codes,
    validate_plan,
)
from cutover.services import CutoverRefused, cutover_greenfield
from cutover.status import cutover_status
from nexusflow.kernel import canonical_json
from nexusflow.kernel.errors import ImmutableRow
from nexusflow.kernel.models import insert
from nexusflow.kernel.scope import OrgScope
from tests.conftest import ORG, hubspot_event, run_manage, subprocess_env
from tests.connectors.v1.support import install_v1, post_v1

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

ROUTE = "crm-webhooks/contacts.webhook"


def full_plan() -> dict:
    """A complete L2 plan for the test configuration (one pushed, order-dependent route): the demo service's."""
    from packs.demo.cutover_journeys import plan_document

    return plan_document()


@pytest.fixture
def v1_org(client, billing_sandbox):
    """A V1 install that accepted two webhook events (two partitions) through the V1 ingress."""
    org = install_v1(billing_sandbox.base_url)
    response = post_v1(client, [hubspot_event(1, 501, 1001, "email", "a@example.test"),
                                hubspot_event(2, 502, 1002, "email", "b@example.test")])
    assert response.status_code == 202, response.content
    return org


def _codes(exc: ReadinessRefused) -> set[tuple[str, str]]:
    return {(b["reason_code"], b["subject"]) for b in exc.blockers}


# --- the certificate -----------------------------------------------------------------------------------
def test_preflight_certifies_measured_workload_in_one_immutable_byte_stable_certificate(v1_org):
    report = cutover_preflight(org=v1_org, attempt_key="attempt-1", plan=full_plan())
    assert report.created
    certificate = CutoverReadinessCertificate.objects.get()
    document = json.loads(bytes(certificate.document))
    assert bytes(certificate.document) == canonical_json.dumps(document)
    measured = document["measurements"]
    assert measured["accepted_backlog"]["open_events"] == 2
    assert measured["partitions"] == {ROUTE: 2} and measured["unpositioned_events"] == {ROUTE: 0}
    assert measured["transport_keys"] == 1 and measured["ambiguous_provider_calls"] == 0
    assert [(r["account_key"], r["route_key"], r["disposition"]) for r in document["routes"]] == \
        [("crm-webhooks", "contacts.webhook", "v1_high_water")]
    assert document["epoch"] == {"id": int(certificate.epoch_id), "digest": certificate.epoch_digest}
    # drain: 2 open events at 1/s, doubled by the 200 % safety margin.
    assert document["projections"]["drain"]["projected_seconds"] == 4
    assert {r["code"] for r in document["reasons"]} == set(cutover_reason_codes())
    assert set(AccountServingGate.objects.values_list("state", flat=True)) == {"v1_serving"}

    again = cutover_preflight(org=v1_org, attempt_key="attempt-1", plan=full_plan())
    assert not again.created and again.digest == report.digest
    assert CutoverReadinessCertificate.objects.count() == 1
    assert bytes(CutoverReadinessCertificate.objects.get().document) == bytes(certificate.document)
    # It lives with the gates it freezes (the main database), not in the control journal.
    assert CutoverReadinessCertificate.objects.using("default").filter(pk=certificate.pk).exists()
    with pytest.raises(ImmutableRow):
        certificate.save()


def test_a_changed_input_needs_a_new_attempt_and_gives_a_byte_distinct_certificate(client, v1_org):
    """S003-RP-37: same attempt + another plan or workload is refused; a new attempt certifies new bytes."""
    first = cutover_preflight(org=v1_org, attempt_key="attempt-1", plan=full_plan())
    tighter = full_plan()
    tighter["budgets_seconds"]["drain"] = 600
    with pytest.raises(CertificateInputChanged):
        cutover_preflight(org=v1_org, attempt_key="attempt-1", plan=tighter)
    assert post_v1(client, [hubspot_event(3, 503, 1003, "email", "c@example.test")]).status_code == 202
    with pytest.raises(CertificateInputChanged):
        cutover_preflight(org=v1_org, attempt_key="attempt-1", plan=full_plan())
    second = cutover_preflight(org=v1_org, attempt_key="attempt-2", plan=tighter)
    assert second.created and second.digest != first.digest
    rows = {c.attempt_key: bytes(c.document) for c in CutoverReadinessCertificate.objects.all()}
    assert rows["attempt-1"] != rows["attempt-2"]
    assert json.loads(rows["attempt-2"])["measurements"]["accepted_backlog"]["open_events"] == 3


# --- route dispositions (S003-RP-14, preflight half) -----------------------------------------------------
@pytest.mark.parametrize("disposition, detail", [
    (None, "no migration disposition"),
    ("unsupported", "not one of"),
    ("order_independent", "order_independent contract"),
    ("provider_snapshot_barrier", "pulled route"),
])
def test_a_route_without_a_proved_disposition_is_ineligible_before_maintenance(v1_org, disposition, detail):
    plan = full_plan()
    if disposition is None:
        del plan["routes"][ROUTE]
    else:
        plan["routes"][ROUTE] = {"disposition": disposition}
    with pytest.raises(ReadinessRefused) as refused:
        cutover_preflight(org=v1_org, attempt_key="attempt-1", plan=plan)
    assert _codes(refused.value) == {(reasons.ROUTE_MIGRATION_UNSUPPORTED, ROUTE)}
    assert detail in refused.value.blockers[0]["detail"]
    assert not CutoverReadinessCertificate.objects.exists()
    assert set(AccountServingGate.objects.values_list("state", flat=True)) == {"v1_serving"}
    evidence = selectors.preflight_refusals(org_id=ORG, reason_code=reasons.ROUTE_MIGRATION_UNSUPPORTED)
    assert [row.payload["attempt_key"] for row in evidence] == ["attempt-1"]


def test_arrival_order_is_not_a_v1_high_water_proof(v1_org):
    """A V1 event without a typed source position makes ``v1_high_water`` unprovable for its route."""
    sibling = V1Event.objects.filter(org_id=ORG).first()
    insert(V1Event, org_id=ORG, account_key=sibling.account_key, channel=sibling.channel, route_key=sibling.route_key,
           transport=sibling.transport, ordinal=9, source_event_key="no-position", payload={"objectId": 9},
           state="pending")
    with pytest.raises(ReadinessRefused) as refused:
        cutover_preflight(org=v1_org, attempt_key="attempt-1", plan=full_plan())
    assert _codes(refused.value) == {(reasons.ROUTE_MIGRATION_UNSUPPORTED, ROUTE)}
    assert "arrival order" in refused.value.blockers[0]["detail"]


# --- incomplete inputs (S003-RP-37) ---------------------------------------------------------------------
def _drop(path: str):
    def apply(plan: dict) -> None:
        *parents, leaf = path.split(".")
        node = plan
        for key in parents:
            node = node[key]
        del node[leaf]
    return apply


@pytest.mark.parametrize("change, code, subject", [
    (_drop("budgets_seconds.restore_rehearsal"), reasons.READINESS_INPUT_INCOMPLETE, "budgets_seconds.restore_rehearsal"),
    (_drop("throughput.backup_bytes_per_second"), reasons.READINESS_INPUT_INCOMPLETE, "throughput.recovery_point"),
    (_drop("alert_owners.v1_retry_exhausted"), reasons.READINESS_INPUT_INCOMPLETE, "alert_owners.v1_retry_exhausted"),
    (lambda p: p["alert_owners"]["cutover_budget_exceeded"].pop("remediation_owner"),
     reasons.READINESS_INPUT_INCOMPLETE, "alert_owners.cutover_budget_exceeded"),
    (_drop("halt_contracts.root_outbound"), reasons.READINESS_INPUT_INCOMPLETE, "halt_contracts.root_outbound"),
    (lambda p: p["halt_contracts"]["ingress"].pop(ROUTE), reasons.ROUTE_HALT_CONTRACT_MISSING, ROUTE),
    (lambda p: p["halt_contracts"]["ingress"].update({ROUTE: "cursor_hold"}), reasons.ROUTE_HALT_CONTRACT_MISSING,
     ROUTE),
], ids=["budget", "throughput", "alert-owner", "remediation-owner", "root-outbound-halt", "ingress-halt",
        "wrong-ingress-halt"])
def test_certificate_creation_rejects_incomplete_inputs(v1_org, change, code, subject):
    plan = full_plan()
    change(plan)
    with pytest.raises(ReadinessRefused) as refused:
        cutover_preflight(org=v1_org, attempt_key="attempt-1", plan=plan)
    assert (code, subject) in _codes(refused.value)
    assert not CutoverReadinessCertificate.objects.exists()


@pytest.mark.parametrize("plan, problem", [
    ([], "JSON object"),
    ({**full_plan(), "plan_version": 2}, "plan_version"),
    ({**full_plan(), "budget": {}}, "unknown key 'budget'"),
    ({**full_plan(), "budgets_seconds": {"drain": "10"}}, "budgets_seconds.drain"),
    ({**full_plan(), "budgets_seconds": {"coffee": 10}}, "unknown key 'coffee'"),
    ({**full_plan(), "safety_percent": 50}, "safety_percent"),
    ({**full_plan(), "routes": {ROUTE: "v1_high_water"}}, "routes must map"),
])
def test_a_malformed_plan_is_bad_input(plan, problem):
    with pytest.raises(CutoverPlanInvalid, match=problem):
        validate_plan(copy.deepcopy(plan))


# --- budgets (S003-RP-36, preflight half) ---------------------------------------------------------------
def test_a_projection_over_its_budget_refuses_the_attempt(v1_org):
    plan = full_plan()
    plan["budgets_seconds"]["drain"] = 3  # 2 open events at 1/s with a 200 % margin project 4 s
    plan["throughput"]["backup_bytes_per_second"] = 1024
    with pytest.raises(ReadinessRefused) as refused:
        cutover_preflight(org=v1_org, attempt_key="attempt-1", plan=plan)
    assert _codes(refused.value) == {(reasons.CUTOVER_BUDGET_EXCEEDED, "drain"),
                                     (reasons.CUTOVER_BUDGET_EXCEEDED, "recovery_point")}
    plan["budgets_seconds"]["drain"] = 4
    plan["throughput"]["backup_bytes_per_second"] = 64 * 1024 * 1024
    assert cutover_preflight(org=v1_org, attempt_key="attempt-2", plan=plan).projections["drain"] == \
        {"budget_seconds": 4, "projected_seconds": 4}


def test_an_ambiguous_v1_call_blocks_preflight_whatever_the_budget(v1_org):
    insert(V1ProviderCall, allow_any_state=True, org_id=ORG, account_key="billing-main", call_site="v1.push.patch",
           kind="push", subject="contact-1", method="PATCH", url="http://127.0.0.1:9/x", request_body=b"{}",
           request_digest="0" * 64, state="ambiguous", reason_code="response_ambiguous")
    with pytest.raises(ReadinessRefused) as refused:
        cutover_preflight(org=v1_org, attempt_key="attempt-1", plan=full_plan())
    assert _codes(refused.value) == {(reasons.V1_EFFECT_UNRESOLVED, "v1_provider_calls")}


def test_preflight_runs_only_before_maintenance(billing_sandbox):
    from tests.conftest import apply_service_configuration

    org = OrgScope(ORG)
    apply_service_configuration(org, billing_sandbox.base_url)
    cutover_greenfield(org=org)
    with pytest.raises(CutoverRefused, match="v1_serving"):
        cutover_preflight(org=org, attempt_key="attempt-1", plan=full_plan())


# --- status and the command ------------------------------------------------------------------------------
def test_status_reports_blockers_then_the_certificate_and_its_budgets(v1_org):
    plan = full_plan()
    del plan["routes"][ROUTE]
    with pytest.raises(ReadinessRefused):
        cutover_preflight(org=v1_org, attempt_key="attempt-1", plan=plan)
    status = cutover_status(org=v1_org)
    assert status["phase"] == "v1_serving" and status["gates"] == {"v1_serving": 2}
    assert status["certificate"] is None and "cutover preflight" in status["next_command"]
    assert [(b["reason_code"], b["remediations"]) for b in status["blockers"]] == \
        [(reasons.ROUTE_MIGRATION_UNSUPPORTED, ["revise_cutover_plan"])]
    cutover_preflight(org=v1_org, attempt_key="attempt-2", plan=full_plan())
    status = cutover_status(org=v1_org)
    assert status["certificate"]["attempt_key"] == "attempt-2" and status["blockers"] == []
    assert set(status["budgets"]) == set(PHASES) and status["budgets"]["drain"]["projected_seconds"] == 4


def test_cutover_preflight_and_status_commands_as_a_new_operator_would(v1_org, tmp_path):
    env = subprocess_env()
    plan_file = tmp_path / "plan.json"
    plan_file.write_text("{not json", encoding="utf-8")
    bad = run_manage(["cutover", "preflight", "--org", ORG, "--attempt", "a1", "--plan", str(plan_file)], env)
    assert bad.returncode == 2 and "cutover_plan_invalid" in bad.stderr
    missing = run_manage(["cutover", "preflight", "--org", ORG], env)
    assert missing.returncode == 2 and "missing_argument" in missing.stderr
    plan = full_plan()
    plan["routes"][ROUTE] = {"disposition": "unsupported"}
    plan_file.write_text(json.dumps(plan), encoding="utf-8")
    refused = run_manage(["cutover", "preflight", "--org", ORG, "--attempt", "a1", "--plan", str(plan_file)], env)
    assert refused.returncode == 3 and "route_migration_unsupported" in refused.stderr
    plan_file.write_text(json.dumps(full_plan()), encoding="utf-8")
    done = run_manage(["cutover", "preflight", "--org", ORG, "--attempt", "a2", "--plan", str(plan_file)], env)
    assert done.returncode == 0, done.stderr
    assert CutoverReadinessCertificate.objects.get().digest in done.stdout
    status = run_manage(["cutover", "status", "--org", ORG, "--json"], env)
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert report["phase"] == "v1_serving" and report["certificate"]["attempt_key"] == "a2"
    assert CutoverEvidence.objects.filter(kind="preflight_refusal").count() == 1
    assert epoch_prepare(org=v1_org).state == "verified"


# --- the representative restore rehearsal (issue 21 item 2) ------------------------------------------------------
def test_preflight_rehearse_restores_the_live_database_on_its_own_server_and_records_the_measurement(v1_org,
                                                                                                   tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(full_plan()))
    done = run_manage(["cutover", "preflight", "--org", ORG, "--attempt", "rehearsed", "--plan", str(plan),
                       "--rehearse"], subprocess_env(), timeout=300)
    assert done.returncode == 0, done.stderr
    [measured] = CutoverEvidence.objects.filter(org_id=ORG, attempt_key="rehearsed", kind="preflight_rehearsal")
    assert measured.payload["ok"] is True and measured.payload["tables"] > 10 and measured.payload["bytes"] > 0
    assert {"dump", "install", "start", "restore", "verify", "total"} <= set(measured.payload["seconds"])
    assert CutoverReadinessCertificate.objects.filter(org_id=ORG, attempt_key="rehearsed").exists()


def test_preflight_rehearse_refuses_when_the_rehearsal_cannot_run_and_certifies_nothing(v1_org, tmp_path):
    """A real failure: the MariaDB client tools are not on the PATH of the process, so the dump fails."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(full_plan()))
    env = subprocess_env(PATH=os.path.dirname(sys.executable))  # the virtualenv's python, no MariaDB tools
    done = run_manage(["cutover", "preflight", "--org", ORG, "--attempt", "unrehearsable", "--plan", str(plan),
                       "--rehearse"], env, timeout=300)
    assert done.returncode == 3 and "restore_point_rehearsal_failed" in done.stderr, done.stderr
    assert not CutoverReadinessCertificate.objects.filter(org_id=ORG, attempt_key="unrehearsable").exists()
