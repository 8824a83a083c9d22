"""Greenfield activation (issue: walking slice item 5; seed 003 "State machines")."""
import json
import signal
from itertools import pairwise

import pytest

from connectors.models import AccountServingGate, GateTransitionEvidence, PackGeneration, ServingEpoch
from connectors.serving.gates import EpochVerificationFailed, epoch_prepare
from cutover.models import CutoverDecision, CutoverEvidence
from cutover.services import CutoverRefused, cutover_greenfield
from nexusflow.kernel.scope import OrgScope
from tests.conftest import ORG, apply_service_configuration, run_manage, subprocess_env
from tests.connectors.generation_helpers import tamper_row

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

WALK = ["v1_serving", "halting_v1", "v1_stopped", "v1_drained", "v2_validating", "v2_serving"]


def test_greenfield_walks_every_gate_and_activates_atomically():
    org = OrgScope(ORG)
    apply_service_configuration(org, "http://127.0.0.1:9")
    report = cutover_greenfield(org=org)
    epoch = ServingEpoch.objects.get()
    assert epoch.state == "active" and report.epoch_id == epoch.pk
    for gate in AccountServingGate.objects.all():
        assert gate.state == "v2_serving" and gate.epoch_id == epoch.pk and gate.epoch_digest == epoch.digest
        walk = list(GateTransitionEvidence.objects.filter(gate=gate).order_by("id").values_list("from_state", "to_state"))
        assert walk == list(pairwise(WALK))
    assert CutoverDecision.objects.get().state == "v2_committed"
    assert CutoverEvidence.objects.filter(kind="v1_shutdown_certificate").count() == 2
    again = cutover_greenfield(org=org)
    assert again.already_active and ServingEpoch.objects.count() == 1


def test_a_pack_changed_after_configuration_rejects_the_epoch():
    """A pack generation whose stored document drifted after the configuration froze it rejects the epoch."""
    org = OrgScope(ORG)
    apply_service_configuration(org, "http://127.0.0.1:9")
    assert epoch_prepare(org=org).state == "prepared"
    tamper_row(PackGeneration, PackGeneration.objects.get(pack_key="billing").pk,
               document=json.dumps({**PackGeneration.objects.get(pack_key="billing").document, "version": "9.9.9"}))
    with pytest.raises(EpochVerificationFailed):
        cutover_greenfield(org=org)
    assert ServingEpoch.objects.get().state == "rejected"
    assert set(AccountServingGate.objects.values_list("state", flat=True)) == {"v1_serving"}
    assert not CutoverDecision.objects.exists()


def test_greenfield_refuses_an_org_without_configuration():
    with pytest.raises(CutoverRefused):
        cutover_greenfield(org=OrgScope(ORG))


def test_crash_before_activation_resumes_the_same_branch():
    apply_service_configuration(OrgScope(ORG), "http://127.0.0.1:9")
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
