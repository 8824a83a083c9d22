"""Greenfield activation (issue: walking slice item 5; seed 003 "State machines")."""
import json
import shutil
import signal

import pytest
from django.test import override_settings

from connectors.models import AccountServingGate, GateTransitionEvidence, ServingEpoch
from connectors.serving import EpochVerificationFailed, service_configuration_apply
from cutover.models import CutoverDecision, CutoverEvidence
from cutover.services import CutoverRefused, cutover_greenfield
from nexusflow.kernel.scope import OrgScope
from tests.conftest import ORG, ROOT, run_manage, service_document, subprocess_env

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

WALK = ["v1_serving", "halting_v1", "v1_stopped", "v1_drained", "v2_validating", "v2_serving"]


def test_greenfield_walks_every_gate_and_activates_atomically():
    org = OrgScope(ORG)
    service_configuration_apply(org=org, document=service_document("http://127.0.0.1:9"))
    report = cutover_greenfield(org=org)
    epoch = ServingEpoch.objects.get()
    assert epoch.state == "active" and report.epoch_id == epoch.pk
    for gate in AccountServingGate.objects.all():
        assert gate.state == "v2_serving" and gate.epoch_id == epoch.pk and gate.epoch_digest == epoch.digest
        walk = list(GateTransitionEvidence.objects.filter(gate=gate).order_by("id").values_list("from_state", "to_state"))
        assert walk == list(zip(WALK, WALK[1:]))
    assert CutoverDecision.objects.get().state == "v2_committed"
    assert CutoverEvidence.objects.filter(kind="v1_shutdown_certificate").count() == 2
    again = cutover_greenfield(org=org)
    assert again.already_active and ServingEpoch.objects.count() == 1


def test_a_pack_changed_after_configuration_rejects_the_epoch(tmp_path):
    packs = tmp_path / "packs"
    shutil.copytree(ROOT / "packs", packs, ignore=shutil.ignore_patterns("__pycache__"))
    org = OrgScope(ORG)
    with override_settings(NEXUS_PACKS_DIR=packs):
        service_configuration_apply(org=org, document=service_document("http://127.0.0.1:9"))
        pack_file = packs / "billing" / "pack.json"
        doc = json.loads(pack_file.read_text())
        doc["version"] = "9.9.9"
        pack_file.write_text(json.dumps(doc))
        with pytest.raises(EpochVerificationFailed):
            cutover_greenfield(org=org)
    assert ServingEpoch.objects.get().state == "rejected"
    assert set(AccountServingGate.objects.values_list("state", flat=True)) == {"v1_serving"}
    assert not CutoverDecision.objects.exists()


def test_greenfield_refuses_an_org_without_configuration():
    with pytest.raises(CutoverRefused):
        cutover_greenfield(org=OrgScope(ORG))


def test_crash_before_activation_resumes_the_same_branch():
    service_configuration_apply(org=OrgScope(ORG), document=service_document("http://127.0.0.1:9"))
    crashed = run_manage(["cutover", "greenfield", "--org", ORG],
                         subprocess_env(NEXUS_FAILPOINTS="cutover.before_activation"))
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert CutoverDecision.objects.get().state == "activating_v2"
    assert set(AccountServingGate.objects.values_list("state", flat=True)) == {"v2_validating"}
    assert ServingEpoch.objects.get().state == "verified"
    resumed = run_manage(["cutover", "greenfield", "--org", ORG], subprocess_env())
    assert resumed.returncode == 0, resumed.stderr
    assert CutoverDecision.objects.get().state == "v2_committed"
    assert set(AccountServingGate.objects.values_list("state", flat=True)) == {"v2_serving"}


def test_cutover_command_reports_a_clear_error():
    result = run_manage(["cutover", "greenfield", "--org", ORG], subprocess_env())
    assert result.returncode == 1
    assert "cutover_refused" in result.stderr
