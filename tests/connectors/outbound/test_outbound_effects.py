"""Outbound effects, complete (seed 003 "Outbound facts", "State machines", "Transaction and crash rules",
"Generation and replay", "Replay and external effects"; ARCHITECTURE.md section 4).

Races use real concurrent transactions: one side is held open at a named
failpoint (``NEXUS_FAILPOINTS=<name>=hold``) while the other is seen queued
behind its row lock in the processlist, then released.
"""
from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction

from connectors.models import (
    AccountServingGate,
    CredentialGenerationDispatchGate,
    DispatchPermit,
    RemoteEffect,
    RemoteEffectAttempt,
    RemoteEffectEvidence,
    RemoteLink,
    ServingEpoch,
)
from connectors.outbound import egress
from connectors.reasons import CREDENTIAL_REVOKED, HALT_WAITING_OPEN_PERMITS
from connectors.serving.credential_gates import credential_reenable, credential_revoke
from connectors.serving.gates import epoch_prepare, epoch_verify, resolve_frozen_secret, service_configuration_apply
from connectors.serving.generations import credential_generation_read, credential_publish
from connectors.serving.handoff import HandoffRefused, halt_begin, halt_try_complete, handoff_stage, successor_activate
from nexusflow.kernel.scope import OrgScope, TrustedRuntimeWorkScope
from nexusflow.records.services import record_create, record_lock
from runtime_outbox.models import IntentResultReceipt, OutboundCommand
from runtime_outbox.services import outbound_command_author, outbox_try_deliver_one
from tests.concurrency import race_behind_hold
from tests.conftest import BILLING_KEY, ORG, SECRET_VERSION, drain, make_serving_org, service_document
from tests.kits.outbound import zero_backoff

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

SCOPE = TrustedRuntimeWorkScope(ORG, "core", "flow-runtime", "test-binding")
GATE_TABLE = "connectors_credentialgenerationdispatchgate"


@pytest.fixture
def org(billing_sandbox) -> OrgScope:
    return make_serving_org(billing_sandbox.base_url, deploy_flow=False)




def _push(email: str = "ann@x.io", slot: str = "push-1", *, deliver: bool = True) -> OutboundCommand:
    with transaction.atomic():
        record = record_create(org=OrgScope(ORG), object_name="Contact",
                               values={"email": email, "firstname": email.split("@")[0].title(),
                                       "lifecyclestage": "customer"})
    with transaction.atomic():
        record = record_lock(org=OrgScope(ORG), object_name="Contact", record_key=record.record_key)
        command = outbound_command_author(scope=SCOPE, effect_root_id="root-" + record.record_key,
                                          effect_slot_id=slot, effect_generation_id="1",
                                          contract_key="billing.customer", record=record, origin_flow_run_id=None)
    if deliver:
        assert outbox_try_deliver_one()
    return command


def _credential_gate() -> CredentialGenerationDispatchGate:
    return CredentialGenerationDispatchGate.objects.get(org_id=ORG, credential_generation__account_key="billing-main",
                                                       credential_generation__secret_version=SECRET_VERSION)


def _run(*args) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


# --- S003-RP-27: credential revocation against acquisition and granted -> sending ----------------------
def test_revocation_first_leaves_acquisition_nothing_to_grant(org, billing_sandbox, holds):
    _push()
    gate = _credential_gate()
    revoke, grant = race_behind_hold(
        holds, "credential.revoke_before_commit",
        lambda: credential_revoke(org_id=ORG, credential_generation_id=gate.credential_generation_id, actor="ops"),
        lambda: egress.permit_try_grant_one(worker_id="w1"),
        GATE_TABLE, names=("revoke", "grant"))

    assert revoke.error is None and grant.error is None
    assert grant.result is None
    assert not DispatchPermit.objects.filter(org_id=ORG).exists()
    assert RemoteEffect.objects.get(org_id=ORG).state == "prepared"
    revoked = _credential_gate()
    assert (revoked.state, revoked.reason_code, revoked.fence_token) == ("revoked", CREDENTIAL_REVOKED,
                                                                          gate.fence_token + 1)
    assert billing_sandbox.state()["requests"] == 0
    # Explicit re-enablement under a new fence lets the blocked effect dispatch with its frozen generation.
    assert credential_reenable(org_id=ORG, credential_generation_id=gate.credential_generation_id,
                               actor="ops").fence_token == gate.fence_token + 2
    drain()
    assert RemoteEffect.objects.get(org_id=ORG).state == "finalized"
    assert len(billing_sandbox.state()["customers"]) == 1


def test_acquisition_first_then_revocation_closes_the_pre_io_permit(org, billing_sandbox, holds):
    _push()
    gate = _credential_gate()
    grant, revoke = race_behind_hold(
        holds, "permit.grant_before_commit",
        lambda: egress.permit_try_grant_one(worker_id="w1"),
        lambda: credential_revoke(org_id=ORG, credential_generation_id=gate.credential_generation_id,
                                  actor="ops", note="leaked"),
        GATE_TABLE, names=("grant", "revoke"))

    assert grant.error is None and revoke.error is None and grant.result is not None
    permit = DispatchPermit.objects.get(org_id=ORG, pk=grant.result.permit_id)
    assert revoke.result.closed_permits == (int(permit.pk),)
    assert (permit.state, permit.io_may_have_started_at) == ("abandoned", None)
    assert permit.closed_evidence["proof"] == "credential_revoked_before_sending"
    assert RemoteEffectAttempt.objects.get(org_id=ORG).state == "no_effect"
    assert RemoteEffect.objects.get(org_id=ORG).state == "prepared"
    assert RemoteEffectEvidence.objects.get(org_id=ORG).kind == "credential_revoked"
    # The holder can never cross the boundary with it, not even after re-enablement (new fence).
    assert egress.permit_send(grant.result) is None
    credential_reenable(org_id=ORG, credential_generation_id=gate.credential_generation_id, actor="ops")
    assert egress.permit_send(grant.result) is None
    assert billing_sandbox.state()["requests"] == 0
    drain()
    assert len(billing_sandbox.state()["customers"]) == 1


def test_revocation_first_then_sending_never_crosses(org, billing_sandbox, holds):
    _push()
    gate = _credential_gate()
    granted = egress.permit_try_grant_one(worker_id="w1")
    revoke, send = race_behind_hold(
        holds, "credential.revoke_before_commit",
        lambda: credential_revoke(org_id=ORG, credential_generation_id=gate.credential_generation_id, actor="ops"),
        lambda: egress.permit_send(granted),
        GATE_TABLE, names=("revoke", "send"))

    assert revoke.error is None and send.error is None
    assert send.result is None
    permit = DispatchPermit.objects.get(org_id=ORG, pk=granted.permit_id)
    assert (permit.state, permit.io_may_have_started_at) == ("abandoned", None)
    assert billing_sandbox.state()["requests"] == 0


def test_sending_first_makes_its_one_call_and_settles_under_revocation(org, billing_sandbox, holds):
    _push()
    gate = _credential_gate()
    granted = egress.permit_try_grant_one(worker_id="w1")
    send, revoke = race_behind_hold(
        holds, "permit.sending_before_commit",
        lambda: egress.permit_send(granted),
        lambda: credential_revoke(org_id=ORG, credential_generation_id=gate.credential_generation_id, actor="ops"),
        GATE_TABLE, names=("send", "revoke"))

    assert send.error is None and revoke.error is None
    assert send.result is not None and send.result.status == 200
    assert revoke.result.closed_permits == ()
    assert _credential_gate().state == "revoked"
    # Settlement uses the Permit and holder fences, not the revoked credential gate.
    assert egress.permit_settle(granted, send.result) == "remote_confirmed"
    assert egress.effect_try_finalize_one()
    assert DispatchPermit.objects.get(org_id=ORG).state == "returned"
    assert [c["create_requests"] for c in billing_sandbox.state()["customers"]] == [1]


def test_credential_commands_report_and_refuse_unknown_generations(org):
    gate = _credential_gate()
    out = _run("connector_credential_revoke", "--org", ORG, "--generation", str(gate.credential_generation_id),
               "--actor", "ops", "--note", "rotated")
    assert "revoked (fence" in out
    assert "already revoked" in _run("connector_credential_revoke", "--org", ORG, "--generation",
                                     str(gate.credential_generation_id), "--actor", "ops")
    assert "enabled (fence" in _run("connector_credential_reenable", "--org", ORG, "--generation",
                                    str(gate.credential_generation_id), "--actor", "ops")
    with pytest.raises(CommandError, match="^credential_generation_unknown"):
        _run("connector_credential_revoke", "--org", "other-org", "--generation",
             str(gate.credential_generation_id), "--actor", "ops")
    with pytest.raises(CommandError, match="^credential_reenable_unauthorized"):
        _run("connector_credential_reenable", "--org", ORG, "--generation", str(gate.credential_generation_id),
             "--actor", " ")


# --- S003-RP-26: rotation while queued and while dispatching ---------------------------------------------
def test_rotation_while_queued_or_dispatching_uses_the_frozen_generation(org, billing_sandbox, monkeypatch):
    dispatching = _push("inflight@x.io")
    grant = egress.permit_try_grant_one(worker_id="w1")
    assert RemoteEffect.objects.get(pk=grant.effect_id).command_id == dispatching.pk
    queued = _push("queued@x.io", slot="push-2")
    frozen = queued.frozen_binding["credential_generation"]
    # Rotate: a new generation whose secret the provider does not accept, a new configuration and a verified
    # candidate epoch that references it. Nothing already frozen may fall forward to it.
    monkeypatch.setenv("NEXUS_TEST_ROTATED_KEY", "sk_rotated_not_accepted")
    credential_publish(org=org, document={"account_key": "billing-main", "credential_ref": "api_key",
                                          "version": "test-rotated", "secret": {"from_env": "NEXUS_TEST_ROTATED_KEY"},
                                          "transport": {"scheme": "bearer"}})
    document = service_document(billing_sandbox.base_url)
    document["accounts"][1]["credentials"]["api_key"] = "test-rotated"
    service_configuration_apply(org=org, document=document)
    epoch_verify(org=org, epoch_id=epoch_prepare(org=org).pk)

    response = egress.permit_send(grant)
    assert response.status == 200
    assert egress.permit_settle(grant, response) == "remote_confirmed"
    zero_backoff()
    drain()
    assert {c["email"] for c in billing_sandbox.state()["customers"]} == {"queued@x.io", "inflight@x.io"}
    assert set(RemoteEffect.objects.values_list("state", flat=True)) == {"finalized"}
    # Both commands stay bound to the generation frozen at authoring; its metadata and secret stay readable.
    for command in OutboundCommand.objects.filter(org_id=ORG):
        assert command.frozen_binding["credential_generation"] == frozen
    assert credential_generation_read(org=org, credential_generation_id=frozen["id"]).generation.secret_version \
        == SECRET_VERSION
    assert resolve_frozen_secret(org_id=ORG, frozen=frozen) == BILLING_KEY.encode()


# --- S003-RP-25: halting keeps the command bound; successor activation waits for it ----------------------
def _successor_epoch(org: OrgScope, billing_url: str, monkeypatch) -> ServingEpoch:
    monkeypatch.setenv("NEXUS_TEST_BILLING_KEY_NEXT", BILLING_KEY)
    credential_publish(org=org, document={"account_key": "billing-main", "credential_ref": "api_key",
                                          "version": "test-next", "secret": {"from_env": "NEXUS_TEST_BILLING_KEY_NEXT"},
                                          "transport": {"scheme": "bearer"}})
    document = service_document(billing_url)
    document["accounts"][1]["credentials"]["api_key"] = "test-next"
    service_configuration_apply(org=org, document=document)
    return epoch_verify(org=org, epoch_id=epoch_prepare(org=org).pk)


def test_halt_keeps_a_committed_command_bound_and_blocks_successor_activation(org, billing_sandbox, monkeypatch):
    command = _push()
    binding, binding_digest = command.frozen_binding, command.frozen_binding_digest
    predecessor = ServingEpoch.objects.get(org_id=ORG, state="active")
    grant = egress.permit_try_grant_one(worker_id="w1")
    successor = _successor_epoch(org, billing_sandbox.base_url, monkeypatch)

    halt_begin(org=org)
    assert halt_try_complete(org=org).gates["billing-main"] == ("halting_v2", HALT_WAITING_OPEN_PERMITS)
    with pytest.raises(HandoffRefused):
        handoff_stage(org=org, successor_id=successor.pk)
    with pytest.raises(HandoffRefused):
        successor_activate(org=org, successor_id=successor.pk)

    # The open Permit makes its one call under the original binding while the gate is halting.
    response = egress.permit_send(grant)
    assert response.status == 200 and egress.permit_settle(grant, response) == "remote_confirmed"
    assert not halt_try_complete(org=org).all_halted  # remote_confirmed is still in flight
    with pytest.raises(HandoffRefused):
        successor_activate(org=org, successor_id=successor.pk)
    assert egress.effect_try_finalize_one()
    assert halt_try_complete(org=org).all_halted

    command.refresh_from_db()
    assert (command.frozen_binding, command.frozen_binding_digest) == (binding, binding_digest)
    assert command.frozen_binding["epoch"] == {"id": int(predecessor.pk), "digest": predecessor.digest}
    assert IntentResultReceipt.objects.get(command=command).outcome == "finalized"
    handoff_stage(org=org, successor_id=successor.pk)
    successor_activate(org=org, successor_id=successor.pk)
    assert set(AccountServingGate.objects.filter(org_id=ORG).values_list("epoch_id", flat=True)) == {successor.pk}
    assert len(billing_sandbox.state()["customers"]) == 1


# --- S003-RP-34 (successor half): a new EffectGeneration only after proven terminal no_effect ---------------
def test_successor_generation_follows_only_a_proven_no_effect_predecessor(org, billing_sandbox):
    command = _push()
    billing_sandbox.set_faults(fail_before_commit={"status": 400, "count": 1})
    drain()
    assert RemoteEffect.objects.get(command=command).state == "no_effect"
    out = _run("effects", "successor", str(command.pk), "--org", ORG, "--actor", "ops", "--reason", "data fixed")
    successor = OutboundCommand.objects.get(predecessor=command)
    assert f"command {successor.pk}: generation 2 of command {command.pk} authored" in out
    assert (successor.effect_root_id, successor.effect_slot_id) == (command.effect_root_id, command.effect_slot_id)
    linkage = successor.frozen_binding["effect_generation_predecessor"]
    assert linkage["predecessor_command_key"] == command.idempotency_key
    assert linkage["authorization"]["actor"] == "ops" and successor.successor_authorization["reason"] == "data fixed"
    assert successor.idempotency_key != command.idempotency_key
    assert "already authored" in _run("effects", "successor", str(command.pk), "--org", ORG, "--actor", "ops",
                                      "--reason", "again")
    assert OutboundCommand.objects.filter(predecessor=command).count() == 1
    drain()
    assert RemoteEffect.objects.get(command=command).state == "no_effect"  # the predecessor never reopens
    assert RemoteEffect.objects.get(command=successor).state == "finalized"
    assert [c["create_requests"] for c in billing_sandbox.state()["customers"]] == [1]


@pytest.mark.parametrize("predecessor_state, code", [
    ("undelivered", "predecessor_not_delivered"),
    ("prepared", "predecessor_in_flight"),
    ("uncertain", "predecessor_uncertain"),
    ("finalized", "predecessor_confirmed"),
])
def test_successor_is_refused_unless_the_predecessor_is_proven_no_effect(org, billing_sandbox, predecessor_state,
                                                                         code):
    command = _push(deliver=predecessor_state != "undelivered")
    if predecessor_state == "uncertain":
        billing_sandbox.set_faults(drop_response_after_commit=1)
        assert egress.effect_try_dispatch_one(worker_id="w1")
    elif predecessor_state == "finalized":
        drain()
    assert RemoteEffect.objects.filter(command=command, state=predecessor_state).exists() \
        or predecessor_state == "undelivered"
    with pytest.raises(CommandError, match=f"^{code}"):
        _run("effects", "successor", str(command.pk), "--org", ORG, "--actor", "ops", "--reason", "retry")
    assert not OutboundCommand.objects.filter(predecessor=command).exists()


# --- frozen outcome policy (S003-RP-30) -------------------------------------------------------------------
def test_not_performed_retries_only_while_the_frozen_policy_has_attempts_left(org, billing_sandbox):
    command = _push()
    # 409 (idempotency key busy): not performed, and not a rate limit (429s are never counted).
    billing_sandbox.set_faults(fail_before_commit={"status": 409, "count": 1000})
    max_attempts = 10  # packs/billing/pack.json retry.max_attempts, frozen with the pack generation
    for _ in range(max_attempts):
        zero_backoff()
        assert egress.effect_try_dispatch_one(worker_id="w1")
    effect = RemoteEffect.objects.get(command=command)
    assert (effect.state, effect.reason_code, effect.attempt_count) == ("no_effect", "retry_exhausted", max_attempts)
    assert IntentResultReceipt.objects.get(command=command).outcome == "no_effect"
    zero_backoff()
    assert not egress.effect_try_dispatch_one(worker_id="w1")
    assert set(RemoteEffectAttempt.objects.values_list("state", flat=True)) == {"no_effect"}
    assert billing_sandbox.state()["customers"] == []


def test_an_unclassified_status_is_parked_for_an_operator(org, billing_sandbox):
    command = _push()
    billing_sandbox.set_faults(fail_before_commit={"status": 418, "count": 1})
    assert egress.effect_try_dispatch_one(worker_id="w1")
    effect = RemoteEffect.objects.get(command=command)
    assert (effect.state, effect.reason_code) == ("uncertain", "unclassified_response")
    zero_backoff()
    assert not egress.effect_try_reconcile_one()
    assert RemoteEffect.objects.get(command=command).state == "uncertain"
    assert billing_sandbox.state()["requests"] == 1


# --- seed 002 DispatchLane: the closed lane set, applied in the claim ---------------------------------------
def test_an_unknown_dispatch_lane_is_never_claimed_and_the_narrow_lane_takes_only_its_own(org, billing_sandbox):
    command = _push()
    effect = RemoteEffect.objects.get(command=command)
    assert effect.dispatch_lane == "configured" and effect.link_key == command.link_key
    with connection.cursor() as cursor:  # a row written by a later release with a lane this one does not know
        cursor.execute("UPDATE connectors_remoteeffect SET dispatch_lane = 'bulk_backfill' WHERE id = %s", [effect.pk])
    assert egress.permit_try_grant_one(worker_id="w1") is None
    assert egress.permit_try_grant_one(worker_id="w1", lanes=("bulk_backfill",)) is None
    with connection.cursor() as cursor:
        cursor.execute("UPDATE connectors_remoteeffect SET dispatch_lane = 'configured' WHERE id = %s", [effect.pk])
    assert egress.permit_try_grant_one(worker_id="w1", lanes=("deferred_association",)) is None
    assert egress.permit_try_grant_one(worker_id="w1") is not None
    assert billing_sandbox.state()["requests"] == 0


# --- operator commands ---------------------------------------------------------------------------------------
def test_effects_reconcile_appends_evidence_and_finalizes_without_a_second_call(org, billing_sandbox):
    command = _push()
    billing_sandbox.set_faults(drop_response_after_commit=1)
    assert egress.effect_try_dispatch_one(worker_id="w1")
    effect = RemoteEffect.objects.get(command=command)
    assert effect.state == "uncertain"
    [customer] = billing_sandbox.state()["customers"]
    listed = _run("effects", "list", "--org", ORG, "--state", "uncertain")
    assert f"effect {effect.pk:>6}  uncertain (response_ambiguous)" in listed and "1 effect(s)" in listed
    out = _run("effects", "reconcile", str(effect.pk), "--org", ORG, "--confirmed", customer["id"], "--actor", "ops",
               "--note", "found in the provider dashboard")
    assert f"effect {effect.pk}: uncertain -> remote_confirmed" in out
    assert egress.effect_try_finalize_one()
    effect.refresh_from_db()
    assert (effect.state, effect.remote_id) == ("finalized", customer["id"])
    assert RemoteLink.objects.get(org_id=ORG).remote_id == customer["id"]
    assert RemoteEffectAttempt.objects.get(effect=effect).state == "uncertain"  # never rewritten
    evidence = RemoteEffectEvidence.objects.get(effect=effect)
    assert (evidence.kind, evidence.from_state, evidence.to_state) == ("operator_confirmed", "uncertain",
                                                                       "remote_confirmed")
    assert billing_sandbox.state()["requests"] == 1
    shown = _run("effects", "show", str(effect.pk), "--org", ORG)
    assert "attempt 1: create POST /v1/customers -> uncertain" in shown and "operator_confirmed by ops" in shown
    with pytest.raises(CommandError, match="^effect_not_uncertain"):
        _run("effects", "reconcile", str(effect.pk), "--org", ORG, "--no-effect", "--actor", "ops", "--note", "x")
    with pytest.raises(CommandError, match="^effect_not_quarantinable"):
        _run("effects", "quarantine", str(effect.pk), "--org", ORG, "--actor", "ops", "--note", "x")
    with pytest.raises(CommandError, match="^effect_unknown"):
        _run("effects", "show", str(effect.pk), "--org", "other-org")


def test_effects_list_shows_each_reason_class_and_filters_by_it():
    """A superseded older version stays ``quarantined`` but reads ``benign``; ``--class attention`` hides it."""
    from connectors.reasons import OPERATOR_QUARANTINE, SUPERSEDED_BY_NEWER_VERSION
    from tests.kernel import rows

    superseded = rows.make(RemoteEffect, org_id=ORG, state="quarantined", version=1,
                           reason_code=SUPERSEDED_BY_NEWER_VERSION)
    parked = rows.make(RemoteEffect, org_id=ORG, state="quarantined", version=1, reason_code=OPERATOR_QUARANTINE)
    done = rows.make(RemoteEffect, org_id=ORG, state="finalized", version=1)
    listed = _run("effects", "list", "--org", ORG)
    assert f"effect {superseded.pk:>6}  quarantined (superseded_by_newer_version)  class=benign  " in listed
    assert f"effect {parked.pk:>6}  quarantined (operator_quarantine)  class=attention  " in listed
    assert f"effect {done.pk:>6}  finalized  " in listed and "3 effect(s)" in listed
    as_json = {e["effect"]: (e["state"], e["reason_code"], e["reason_class"])
               for e in json.loads(_run("effects", "list", "--org", ORG, "--json"))}
    assert as_json == {superseded.pk: ("quarantined", SUPERSEDED_BY_NEWER_VERSION, "benign"),
                       parked.pk: ("quarantined", OPERATOR_QUARANTINE, "attention"),
                       done.pk: ("finalized", "", None)}
    attention = _run("effects", "list", "--org", ORG, "--state", "quarantined", "--class", "attention")
    assert f"effect {parked.pk:>6}" in attention and f"effect {superseded.pk:>6}" not in attention
    assert "1 effect(s)" in attention
    benign = json.loads(_run("effects", "list", "--org", ORG, "--class", "benign", "--json"))
    assert [e["effect"] for e in benign] == [superseded.pk]
    shown = json.loads(_run("effects", "show", str(superseded.pk), "--org", ORG, "--json"))
    assert (shown["state"], shown["reason_class"]) == ("quarantined", "benign")
    with pytest.raises(CommandError, match="--class"):
        _run("effects", "list", "--org", ORG, "--class", "trouble")


def test_effects_reconcile_no_effect_with_retry_dispatches_again_under_the_same_key(org, billing_sandbox):
    command = _push()
    billing_sandbox.set_faults(fail_before_commit={"status": 418, "count": 1})
    assert egress.effect_try_dispatch_one(worker_id="w1")
    effect = RemoteEffect.objects.get(command=command)
    _run("effects", "reconcile", str(effect.pk), "--org", ORG, "--no-effect", "--retry", "--actor", "ops",
         "--note", "provider support confirmed the request was rejected")
    assert RemoteEffect.objects.get(pk=effect.pk).state == "prepared"
    drain()
    first, second = RemoteEffectAttempt.objects.filter(effect=effect).order_by("attempt_number")
    assert first.state == "uncertain" and second.state == "confirmed"
    assert first.idempotency_key == second.idempotency_key
    assert [c["create_requests"] for c in billing_sandbox.state()["customers"]] == [1]


def test_effects_quarantine_parks_a_prepared_effect_and_records_the_intent_result(org, billing_sandbox):
    command = _push()
    effect = RemoteEffect.objects.get(command=command)
    out = _run("effects", "quarantine", str(effect.pk), "--org", ORG, "--actor", "ops", "--note", "customer asked")
    assert "prepared -> quarantined" in out
    assert IntentResultReceipt.objects.get(command=command).outcome == "quarantined"
    drain()
    assert billing_sandbox.state()["requests"] == 0
    with pytest.raises(CommandError, match="^reconcile_evidence_missing"):
        _run("effects", "quarantine", str(effect.pk), "--org", ORG, "--actor", "ops", "--note", "  ")


# --- a Flow run cancelled while its intent is in flight -------------------------------------------------------
def test_cancelling_the_flow_run_leaves_its_committed_intent_to_finish_once(serving_org, billing_sandbox):
    from nexusflow.flows.models import FlowRun
    from nexusflow.flows.services import flow_run_delete, flow_try_run_step_one

    with transaction.atomic():
        record_create(org=OrgScope(ORG), object_name="Contact",
                      values={"email": "cy@x.io", "firstname": "Cy", "lifecyclestage": "customer"})
    run = FlowRun.objects.get(org_id=ORG)
    while flow_try_run_step_one(worker_id="t") and not OutboundCommand.objects.exists():
        pass
    command = OutboundCommand.objects.get(origin_flow_run_id=run.pk)
    flow_run_delete(org=OrgScope(ORG), run_id=run.pk)
    drain()
    # The intent was committed before the cancellation: it is neither lost nor duplicated, and its
    # completion does not resurrect the cancelled run.
    assert RemoteEffect.objects.get(command=command).state == "finalized"
    assert IntentResultReceipt.objects.get(command=command).outcome == "finalized"
    assert [c["create_requests"] for c in billing_sandbox.state()["customers"]] == [1]
    run.refresh_from_db()
    assert run.state == "Cancelled" and run.is_deleted


def test_a_confirmation_without_its_remote_id_is_refused_never_read_as_no_effect(org, billing_sandbox):
    command = _push()
    billing_sandbox.set_faults(drop_response_after_commit=1)
    assert egress.effect_try_dispatch_one(worker_id="w1")
    effect = RemoteEffect.objects.get(command=command)
    with pytest.raises(CommandError, match="^reconcile_evidence_missing"):
        _run("effects", "reconcile", str(effect.pk), "--org", ORG, "--confirmed", "", "--actor", "ops", "--note", "n")
    effect.refresh_from_db()
    assert effect.state == "uncertain" and not RemoteEffectEvidence.objects.filter(effect=effect).exists()


@pytest.mark.parametrize("args", [
    ("effects", "show", "-5", "--org", ORG),
    ("effects", "list", "--org", ORG + " "),
    ("effects", "list", "--org", ORG, "--limit", "0"),
    ("run_workers", "--role", "flow", "--until-idle", "--idle-sleep", "-1"),
    ("run_workers", "--role", "flow", "--until-idle", "--idle-rounds", "0"),
])
def test_malformed_operator_input_exits_2_with_a_code(org, args):
    with pytest.raises(CommandError, match=r"^[a-z_]+: ") as refused:
        _run(*args)
    assert refused.value.returncode == 2


def test_revocation_names_its_actor(org):
    gate = _credential_gate()
    with pytest.raises(CommandError, match="^credential_revoke_unauthorized"):
        _run("connector_credential_revoke", "--org", ORG, "--generation", str(gate.credential_generation_id),
             "--actor", " ")
    assert _credential_gate().state == "enabled"
