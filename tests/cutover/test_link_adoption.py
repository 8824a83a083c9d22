"""V1 push links adopted only where provable, at ``cutover certify`` (issue 21 item 5).

Seed 002 "Migration Contract For #1783": a V1 record's remote-id mirror and provenance marker become a V2
RemoteLink only when they prove one link key and one remote id; every ambiguous case fails closed with a
reason code, no link, and no create once V2 serves. Real MariaDB, the billing sandbox as the provider: the
adopted record's marker is written by a real V1 push; the ambiguous ones are shaped as the legacy data
would be. Provider calls are counted per remote customer (each customer's own request counters) and by
the sandbox's customer list, never by a time window.
"""
from __future__ import annotations

import json

import httpx
import pytest
from django.db import transaction

from connectors.models import RemoteEffect, RemoteLink
from connectors.v1.provenance import provenance_marker
from connectors.v1.push import v1_push_record
from cutover.activate import cutover_activate
from cutover.certify import cutover_certify
from cutover.drain import cutover_drain
from cutover.halt import cutover_halt_v1
from cutover.models import CutoverEvidence, V1ShutdownCertificate
from cutover.restore_point import restore_point_capture, restore_point_record
from cutover.stop import cutover_stop
from cutover.validate import cutover_validate
from nexusflow.kernel.scope import OrgScope
from nexusflow.records.models import Record
from nexusflow.records.services import record_lock, record_write_mirror
from tests.conftest import BILLING_KEY, ORG, drain, hubspot_event, run_manage, subprocess_env
from tests.connectors.v1.support import post_v1
from tests.cutover.test_v1_shutdown import ATTEMPT, _run_v1_worker
from tests.kits.outbound import author

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

CONTRACT = "billing.customer"
#: case name -> the reason code its record is refused with (``None``: adopted).
CASES = {
    "adopted": None,
    "multiple_candidates": "v1_link_multiple_candidates",
    "provenance_without_remote_id": "v1_link_provenance_without_remote_id",
    "outside_field_pair": "v1_link_remote_id_outside_field_pair",
    "provenance_missing": "v1_link_provenance_missing",
    "action_slot_unmapped": "v1_link_action_slot_unmapped",
    "destination_drift": "v1_link_destination_drift",
}


def _customer(billing_sandbox, email: str) -> str:
    return httpx.post(billing_sandbox.base_url + "/v1/customers", data={"email": email},
                      headers={"Authorization": f"Bearer {BILLING_KEY}"}).json()["id"]


def _mirror(record_key: str, **values: str) -> None:
    with transaction.atomic():
        locked = record_lock(org=OrgScope(ORG), object_name="Contact", record_key=record_key)
        for field, value in values.items():
            record_write_mirror(org=OrgScope(ORG), record=locked, field=field, value=value)


def _marker(billing_sandbox, remote_id: str, **contract_changes: str) -> str:
    from connectors.models import PackGeneration

    pack = PackGeneration.objects.get(pack_key="billing")
    contract = {**next(c for c in pack.document["push_contracts"] if c["contract_key"] == CONTRACT)}
    base_url = contract_changes.pop("base_url", billing_sandbox.base_url)
    contract.update(contract_changes)
    return provenance_marker(owner_key=pack.owner_key, contract=contract, base_url=base_url, remote_id=remote_id)


@pytest.fixture
def legacy(certified, client, billing_sandbox):
    """V1 Contacts, one per case, with the remote-id mirrors and markers the legacy data would hold; then the
    whole shutdown: halt, drain, stop, certify. Returns ``{case: (record key, remote id or None)}``."""
    events = []
    for i, case in enumerate(CASES):
        events += [hubspot_event(300 + 2 * i, 700 + i, 5000 + 2 * i),
                   hubspot_event(301 + 2 * i, 700 + i, 5001 + 2 * i, "email", f"{case}@example.test")]
    assert post_v1(client, events).status_code == 202
    _run_v1_worker()  # a real V1 generation applies them (and leaves no live lease)
    keys = {r.fields["email"].split("@")[0]: r.record_key
            for r in Record.objects.filter(org_id=ORG, object_name="Contact") if r.fields.get("email")}
    out = {}
    for case in CASES:
        key = keys[case]
        remote = None if case == "provenance_without_remote_id" else _customer(billing_sandbox, f"{case}@old.test")
        out[case] = (key, remote)
        if case == "adopted":
            _mirror(key, billing_id=remote)
            assert v1_push_record(org=OrgScope(ORG), contract_key=CONTRACT, record_key=key).state == "confirmed"
        elif case == "multiple_candidates":
            _mirror(key, billing_id=remote, billing_legacy_id=_customer(billing_sandbox, "second@old.test"),
                    billing_provenance=_marker(billing_sandbox, remote))
        elif case == "provenance_without_remote_id":
            _mirror(key, billing_provenance=_marker(billing_sandbox, "cus_gone"))
        elif case == "outside_field_pair":
            _mirror(key, billing_legacy_id=remote)
        elif case == "provenance_missing":
            _mirror(key, billing_id=remote)
        elif case == "action_slot_unmapped":
            _mirror(key, billing_id=remote,
                    billing_provenance=_marker(billing_sandbox, remote, action_slot_id="slot.push.retired"))
        elif case == "destination_drift":
            _mirror(key, billing_id=remote,
                    billing_provenance=_marker(billing_sandbox, remote, base_url="http://127.0.0.1:9/old-billing"))
    cutover_halt_v1(org=certified, attempt_key=ATTEMPT)
    cutover_drain(org=certified, attempt_key=ATTEMPT)
    cutover_stop(org=certified, attempt_key=ATTEMPT, wait_seconds=0)
    return out


def _activate(tmp_path) -> None:
    """The rest of the cutover: certify (the adoption), restore point, validate, activate."""
    org = OrgScope(ORG)
    cutover_certify(org=org, attempt_key=ATTEMPT)
    capture = restore_point_capture(org=org, attempt_key=ATTEMPT, backup_dir=tmp_path)
    restore_point_record(org=org, capture=capture, rehearsal={"proven_by": "tests/cutover/test_restore_point.py"})
    cutover_validate(org=org, attempt_key=ATTEMPT)
    cutover_activate(org=org, attempt_key=ATTEMPT)


def test_certify_adopts_only_the_provable_v1_link_and_lists_every_refusal_with_its_reason(legacy):
    report = cutover_certify(org=OrgScope(ORG), attempt_key=ATTEMPT)
    [link] = RemoteLink.objects.filter(org_id=ORG, action_type="PushToConnector")
    key, remote = legacy["adopted"]
    assert (link.source_record_key, link.remote_id, link.state) == (key, remote, "active")
    document = json.loads(bytes(V1ShutdownCertificate.objects.get(pk=report.certificate_id).document))
    adoption = document["link_adoption"]
    assert [row[:3] for row in adoption["adopted"]] == [[CONTRACT, key, link.link_key]]
    assert remote not in json.dumps(adoption)  # remote ids only as digests
    refused = {row[1]: row[2] for row in adoption["refused"]}
    assert refused == {legacy[case][0]: code for case, code in CASES.items() if code}
    evidence = {row.account_key: row.payload["reason_code"] for row in CutoverEvidence.objects.filter(
        org_id=ORG, kind="link_adoption_refused")}
    assert evidence == refused
    listed = run_manage(["reason_codes", "v1_link_destination_drift", "--org", ORG], subprocess_env())
    assert listed.returncode == 0 and legacy["destination_drift"][0] in listed.stdout


def test_after_activation_the_adopted_link_patches_and_no_ambiguous_record_is_created(legacy, tmp_path,
                                                                                       billing_sandbox):
    """The evidence of item 5: each ambiguous record gets no link and no create; the adopted one PATCHes."""
    _activate(tmp_path)
    before = {c["id"]: c for c in billing_sandbox.state()["customers"]}
    for case, (key, _remote) in legacy.items():
        author(key, f"push-{case}", lastname="After")
    drain()
    after = {c["id"]: c for c in billing_sandbox.state()["customers"]}
    assert set(after) == set(before)  # no customer was created for any record
    _adopted_key, adopted_remote = legacy["adopted"]
    assert after[adopted_remote]["update_requests"] == before[adopted_remote]["update_requests"] + 1
    assert after[adopted_remote]["create_requests"] == before[adopted_remote]["create_requests"]
    for case, code in CASES.items():
        if code is None:
            continue
        key, remote = legacy[case]
        assert not RemoteLink.objects.filter(org_id=ORG, source_record_key=key,
                                             action_type="PushToConnector").exists(), case
        effect = RemoteEffect.objects.get(org_id=ORG, command__source_record_key=key)
        assert (effect.state, effect.reason_code) == ("quarantined", "legacy_remote_id_unlinked"), case
        assert not effect.attempts.exists(), case  # refused before any I/O
        if remote is not None:
            assert after[remote] == before[remote], case


def test_an_operator_adopts_a_refused_record_and_its_next_save_patches_the_proven_remote(legacy, tmp_path,
                                                                                        billing_sandbox):
    _activate(tmp_path)
    key, remote = legacy["provenance_missing"]
    bad = run_manage(["push_links", "adopt", "--org", ORG, "--contract", CONTRACT, "--record", key,
                      "--remote-id", remote, "--actor", "ops", "--reason", ""], subprocess_env())
    assert bad.returncode == 1 and "link_evidence_missing" in bad.stderr
    done = run_manage(["push_links", "adopt", "--org", ORG, "--contract", CONTRACT, "--record", key,
                       "--remote-id", remote, "--actor", "ops", "--reason", "billing confirms the customer"],
                      subprocess_env())
    assert done.returncode == 0, done.stderr
    again = run_manage(["push_links", "adopt", "--org", ORG, "--contract", CONTRACT, "--record", key,
                        "--remote-id", remote, "--actor", "ops", "--reason", "twice"], subprocess_env())
    assert again.returncode == 1 and "adopt_target_linked" in again.stderr
    before = billing_sandbox.state()["customers"]
    author(key, "push-after-adopt", lastname="Adopted")
    drain()
    after = {c["id"]: c for c in billing_sandbox.state()["customers"]}
    assert len(after) == len(before) and after[remote]["update_requests"] == 1
