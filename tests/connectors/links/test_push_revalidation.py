"""Finalized-link mapping revalidation (seed 002 "2026-07-22 Finalized Mapping Revalidation CARVE_DOWN").

Links are finalized by real pushes to the billing sandbox; the mapping change is a
modified copy of the billing pack published as a new generation (served through a
successor epoch where the PATCH path must see it). Table contents are compared
before and after every entry point that must not write. The race runs two real
transactions: one held open at ``revalidation.apply_before_commit`` while the
other is seen queued behind its link lock.
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from connectors.links import mapping_revalidation as revalidation
from connectors.links.mapping_revalidation import (
    AlreadyApplied,
    Applied,
    ManifestInvalid,
    Projected,
    RevalidationRefused,
    manifest_seal,
    revalidation_apply,
    revalidation_draft,
    revalidation_validate,
)
from connectors.links.push_rules import body_fingerprint, link_row_digest, mapping_fingerprint
from connectors.models import PackGeneration, PushLinkRevalidationReceipt, RemoteEffect, RemoteLink, ServingEpoch
from connectors.outbound import egress
from connectors.reasons import LINK_DRIFT, MAPPING_DRIFT
from connectors.serving.gates import epoch_prepare, epoch_verify, service_configuration_apply
from connectors.serving.generations import pack_publish
from connectors.serving.handoff import halt_begin, halt_try_complete, handoff_stage, successor_activate
from connectors.store import RemoteLinkStore
from nexusflow.kernel import canonical_json
from nexusflow.kernel.digests import digest_v2
from nexusflow.kernel.scope import OrgScope
from runtime_outbox.models import OutboundCommand
from runtime_outbox.services import outbox_try_deliver_one
from tests.concurrency import race_behind_hold
from tests.conftest import ORG, ROOT, drain, make_serving_org, run_manage, service_document, subprocess_env
from tests.kits.outbound import author
from tests.kits.records import customer_contact

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

CONTRACT = "billing.customer"
#: Every table a revalidation entry point could write, or must leave alone (effects, records, intents).
TABLES = ("connectors_remotelink", "connectors_pushlinkrevalidationreceipt", "connectors_remotelinkevidence",
          "connectors_remoteeffect", "connectors_remoteeffectattempt", "connectors_remoteeffectevidence",
          "connectors_dispatchpermit", "records_record", "runtime_outbox_outboundcommand",
          "runtime_outbox_intentresultreceipt")


@pytest.fixture
def org(billing_sandbox) -> OrgScope:
    return make_serving_org(billing_sandbox.base_url, deploy_flow=False)




# --- helpers ------------------------------------------------------------------------------------------
def _save(record_key: str, **changes) -> OutboundCommand:
    """A record save that pushes: change the record, author its intent, deliver it (effect ``prepared``)."""
    command = author(record_key, contract=CONTRACT, **changes)
    assert outbox_try_deliver_one()
    return command


def _finalized_link(email: str, first: str = "Ann") -> RemoteLink:
    record = customer_contact(email, firstname=first, lastname="Lee")
    command = _save(record.record_key)
    drain()
    assert RemoteEffect.objects.get(command=command).state == "finalized"
    return RemoteLink.objects.get(org_id=ORG, source_record_key=record.record_key)


def _pack_document(suffix: str, join: str) -> dict:
    """The billing pack with its ``name`` mapping reordered (last name first) under a new version."""
    document = json.loads((ROOT / "packs" / "billing" / "pack.json").read_text(encoding="utf-8"))
    document["version"] = f"{document['version']}-{suffix}"
    contract = document["push_contracts"][0]
    contract["mapping"] = [entry if entry["target"] != "name" else
                           {"target": "name", "source": ["lastname", "firstname"], "join": join}
                           for entry in contract["mapping"]]
    return document


def _publish(suffix: str = "mapping-2", join: str = ", ", serve: bool = True) -> PackGeneration:
    """Publish the changed billing pack; ``serve``: also switch the org to it (a revalidation applies only
    the fingerprints the org serves)."""
    pack = pack_publish(document=_pack_document(suffix, join))[0]
    if serve and not RemoteEffect.objects.filter(org_id=ORG, state__in=("prepared", "uncertain")).exists():
        epoch = ServingEpoch.objects.get(org_id=ORG, state="active")
        billing = next(a for a in epoch.document["accounts"] if a["account_key"] == "billing-main")
        _serve_newest_pack(OrgScope(ORG), billing["base_url"])
    return pack


def _contract(pack: PackGeneration) -> dict:
    return next(c for c in pack.document["push_contracts"] if c["contract_key"] == CONTRACT)


def _serve_newest_pack(org: OrgScope, billing_url: str) -> None:
    """Switch the org to a successor epoch built on the newest pack generations (operator path)."""
    service_configuration_apply(org=org, document=service_document(billing_url))
    successor = epoch_verify(org=org, epoch_id=epoch_prepare(org=org).pk)
    halt_begin(org=org)
    assert halt_try_complete(org=org).all_halted
    handoff_stage(org=org, successor_id=successor.pk)
    successor_activate(org=org, successor_id=successor.pk)


def _draft(org: OrgScope, pack: PackGeneration | None = None, operation_id: str = "op-1", **kwargs) -> dict:
    return revalidation_draft(org=org, contract_key=CONTRACT, approved_by="mapping-owner",
                              reason="name is sent last name first", approval_ref="CHG-1",
                              pack_generation_id=pack.pk if pack is not None else None, operation_id=operation_id,
                              **kwargs)


def _tables() -> dict[str, list[tuple]]:
    with connection.cursor() as cursor:
        rows = {}
        for table in TABLES:
            cursor.execute(f"SELECT * FROM `{table}` ORDER BY id")
            rows[table] = cursor.fetchall()
    return rows


def _without_id(receipts) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "receipt_id"} for r in receipts]


def _sandbox_counts(sandbox) -> list[tuple[str, int, int]]:
    return [(c["name"], c["create_requests"], c["update_requests"]) for c in sandbox.state()["customers"]]


# --- the whole path: refused PATCH, draft, zero-write validate, apply, the next save PATCHes -------------------
def test_a_mapping_change_refuses_the_patch_until_an_approved_revalidation_then_the_next_save_patches(
        org, billing_sandbox):
    link = _finalized_link("ann@x.io")
    created = (link.mapping_fingerprint, link.body_fingerprint, link.created_install_id)
    assert _sandbox_counts(billing_sandbox) == [("Ann Lee", 1, 0)]
    v2 = _publish()

    # Before revalidation the PATCH fails closed on the link's own fingerprints; the link stays active.
    refused = _save(link.source_record_key, lastname="Lee-Park")
    drain()
    effect = RemoteEffect.objects.get(command=refused)
    assert (effect.state, effect.reason_code) == ("quarantined", MAPPING_DRIFT)
    assert not effect.attempts.exists()
    assert _sandbox_counts(billing_sandbox) == [("Ann Lee", 1, 0)]
    link = RemoteLink.objects.get(pk=link.pk)
    assert (link.state, link.mapping_fingerprint, link.body_fingerprint) == ("active", created[0], created[1])

    # The draft names exactly the drifted link, bound to its full row and the serving contract's fingerprints.
    manifest = _draft(org)
    assert [m["link_id"] for m in manifest["members"]] == [int(link.pk)]
    member = manifest["members"][0]
    assert member["row_digest"] == link_row_digest(link) and member["previous_receipt_id"] is None
    assert member["old"] == {"mapping_fingerprint": created[0], "body_fingerprint": created[1],
                             "install_id": link.last_validated_install_id}
    assert member["new"] == {"mapping_fingerprint": mapping_fingerprint(_contract(v2)),
                             "body_fingerprint": body_fingerprint(_contract(v2)), "install_id": v2.installation_id}

    before = _tables()
    projected = revalidation_validate(org=org, manifest=manifest)
    assert isinstance(projected, Projected) and _tables() == before
    assert [r["receipt_id"] for r in projected.receipts] == [None]

    applied = revalidation_apply(org=org, manifest=manifest)
    assert isinstance(applied, Applied)
    assert _without_id(applied.receipts) == _without_id(projected.receipts)
    receipt = PushLinkRevalidationReceipt.objects.get(org_id=ORG)
    assert applied.receipts[0]["receipt_id"] == receipt.pk
    moved = RemoteLink.objects.get(pk=link.pk)
    assert (moved.mapping_fingerprint, moved.body_fingerprint) == (member["new"]["mapping_fingerprint"],
                                                                   member["new"]["body_fingerprint"])
    assert moved.last_validated_install_id == v2.installation_id
    assert moved.created_install_id == created[2]
    assert moved.last_mapping_revalidation_id == receipt.pk
    assert (moved.state, moved.snapshot, moved.remote_id, moved.version) == (link.state, link.snapshot,
                                                                               link.remote_id, link.version + 1)
    assert (receipt.operation_id, receipt.link_id, receipt.link_key) == ("op-1", link.pk, link.link_key)
    assert (receipt.old_mapping_fingerprint, receipt.old_body_fingerprint, receipt.old_install_id) == \
        tuple(member["old"].values())
    assert (receipt.new_mapping_fingerprint, receipt.new_body_fingerprint, receipt.new_install_id) == \
        tuple(member["new"].values())
    assert receipt.before_row_digest == member["row_digest"]
    assert receipt.after_row_digest == link_row_digest(moved) != receipt.before_row_digest
    assert receipt.manifest_digest == manifest["manifest_digest"] and receipt.previous_receipt_id is None
    assert (receipt.approved_by, receipt.reason, receipt.fingerprint_algorithm) == (
        "mapping-owner", "name is sent last name first", "push-fingerprint.v1")
    # Nothing else moved: the refused PATCH stays refused, no effect was created or released.
    assert RemoteEffect.objects.get(command=refused).state == "quarantined"
    assert RemoteEffect.objects.filter(org_id=ORG).count() == 2
    assert _sandbox_counts(billing_sandbox) == [("Ann Lee", 1, 0)]

    # The next save PATCHes through the unchanged finalized-link path, which never reads the receipt table.
    patched = _save(link.source_record_key, firstname="Anna")
    with CaptureQueriesContext(connection) as queries:
        drain()
    assert not [q for q in queries.captured_queries if "pushlinkrevalidationreceipt" in q["sql"]]
    assert RemoteEffect.objects.get(command=patched).state == "finalized"
    assert [a.operation for a in RemoteEffect.objects.get(command=patched).attempts.all()] == ["update"]
    assert _sandbox_counts(billing_sandbox) == [("Lee-Park, Anna", 1, 1)]

    # The next mapping transition binds the then-current row (the PATCH re-validated its snapshot) and
    # proves lineage through the receipt pointer.
    v3 = _publish("mapping-3", join=" / ", serve=False)
    current = RemoteLink.objects.get(pk=link.pk)
    assert link_row_digest(current) != receipt.after_row_digest
    second = _draft(org, v3, operation_id="op-2")
    assert second["members"][0]["previous_receipt_id"] == receipt.pk
    assert second["members"][0]["row_digest"] == link_row_digest(current)
    # Drafted ahead of the switch, it applies only once v3 serves (else every PATCH would refuse).
    with pytest.raises(RevalidationRefused) as early:
        revalidation_apply(org=org, manifest=second)
    assert early.value.code == "revalidation_not_serving"
    assert RemoteLink.objects.get(pk=link.pk).last_mapping_revalidation_id == receipt.pk
    _serve_newest_pack(org, billing_sandbox.base_url)
    assert isinstance(revalidation_apply(org=org, manifest=second), Applied)
    chained = PushLinkRevalidationReceipt.objects.get(org_id=ORG, operation_id="op-2")
    assert chained.previous_receipt_id == receipt.pk
    assert RemoteLink.objects.get(pk=link.pk).last_mapping_revalidation_id == chained.pk
    assert (chained.old_mapping_fingerprint, chained.new_mapping_fingerprint) == (
        receipt.new_mapping_fingerprint, mapping_fingerprint(_contract(v3)))


def test_a_draft_names_only_drifted_active_links_and_never_writes(org, billing_sandbox):
    ann, bob = _finalized_link("ann@x.io"), _finalized_link("bob@x.io", "Bob")
    before = _tables()
    with pytest.raises(ManifestInvalid) as refused:
        _draft(org)  # the serving contract is the one the links were created under
    assert refused.value.code == "draft_no_drift"
    with pytest.raises(ManifestInvalid) as refused:
        _draft(org, link_keys=["f" * 64])
    assert refused.value.code == "draft_link_unknown"
    pack = _publish()
    only_bob = _draft(org, pack, link_keys=[bob.link_key])
    assert [m["link_id"] for m in only_bob["members"]] == [bob.pk]
    by_links = revalidation_draft(org=org, link_keys=[ann.link_key], pack_generation_id=pack.pk,
                                  approved_by="mapping-owner", reason="reorder")
    assert [m["link_id"] for m in by_links["members"]] == [ann.pk]
    assert by_links["approval"] == {"approved_by": "mapping-owner", "reason": "reorder", "approval_ref": ""}
    assert _tables() == before


# --- atomicity ------------------------------------------------------------------------------------------
def test_one_conflicting_member_rolls_back_the_whole_manifest(org, billing_sandbox):
    first, second = sorted([_finalized_link("ann@x.io"), _finalized_link("bob@x.io", "Bob")],
                           key=lambda link: link.link_key)
    manifest = _draft(org, _publish())
    assert [m["link_key"] for m in manifest["members"]] == [first.link_key, second.link_key]
    before = _tables()

    # A member whose bound row digest is not the link's current row.
    tampered = json.loads(json.dumps(manifest))
    tampered["members"][1]["row_digest"] = "0" * 64
    with pytest.raises(RevalidationRefused) as refused:
        revalidation_apply(org=org, manifest=manifest_seal(tampered))
    assert refused.value.code == "revalidation_member_conflict"
    assert refused.value.detail["link_id"] == second.pk
    assert _tables() == before

    # The second link leaves service after the draft: the first member is not applied alone.
    RemoteLinkStore.transition(org_id=ORG, pk=second.pk, src="active", dst="suspended_drift", version=second.version,
                               set_fields={"reason_code": LINK_DRIFT})
    before = _tables()
    for entry in (revalidation_validate, revalidation_apply):
        with pytest.raises(RevalidationRefused) as refused:
            entry(org=org, manifest=manifest)
        assert refused.value.code == "revalidation_member_conflict"
        assert _tables() == before
    assert not PushLinkRevalidationReceipt.objects.exists()


def test_a_zero_row_cas_on_a_later_member_rolls_back_the_earlier_members(org, billing_sandbox, monkeypatch):
    first, second = sorted([_finalized_link("ann@x.io"), _finalized_link("bob@x.io", "Bob")],
                           key=lambda link: link.link_key)
    manifest = _draft(org, _publish())
    before = _tables()
    real_insert = revalidation.insert

    def insert_then_move_the_link(model, **values):
        row = real_insert(model, **values)
        if values["link"].pk == second.pk:
            # Another writer's version bump inside the same transaction: the link CAS then matches no row.
            with connection.cursor() as cursor:
                cursor.execute("UPDATE connectors_remotelink SET version = version + 1 WHERE id = %s",
                               [int(second.pk)])
        return row

    monkeypatch.setattr(revalidation, "insert", insert_then_move_the_link)
    with pytest.raises(RevalidationRefused) as refused:
        revalidation_apply(org=org, manifest=manifest)
    assert refused.value.code == "revalidation_stale"
    assert _tables() == before  # the first member's receipt and fingerprint move rolled back too


# --- retries: readback only; mixed and divergent states fail closed ---------------------------------------------
def test_an_exact_retry_reads_back_already_applied_and_writes_nothing(org, billing_sandbox):
    links = [_finalized_link("ann@x.io"), _finalized_link("bob@x.io", "Bob")]
    manifest = _draft(org, _publish())
    applied = revalidation_apply(org=org, manifest=manifest)
    assert isinstance(applied, Applied) and len(applied.receipts) == 2

    before = _tables()
    for entry in (revalidation_apply, revalidation_validate):
        again = entry(org=org, manifest=manifest)
        assert isinstance(again, AlreadyApplied)
        assert again.receipts == applied.receipts
        assert _tables() == before
    assert PushLinkRevalidationReceipt.objects.filter(org_id=ORG).count() == 2

    # Once a member's link no longer holds the after-state exactly, the retry is divergent: it fails closed.
    link = RemoteLink.objects.get(pk=links[0].pk)
    RemoteLinkStore.transition(org_id=ORG, pk=link.pk, src="active", dst="suspended_drift", version=link.version,
                               set_fields={"reason_code": LINK_DRIFT})
    before = _tables()
    with pytest.raises(RevalidationRefused) as refused:
        revalidation_apply(org=org, manifest=manifest)
    assert refused.value.code == "revalidation_divergent" and refused.value.detail["link_id"] == link.pk
    assert _tables() == before


def test_an_operation_applied_to_some_members_only_fails_closed(org, billing_sandbox):
    first, second = sorted([_finalized_link("ann@x.io"), _finalized_link("bob@x.io", "Bob")],
                           key=lambda link: link.link_key)
    pack = _publish()
    full = _draft(org, pack, operation_id="op-mixed")
    partial = _draft(org, pack, operation_id="op-mixed", link_keys=[first.link_key])
    assert [m["link_id"] for m in full["members"]] == [first.pk, second.pk]
    assert partial["members"] == full["members"][:1]
    assert isinstance(revalidation_apply(org=org, manifest=partial), Applied)

    before = _tables()
    for entry in (revalidation_validate, revalidation_apply):
        with pytest.raises(RevalidationRefused) as refused:
            entry(org=org, manifest=full)
        assert refused.value.code == "revalidation_mixed_state"
        assert refused.value.detail["missing"] == [second.pk]
        assert _tables() == before


# --- occupancy: any attempt on any member's link key blocks the whole manifest --------------------------------
@pytest.mark.parametrize("occupancy", ["prepared", "uncertain"])
def test_an_occupied_member_blocks_the_whole_manifest_and_its_effect_is_untouched(org, billing_sandbox, occupancy):
    free, busy = _finalized_link("ann@x.io"), _finalized_link("bob@x.io", "Bob")
    command = _save(busy.source_record_key, lastname="Brown")
    if occupancy == "uncertain":
        billing_sandbox.set_faults(drop_response_after_commit=1)
        assert egress.effect_try_dispatch_one(worker_id="w1")
    effect = RemoteEffect.objects.get(command=command)
    assert effect.state == occupancy
    manifest = _draft(org, _publish())
    assert {m["link_id"] for m in manifest["members"]} == {free.pk, busy.pk}

    before = _tables()
    for entry in (revalidation_validate, revalidation_apply):
        with pytest.raises(RevalidationRefused) as refused:
            entry(org=org, manifest=manifest)
        assert refused.value.code == "revalidation_occupied"
        assert refused.value.detail["effects"] == [[int(effect.pk), occupancy]]
        assert _tables() == before  # neither link moved, and the effect kept its state and version

    if occupancy == "prepared":
        # Once the attempt finishes, the same manifest applies: the block never rebuilt or released anything.
        drain()
        assert RemoteEffect.objects.get(pk=effect.pk).state == "finalized"
        _serve_newest_pack(org, billing_sandbox.base_url)  # the drafted generation serves now
        assert isinstance(revalidation_apply(org=org, manifest=manifest), Applied)
        assert PushLinkRevalidationReceipt.objects.filter(org_id=ORG).count() == 2


# --- concurrency: two applies of one manifest write one set of receipts ----------------------------------------
def test_two_concurrent_applies_of_one_manifest_write_exactly_one_set_of_receipts(org, billing_sandbox, holds):
    _finalized_link("ann@x.io")
    _finalized_link("bob@x.io", "Bob")
    manifest = _draft(org, _publish())

    first, second = race_behind_hold(
        holds, "revalidation.apply_before_commit",
        lambda: revalidation_apply(org=org, manifest=manifest),
        lambda: revalidation_apply(org=org, manifest=manifest),
        "connectors_remotelink", names=("apply-1", "apply-2"))

    assert first.error is None and second.error is None
    assert isinstance(first.result, Applied) and isinstance(second.result, AlreadyApplied)
    assert second.result.receipts == first.result.receipts
    assert PushLinkRevalidationReceipt.objects.filter(org_id=ORG).count() == 2


# --- invariant 1: a bad manifest fails before any transaction ---------------------------------------------------
def _synthetic(members: int = 1) -> dict:
    return manifest_seal({
        "operation_id": "op-x", "org_id": ORG, "fingerprint_algorithm": "push-fingerprint.v1",
        "approval": {"approved_by": "mapping-owner", "reason": "reorder", "approval_ref": ""},
        "members": [{"link_id": n + 1, "link_key": f"{n + 1:064x}", "row_digest": "a" * 64,
                     "old": {"mapping_fingerprint": "b" * 64, "body_fingerprint": "c" * 64, "install_id": "p@1"},
                     "new": {"mapping_fingerprint": "d" * 64, "body_fingerprint": "c" * 64, "install_id": "p@2"},
                     "previous_receipt_id": None} for n in range(members)]})


def _resealed_unsorted(doc: dict) -> dict:
    doc["members"].reverse()
    body = {k: v for k, v in doc.items() if k != "manifest_digest"}
    doc["manifest_digest"] = digest_v2("connectors.push-link-revalidation.manifest",
                                       [("document", canonical_json.dumps(body))]).hexdigest
    return doc


def _set(path: str, value):
    def mutate(doc: dict) -> dict:
        *parents, leaf = path.split(".")
        target = doc
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        target[leaf] = value
        return manifest_seal(doc)
    return mutate


BAD_MANIFESTS = {
    "duplicate link": (lambda d: manifest_seal({**d, "members": d["members"] + d["members"]}),
                       "manifest_duplicate_link"),
    "approver with surrounding space": (_set("approval.approved_by", " mapping-owner"), "manifest_not_canonical"),
    "operation id with NUL": (_set("operation_id", "op\x00x"), "manifest_not_canonical"),
    "upper-case link key": (_set("members.0.link_key", "A" * 64), "manifest_not_canonical"),
    "install id not NFC": (_set("members.0.new.install_id", "pe\u0301@2"), "manifest_not_canonical"),
    "digest mismatch": (lambda d: {**d, "approval": {**d["approval"], "reason": "other"}}, "manifest_digest_mismatch"),
    "unsorted members": (lambda d: _resealed_unsorted(_synthetic(2)), "manifest_unsorted"),
    "empty reason": (_set("approval.reason", ""), "manifest_approval_missing"),
    "blank reason": (_set("approval.reason", "   "), "manifest_approval_missing"),
    "empty approver": (_set("approval.approved_by", ""), "manifest_approval_missing"),
    "no approval": (lambda d: manifest_seal({k: v for k, v in d.items() if k != "approval"}), "manifest_malformed"),
    "unknown field": (_set("members.0.effective_mapping", "x"), "manifest_malformed"),
    "boolean link id": (_set("members.0.link_id", True), "manifest_malformed"),
    "other algorithm": (_set("fingerprint_algorithm", "push-fingerprint.v0"), "manifest_algorithm_unknown"),
    "no members": (lambda d: manifest_seal({**d, "members": []}), "manifest_empty"),
    "unchanged member": (_set("members.0.new.mapping_fingerprint", "b" * 64), "manifest_member_unchanged"),
    "another org": (_set("org_id", "other-org"), "manifest_org_mismatch"),
}


@pytest.mark.parametrize("case", sorted(BAD_MANIFESTS))
def test_a_bad_manifest_fails_with_a_stable_code_before_any_transaction(case):
    mutate, code = BAD_MANIFESTS[case]
    document = mutate(_synthetic())
    for entry in (revalidation_validate, revalidation_apply):
        with CaptureQueriesContext(connection) as queries, pytest.raises(ManifestInvalid) as refused:
            entry(org=OrgScope(ORG), manifest=document)
        assert refused.value.code == code
        assert queries.captured_queries == []


# --- the operator command ------------------------------------------------------------------------------------
def test_the_command_drafts_validates_refuses_applies_and_reads_back_with_exit_codes(org, billing_sandbox, tmp_path):
    ann, bob = _finalized_link("ann@x.io"), _finalized_link("bob@x.io", "Bob")
    pack = _publish()
    env = subprocess_env()
    org_args = ["--org", ORG]

    drafted = run_manage(["push_link_revalidation", "draft", *org_args, "--contract", CONTRACT,
                          "--pack-generation", str(pack.pk), "--approved-by", "mapping-owner",
                          "--reason", "name is sent last name first", "--operation-id", "op-cli"], env)
    assert drafted.returncode == 0, drafted.stderr
    manifest = json.loads(drafted.stdout)
    assert {m["link_id"] for m in manifest["members"]} == {ann.pk, bob.pk}
    path = tmp_path / "manifest.json"
    path.write_text(drafted.stdout, encoding="utf-8")

    validated = run_manage(["push_link_revalidation", "validate", *org_args, "--manifest", str(path), "--json"], env)
    assert validated.returncode == 0, validated.stderr
    assert json.loads(validated.stdout)["status"] == "validated"
    assert not PushLinkRevalidationReceipt.objects.exists()

    busy = _save(bob.source_record_key, lastname="Brown")  # an attempt occupies one member
    refused = run_manage(["push_link_revalidation", "apply", *org_args, "--manifest", str(path)], env)
    assert refused.returncode == 3
    assert "revalidation_occupied" in refused.stderr and "nothing was written" in refused.stderr
    assert not PushLinkRevalidationReceipt.objects.exists()
    drain()
    # Under the new pack the occupying PATCH is refused before any call; it no longer occupies the member.
    assert (RemoteEffect.objects.get(command=busy).state, RemoteEffect.objects.get(command=busy).reason_code) == (
        "quarantined", MAPPING_DRIFT)

    applied = run_manage(["push_link_revalidation", "apply", *org_args, "--manifest", str(path)], env)
    assert applied.returncode == 0, applied.stderr
    assert applied.stdout.startswith("applied: operation op-cli") and "2 receipt(s) written" in applied.stdout
    assert PushLinkRevalidationReceipt.objects.filter(org_id=ORG, operation_id="op-cli").count() == 2

    again = run_manage(["push_link_revalidation", "apply", *org_args, "--manifest", str(path)], env)
    assert again.returncode == 0 and again.stdout.startswith("already applied: operation op-cli")
    assert PushLinkRevalidationReceipt.objects.filter(org_id=ORG).count() == 2

    manifest["approval"]["reason"] = "edited after approval"
    path.write_text(json.dumps(manifest), encoding="utf-8")
    tampered = run_manage(["push_link_revalidation", "apply", *org_args, "--manifest", str(path)], env)
    assert tampered.returncode == 1 and "manifest_digest_mismatch" in tampered.stderr


def test_the_revalidation_path_reaches_no_provider_client_and_no_record_service():
    """Zero remote writes, zero record writes: neither module imports egress, HTTP or record services."""
    egress = [f"connectors.outbound.{step}" for step in (
        "egress", "egress_common", "permit_grant", "permit_send", "permit_settle", "effect_finalize", "recovery")]
    forbidden = {*egress, "connectors.outbound.intents", "httpx", "nexusflow.records.services",
                 "runtime_outbox.services"}
    for path in (ROOT / "connectors" / "links" / "mapping_revalidation.py",
                 ROOT / "connectors" / "management" / "commands" / "push_link_revalidation.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = {("connectors." if node.level else "") + (node.module or "")
                    for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        assert not imported & forbidden, (path, imported & forbidden)
    # The transitive closure, in a fresh interpreter: no egress adapter or HTTP client gets loaded.
    probe = ("import sys, django; django.setup(); import connectors.links.mapping_revalidation; "
             "from django.core.management import load_command_class; "
             "load_command_class('connectors', 'push_link_revalidation'); "
             f"print(sorted(m for m in {[*egress, 'connectors.outbound.intents', 'httpx']!r} if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=subprocess_env(
        DJANGO_SETTINGS_MODULE="nexusflow.settings"), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_unreadable_manifests_and_a_malformed_org_exit_with_a_code_and_no_traceback(org, tmp_path):
    env = subprocess_env()
    binary, empty = tmp_path / "binary.json", tmp_path / "empty.json"
    binary.write_bytes(b'{"a": "\xff"}')
    empty.write_text("  \n", encoding="utf-8")
    for path in (binary, empty):
        result = run_manage(["push_link_revalidation", "validate", "--org", ORG, "--manifest", str(path)], env)
        assert result.returncode == 1 and "manifest_unreadable" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
    bad_org = run_manage(["push_link_revalidation", "validate", "--org", " bad-org", "--manifest", str(empty)], env)
    assert bad_org.returncode == 2 and "invalid_identity" in bad_org.stderr
    assert not PushLinkRevalidationReceipt.objects.exists()
