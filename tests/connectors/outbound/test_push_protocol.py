"""Seed 002 "Implementation Contract For #1784" tests, "Retry And Recovery Semantics" and two acceptance
scenarios (stable slot ids across a rename; key-changing drift), on the real MariaDB and the loopback
provider sandboxes.

The remaining contract items are proven row by row in ``test_push_drift_matrix.py``
(source deletion, remote 404, out-of-band conflict, stale locator, orphaned
attempt). Races use real concurrent transactions (one side held open at a
named failpoint while the other is seen queued behind its row lock); crash
tests kill a real worker process at a named failpoint.
"""
from __future__ import annotations

import io
import signal
import threading

import pytest
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction

from connectors import reasons
from connectors.contracts.pack_document import PackError
from connectors.models import DispatchPermit, RemoteEffect, RemoteLink, ServingEpoch
from connectors.outbound import egress, permit_grant
from connectors.outbound.effect_decisions import effect_reconcile
from connectors.serving.gates import NotServing
from connectors.serving.generations import pack_publish
from connectors.serving.handoff import (
    HaltRefused,
    HandoffRefused,
    halt_begin,
    halt_try_complete,
    handoff_stage,
    successor_activate,
)
from nexusflow.kernel.scope import OrgScope
from nexusflow.records.models import Record
from nexusflow.records.services import record_lock, record_write_mirror
from runtime_outbox.models import IntentResultReceipt, OutboundCommand
from runtime_outbox.services import outbound_command_author_successor
from tests.concurrency import Worker, race_behind_hold
from tests.conftest import HUBSPOT_ACCOUNT, ORG, drain, run_manage, subprocess_env
from tests.connectors.push_helpers import (
    BILLING,
    ORIGIN,
    contact,
    contract_of,
    dispatch_one,
    effect_of,
    evidence,
    frozen_facts,
    parked_create,
    profile_of,
    push_env,
    push_link,
    reconfigure,
    save,
    serving_pack,
    zero_backoff,
)
from tests.kernel import rows

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

EFFECT_TABLE = "connectors_remoteeffect"


@pytest.fixture
def env(billing_sandbox, hubspot_crm_sandbox):
    return push_env(billing_sandbox, hubspot_crm_sandbox)




def _run(*args) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


# === Acceptance scenario (a): rename everything but the stable slot ids ===============================
def test_scenario_a_renamed_flow_action_profile_target_and_namespace_patch_the_same_link(env):
    """Seed 002 "Stable Slot Keys": renames are benign when the stable slot ids prove the same slot."""
    record = contact("ada@x.io", lastname="Lovelace")
    first = save(record)
    drain()
    [remote] = env.hubspot.state()["contacts"]
    link = push_link(record)
    assert (link.remote_id, link.state, env.posts()) == (remote["id"], "active", 1)
    assert link.snapshot["flow"] == ORIGIN and link.snapshot["connector_namespace"] == "hubspot"

    def rename(doc):
        doc["pack_key"] = "crm-objects"  # connector namespace; owner_key unchanged
        profile_of(doc)["profile_key"] = "crm.objects.contacts"
        for other in doc["push_contracts"]:  # every contract that names the renamed profile
            other["callout_profile"] = "crm.objects.contacts"
        contract_of(doc)["target_object"] = "people"

    new = reconfigure(env, rename)
    assert (new.pack.owner_key, new.pack.pack_key) == ("pack.hubspot", "crm-objects")
    renamed_flow = {"flow_developer_name": "Contact_Sync_To_Crm", "flow_action_name": "Sync_Person",
                    "flow_version_id": "301000000000009"}
    command = save(record, origin=renamed_flow, lastname="King")
    drain()

    assert command.link_key == first.link_key
    routes = env.routes()
    assert routes.get("POST /crm/v3/objects/contacts") == 1  # zero new creates
    assert routes.get(f"PATCH /crm/v3/objects/contacts/{remote['id']}") == 1
    assert sum(routes.values()) == 2
    assert env.remote(remote["id"])["properties"]["lastname"] == "King"
    after = RemoteLink.objects.get(pk=link.pk)
    assert RemoteLink.objects.filter(source_record_key=record.record_key).count() == 1
    assert (after.state, after.link_key, after.remote_id) == ("active", link.link_key, remote["id"])
    assert (after.owner_key, after.action_slot_id, after.destination_slot_id) == (
        link.owner_key, link.action_slot_id, link.destination_slot_id)
    [(kind, src, dst, detail)] = evidence(after)
    assert (kind, src, dst) == ("drift_validated", "active", "active")
    assert set(detail["surfaces"]) == {"connector_namespace", "profile_name", "target_object", "flow", "install_id"}
    assert (after.snapshot["connector_namespace"], after.snapshot["profile_name"], after.snapshot["target_object"],
            after.snapshot["flow"]) == ("crm-objects", "crm.objects.contacts", "people", renamed_flow)
    assert after.last_validated_install_id == new.pack.installation_id != after.created_install_id
    assert effect_of(command).state == "finalized"


# === Acceptance scenario (b): recreated slot ids are key-changing drift =================================
def test_scenario_b_recreated_slot_ids_refuse_the_create_before_post_and_suspend_the_old_link(env):
    """Seed 002 "Retry And Recovery Semantics" 9: a new key never proves absence of the old ownership."""
    record = contact("bob@x.io")
    save(record)
    drain()
    link = push_link(record)

    def recreate(doc):  # every human-readable name stays the same; only the stable ids are new
        contract = contract_of(doc)
        contract["action_slot_id"] = "slot.push.contact.v2"
        contract["destination_slot_id"] = "dest.contact.v2"

    reconfigure(env, recreate)
    requests = env.hubspot.state()["requests"]
    command = save(record, lastname="Again")
    drain()

    assert env.hubspot.state()["requests"] == requests and env.posts() == 1  # no POST, no request at all
    effect = effect_of(command)
    assert effect.link_key != link.link_key
    assert (effect.state, effect.reason_code, effect.attempt_count) == (
        "quarantined", reasons.SLOT_LINEAGE_UNRESOLVED, 0)
    assert IntentResultReceipt.objects.get(command=command).evidence == {"reason": reasons.SLOT_LINEAGE_UNRESOLVED}
    [refusal] = effect.evidence.all()
    assert refusal.kind == "refused_before_post" and refusal.detail["links"][0]["link_key"] == link.link_key
    after = RemoteLink.objects.get(pk=link.pk)
    assert (after.state, after.reason_code) == ("suspended_drift", reasons.SLOT_LINEAGE_UNRESOLVED)
    assert not RemoteLink.objects.filter(link_key=effect.link_key).exists()

    shown = run_manage(["effects", "show", str(effect.pk), "--org", ORG], subprocess_env())
    assert shown.returncode == 0, shown.stderr
    assert f"effect {effect.pk}: quarantined (slot_lineage_unresolved)  class=attention  " in shown.stdout
    assert "refused_before_post" in shown.stdout


# === IC-04: metadata drift never switches in beneath an active attempt, not even with force ====================
def test_metadata_drift_cannot_be_switched_in_beneath_an_active_create_even_by_a_forced_halt(env):
    linked_record, record = contact("old@x.io"), contact("act@x.io")
    save(linked_record)
    drain()
    effect = parked_create(env, record)
    before = frozen_facts(effect)

    def v4(doc):
        contract_of(doc)["update"]["path"] = "/crm/v4/objects/contacts/{remote_id}"

    successor = reconfigure(env, v4, switch=False).epoch
    predecessor = ServingEpoch.objects.get(org_id=ORG, state="active")
    with pytest.raises(HaltRefused):
        halt_begin(org=env.org)
    halt_begin(org=env.org, force=True)  # the operator halts anyway: the attempt still needs serving
    assert halt_try_complete(org=env.org).gates[HUBSPOT_ACCOUNT] == (
        "halting_v2", reasons.HALT_WAITING_PREDECESSOR_WORK)
    with pytest.raises(HandoffRefused):
        handoff_stage(org=env.org, successor_id=successor.pk)
    assert ServingEpoch.objects.get(pk=successor.pk).state == "verified"
    with pytest.raises(NotServing):
        save(record, lastname="While-Halting")  # no new intent while halting
    assert egress.permit_try_grant_one(worker_id="w") is None
    assert frozen_facts(effect) == before and before[0]["epoch"]["id"] == predecessor.pk
    # Writeback-only recovery completes without serving; then the successor can be switched in.
    remote = env.hubspot.contact_by_email("act@x.io")
    effect_reconcile(org_id=ORG, effect_id=effect.pk, outcome="confirmed", remote_id=remote["id"], actor="ops",
                     note="found by email")
    assert egress.effect_try_finalize_one()
    assert halt_try_complete(org=env.org).all_halted
    handoff_stage(org=env.org, successor_id=successor.pk)
    successor_activate(org=env.org, successor_id=successor.pk)
    assert push_link(record).snapshot["update"]["path"] == "/crm/v3/objects/contacts/{remote_id}"
    # Under the successor the drift applies to both finalized links: fail closed before PATCH.
    requests = env.hubspot.state()["requests"]
    for r in (linked_record, record):
        command = save(r, lastname="After")
        drain()
        assert effect_of(command).reason_code == reasons.LINK_NOT_PATCHABLE
        assert (push_link(r).state, push_link(r).reason_code) == ("suspended_drift", reasons.LINK_DRIFT)
    assert env.hubspot.state()["requests"] == requests and env.posts() == 2


# === IC-03: writeback failure =================================================================================
def test_mirror_writeback_failure_keeps_the_link_authoritative_and_never_posts_again(env):
    record = contact("mw@x.io")
    with transaction.atomic():
        locked = record_lock(org=OrgScope(ORG), object_name="Contact", record_key=record.record_key)
        record_write_mirror(org=OrgScope(ORG), record=locked, field="billing_id", value="cus_legacy_value")
    command = save(record, contract=BILLING)
    drain()
    [customer] = env.billing.state()["customers"]
    effect = effect_of(command)
    assert effect.state == "finalized" and effect.remote_id == customer["id"]
    assert IntentResultReceipt.objects.get(command=command).evidence == {"mirror": "conflict"}
    link = push_link(record, BILLING)
    assert (link.state, link.remote_id, link.mirror_status) == ("active", customer["id"], "conflict")
    assert Record.objects.get(pk=record.pk).mirrors == {"billing_id": "cus_legacy_value"}  # not overwritten
    # The mirror is no authority: the next save updates the linked customer, never the mirrored id, never POSTs.
    update = save(record, contract=BILLING, lastname="Next")
    drain()
    [customer] = env.billing.state()["customers"]
    assert (customer["create_requests"], customer["update_requests"], customer["name"]) == (1, 1, "Mw Next")
    assert effect_of(update).attempts.get().path == f"/v1/customers/{customer['id']}"
    assert env.billing.state()["requests"] == 2


# === RR-05: crash after remote id persistence, before mirror writeback ==========================================
def test_crash_after_remote_id_persisted_resumes_only_the_writeback(env):
    record = contact("crash@x.io")
    command = save(record, contract=BILLING)
    crashed = run_manage(["run_workers", "--role", "egress"], subprocess_env(NEXUS_FAILPOINTS="effect.after_settle"),
                         timeout=60)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    effect = effect_of(command)
    [customer] = env.billing.state()["customers"]
    assert (effect.state, effect.remote_id) == ("remote_confirmed", customer["id"])
    assert push_link(record, BILLING).remote_id == customer["id"]
    assert Record.objects.get(pk=record.pk).mirrors == {}
    restarted = run_manage(["run_workers", "--role", "egress", "--until-idle"], subprocess_env(), timeout=120)
    assert restarted.returncode == 0, restarted.stderr
    effect.refresh_from_db()
    assert effect.state == "finalized" and effect.attempts.count() == 1
    assert Record.objects.get(pk=record.pk).mirrors == {"billing_id": customer["id"]}
    assert push_link(record, BILLING).mirror_status == "written"
    assert env.billing.state()["requests"] == 1 and env.billing.state()["customers"][0]["create_requests"] == 1


# === RR-06: retry exhaustion ====================================================================================
def test_retry_exhaustion_is_durable_operator_visible_and_blocks_a_later_post(env):
    record = contact("tired@x.io")
    command = save(record)
    max_attempts = profile_of(serving_pack(env).document)["retry"]["max_attempts"]
    # 477 (portal migrating): not performed and counted; 429s never exhaust a push (test_rate_limit_lanes.py).
    env.hubspot.set_faults(fail_before_commit={"status": 477, "count": max_attempts})
    for _ in range(max_attempts):
        zero_backoff()
        dispatch_one()
    effect = effect_of(command)
    assert (effect.state, effect.reason_code, effect.create_slot) == ("no_effect", reasons.RETRY_EXHAUSTED,
                                                                      effect.link_key)
    assert env.posts() == max_attempts and env.hubspot.state()["contacts"] == []
    assert "(retry_exhausted)" in _run("effects", "list", "--org", ORG, "--state", "no_effect")
    # A later save cannot POST again: the terminal create still occupies the slot.
    later = save(record, lastname="Later")
    zero_backoff()
    drain()
    assert (effect_of(later).state, effect_of(later).reason_code) == ("quarantined", reasons.PRIOR_CREATE_UNRESOLVED)
    assert env.posts() == max_attempts and not RemoteLink.objects.filter(link_key=effect.link_key).exists()
    effect.refresh_from_db()
    assert (effect.state, effect.create_slot) == ("no_effect", effect.link_key)
    # Only explicit operator intent supersedes it: the next attempt ordinal makes the one create.
    successor, created = outbound_command_author_successor(org_id=ORG, predecessor_command_id=command.pk,
                                                           actor="ops", reason="rate limit lifted")
    assert created
    drain()
    effect.refresh_from_db()
    assert (effect.state, effect.create_slot) == ("no_effect", None)
    new = effect_of(successor)
    assert (new.state, new.attempt_ordinal, new.create_slot) == ("finalized", 2, new.link_key)
    assert env.posts() == max_attempts + 1 and len(env.hubspot.state()["contacts"]) == 1


# === IC-13: missing stable slot ids ================================================================================
def test_missing_stable_slot_ids_fail_closed_before_post(env):
    for missing in ("action_slot_id", "destination_slot_id"):
        document = serving_pack(env).document
        document = {**document, "version": document["version"] + f"-no-{missing}",
                    "push_contracts": [{k: v for k, v in c.items() if k != missing}
                                       for c in document["push_contracts"]]}
        with pytest.raises(PackError, match=missing):
            pack_publish(document=document)
    # An effect whose pack named no stable slot (left blank by the slot backfill) is refused before any I/O;
    # its link key is never recomputed from names.
    record = contact("noslot@x.io")
    command = save(record)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE connectors_remoteeffect SET owner_key = '', action_slot_id = '', "
                       "destination_slot_id = '' WHERE command_id = %s", [command.pk])
    drain()
    effect = effect_of(command)
    assert (effect.state, effect.reason_code, effect.create_slot) == (
        "quarantined", reasons.STABLE_SLOT_UNRESOLVED, command.link_key)
    assert not effect.attempts.exists() and not RemoteLink.objects.filter(link_key=command.link_key).exists()
    assert env.hubspot.state()["requests"] == 0


# === IC-14: duplicate-create prevention ==============================================================================
def _two_saves(env):
    record = contact("race@x.io")
    first, second = save(record), save(record, lastname="Second")
    assert first.link_key == second.link_key
    return effect_of(first), effect_of(second)


def test_two_workers_granting_one_link_key_make_exactly_one_create_permit(env, holds):
    first, second = _two_saves(env)
    # The account gate is share-locked by both grants (it does not order them). a holds the head effect's
    # row until it commits the create; b skips that held row (SKIP LOCKED) and finds the link key's next
    # effect behind a head that is still prepared: b grants nothing, and returns while a still holds.
    holds.arm("permit.grant_before_commit")
    a = Worker(lambda: egress.permit_try_grant_one(worker_id="wa"), "a")
    a.start()
    marker = holds.wait_held("permit.grant_before_commit")
    b = Worker(lambda: egress.permit_try_grant_one(worker_id="wb"), "b")
    b.start()
    b.join(60)
    assert not b.is_alive() and a.is_alive(), "b waited for a's transaction"
    holds.release(marker)
    a.join(60)

    assert a.error is None and b.error is None and b.result is None
    [permit] = DispatchPermit.objects.filter(org_id=ORG)
    assert permit.attempt.operation == "create" and permit.attempt.effect_id == first.pk == a.result.effect_id
    first.refresh_from_db()
    second.refresh_from_db()
    assert (first.state, first.create_slot) == ("dispatching", first.link_key)
    assert (second.state, second.create_slot, second.attempt_count) == ("prepared", None, 0)
    egress.permit_settle(a.result, egress.permit_send(a.result))
    drain()
    assert env.posts() == 1 and effect_of(second.command).attempts.get().operation == "update"


def test_the_create_slot_index_decides_when_head_of_lane_is_bypassed(env, holds, monkeypatch):
    """Even a claimant that skips head-of-lane cannot take a second create: the unique index refuses it."""
    first, second = _two_saves(env)
    targets = {"a": first, "b": second}
    monkeypatch.setattr(permit_grant, "_is_head", lambda effect: True)
    monkeypatch.setattr(permit_grant, "head_of_lane_prepared", lambda now, nonterminal, lanes: [
        (ORG, targets[threading.current_thread().name].pk)])
    # b holds its own effect's row and queues on the create slot's unique index entry a wrote.
    a, b = race_behind_hold(
        holds, "permit.grant_before_commit",
        lambda: egress.permit_try_grant_one(worker_id="wa"),
        lambda: egress.permit_try_grant_one(worker_id="wb"),
        EFFECT_TABLE, names=("a", "b"), statement="UPDATE")

    assert a.error is None and b.error is None and (a.result.effect_id, b.result) == (first.pk, None)
    [permit] = DispatchPermit.objects.filter(org_id=ORG)
    assert permit.attempt.effect_id == first.pk and permit.attempt.operation == "create"
    second.refresh_from_db()
    assert (second.state, second.reason_code, second.create_slot) == (
        "quarantined", reasons.PRIOR_CREATE_UNRESOLVED, None)
    assert not second.attempts.exists()
    monkeypatch.undo()
    egress.permit_settle(a.result, egress.permit_send(a.result))
    drain()
    assert env.posts() == 1 and len(env.hubspot.state()["contacts"]) == 1


def test_a_raw_second_create_slot_holder_fails_on_the_unique_index(env):
    first, second = _two_saves(env)
    assert egress.effect_try_dispatch_one(worker_id="w")
    first.refresh_from_db()
    assert first.create_slot == first.link_key
    with pytest.raises(IntegrityError, match="remote_effect_create_slot_uniq"), connection.cursor() as cursor:
        cursor.execute(f"UPDATE {EFFECT_TABLE} SET create_slot = %s WHERE id = %s", [first.link_key, second.pk])
    with pytest.raises(IntegrityError, match="remote_effect_create_slot_uniq"), transaction.atomic():
        rows.make(RemoteEffect, org_id=ORG, link_key=first.link_key, create_slot=first.link_key, state="prepared",
                  lane_sequence=99, version=1)
    assert RemoteEffect.objects.filter(org_id=ORG, create_slot=first.link_key).count() == 1
    assert OutboundCommand.objects.filter(org_id=ORG).count() == 2


# === a settle chosen as a deadlock victim after the provider answered ===========================================
def test_a_settle_the_server_rolled_back_runs_again_with_the_response_in_hand(env, monkeypatch):
    from django.db import OperationalError

    from connectors.outbound import permit_settle

    record = contact("victim@x.io")
    command = save(record, contract=BILLING)
    real, victims = permit_settle.link_create, []

    def deadlock_once(effect, *args, **kwargs):  # inside the settle transaction, after its locks
        if not victims:
            victims.append(effect.pk)
            raise OperationalError(1213, "Deadlock found when trying to get lock; try restarting transaction")
        return real(effect, *args, **kwargs)

    monkeypatch.setattr(permit_settle, "link_create", deadlock_once)
    drain()
    [customer] = env.billing.state()["customers"]
    effect = effect_of(command)
    assert victims == [effect.pk]  # the first settle was rolled back whole
    assert (effect.state, effect.remote_id, customer["create_requests"]) == ("finalized", customer["id"], 1)
    assert [p.state for p in DispatchPermit.objects.filter(org_id=ORG)] == ["returned"]
    assert env.billing.state()["requests"] == 1  # settled from the response in hand, never sent again
