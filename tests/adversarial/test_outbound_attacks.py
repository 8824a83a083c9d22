"""Attacks on the outbound effects subsystem (seed 003 "Outbound facts", "State machines",
"Transaction and crash rules", "Replay and external effects"; seed 002 "Attempt Key", "Before POST").

Every race here uses real concurrent MariaDB transactions (threads with their own
connections, one side held at a row lock or a ``hold`` failpoint) or real worker
processes killed at a named failpoint. The billing sandbox counts every create
request, so a second create is visible.
"""
from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import OperationalError, connection, transaction

from connectors import reasons
from connectors.contracts.pack_document import PackError
from connectors.models import (
    CredentialGenerationDispatchGate,
    DispatchPermit,
    RemoteEffect,
    RemoteEffectAttempt,
    RemoteEffectEvidence,
    RemoteLink,
)
from connectors.outbound import egress
from connectors.outbound.effect_decisions import EffectOperationRefused, effect_quarantine, effect_reconcile
from connectors.serving.credential_gates import credential_reenable, credential_revoke
from connectors.serving.generations import pack_publish
from connectors.serving.secret_store import secret_path
from connectors.store import RemoteEffectStore
from nexusflow.kernel.errors import NexusError, StaleVersion
from nexusflow.kernel.scope import OrgScope
from nexusflow.records.services import record_lock
from runtime_outbox.models import IntentResultReceipt, OutboundCommand, OutboxMessage
from runtime_outbox.services import (
    SuccessorRefused,
    outbound_command_author_successor,
    outbox_try_deliver_one,
)
from tests.concurrency import Worker, wait_until_blocked_on
from tests.conftest import ORG, ROOT, SECRET_VERSION, drain, make_serving_org, run_manage, subprocess_env
from tests.kits.outbound import author, zero_backoff
from tests.kits.records import customer_contact

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

OTHER_ORG = "other-org"
EFFECT_TABLE = "connectors_remoteeffect"
RECORD_TABLE = "records_record"


@pytest.fixture
def org(billing_sandbox) -> OrgScope:
    return make_serving_org(billing_sandbox.base_url, deploy_flow=False)


# --- helpers ---------------------------------------------------------------------------------------------
def _push(email: str = "ann@x.io") -> OutboundCommand:
    record = customer_contact(email)
    command = author(record.record_key, "push", root="root-" + record.record_key)
    assert outbox_try_deliver_one()
    return command


def _credential_gate() -> CredentialGenerationDispatchGate:
    return CredentialGenerationDispatchGate.objects.get(org_id=ORG, credential_generation__account_key="billing-main",
                                                       credential_generation__secret_version=SECRET_VERSION)


def _uncertain(sandbox, email: str = "ann@x.io") -> RemoteEffect:
    """A create whose response was lost after the provider committed it: ``uncertain``."""
    command = _push(email)
    sandbox.set_faults(drop_response_after_commit=1)
    assert egress.effect_try_dispatch_one(worker_id="w1")
    effect = RemoteEffect.objects.get(command=command)
    assert effect.state == "uncertain"
    return effect


def _mock_client(status: int, body: dict | bytes) -> httpx.Client:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.Client(transport=httpx.MockTransport(lambda request: httpx.Response(status, content=content)))


def _run(*args) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def _effect_facts() -> tuple:
    """Everything an operator command may write, to prove a refusal wrote nothing."""
    return (sorted(RemoteEffect.objects.values_list("id", "state", "version", "reason_code", "remote_id")),
            RemoteEffectEvidence.objects.count(), RemoteLink.objects.count(), IntentResultReceipt.objects.count(),
            OutboundCommand.objects.count())


# === A1: slot occupancy when outbox delivery order differs from record version order ==========================
def test_a_late_delivered_earlier_version_never_dispatches_beside_an_in_flight_create(org, billing_sandbox,
                                                                                       monkeypatch):
    """Seed 002 "Attempt Key": never two active attempts for one link_key.

    The relay backs off a message whose delivery failed (commit bd6bff0), so a later record
    version's command can become a RemoteEffect first and start its create; the earlier
    version's effect arrives afterwards with a lower lane_sequence. It must wait for the
    in-flight create and then follow as an update, never send a second create.
    """
    record = customer_contact("lee@x.io")
    first = author(record.record_key, "push", root="root-a")
    second = author(record.record_key, "push", root="root-b", email="lee@new.io")
    assert first.source_record_version < second.source_record_version and first.link_key == second.link_key

    import connectors.outbound.intents as outbound

    real_accept = outbound.remote_effect_find_or_create
    calls = {"n": 0}

    def flaky_accept(*, command):
        calls["n"] += 1
        if calls["n"] == 1:  # a transient database error on the first delivery: the message backs off
            raise OperationalError(2013, "Lost connection to server during query")
        return real_accept(command=command)

    monkeypatch.setattr(outbound, "remote_effect_find_or_create", flaky_accept)
    with pytest.raises(OperationalError):
        outbox_try_deliver_one()  # claims the first command's message, then fails: it backs off
    assert outbox_try_deliver_one()  # the second command is delivered first
    late = RemoteEffect.objects.get(command=second)
    grant = egress.permit_try_grant_one(worker_id="w1")
    assert grant is not None and grant.effect_id == late.pk
    assert RemoteEffectAttempt.objects.get(pk=grant.attempt_id).operation == "create"

    zero_backoff(outbox=True)
    assert outbox_try_deliver_one()  # now the earlier version's effect exists, with a lower lane_sequence
    early = RemoteEffect.objects.get(command=first)
    assert early.lane_sequence < late.lane_sequence and early.state == "prepared"
    # While the later create is in flight the slot is occupied: nothing else on it may be granted.
    assert egress.permit_try_grant_one(worker_id="w2") is None
    assert DispatchPermit.objects.filter(state__in=("granted", "sending")).count() == 1

    response = egress.permit_send(grant)
    assert egress.permit_settle(grant, response) == "remote_confirmed"
    zero_backoff(outbox=True)
    drain()
    customers = billing_sandbox.state()["customers"]
    assert [c["create_requests"] for c in customers] == [1], customers
    # The earlier version is never sent after the later one reached the remote: it is superseded.
    assert RemoteEffect.objects.get(command=second).state == "finalized"
    early.refresh_from_db()
    assert (early.state, early.reason_code) == ("quarantined", "superseded_by_newer_version")
    assert IntentResultReceipt.objects.get(command=first).outcome == "superseded"
    assert RemoteLink.objects.get(link_key=first.link_key).remote_id == customers[0]["id"]
    assert [a.operation for a in RemoteEffectAttempt.objects.order_by("id")] == ["create"]


def test_a_late_delivered_earlier_version_does_not_overwrite_newer_remote_values(org, billing_sandbox):
    record = customer_contact("old@x.io")
    first = author(record.record_key, "push", root="root-a")
    second = author(record.record_key, "push", root="root-b", email="new@x.io")
    with connection.cursor() as cursor:  # the first message's delivery failed once and backs off
        cursor.execute("UPDATE runtime_outbox_outboxmessage SET next_attempt_at = NOW() + INTERVAL 1 HOUR "
                       "WHERE command_id = %s", [first.pk])
    assert outbox_try_deliver_one()
    assert egress.effect_try_dispatch_one(worker_id="w1")
    assert RemoteEffect.objects.get(command=second).state == "remote_confirmed"
    zero_backoff(outbox=True)
    drain()
    [customer] = billing_sandbox.state()["customers"]
    assert customer["email"] == "new@x.io", "the remote now holds the older record version"


# === A2: a 2xx create whose id cannot be linked must park the effect, not wedge its Permit ====================
@pytest.mark.parametrize("case", ["overlong", "invisible", "held_by_another_link"])
def test_a_2xx_create_with_an_unlinkable_id_is_parked_for_an_operator(org, billing_sandbox, case):
    """``permit_settle`` must always close the Permit it settles: an exception there leaves the
    Permit ``sending`` under a live holder, so it can never be abandoned and halt never completes."""
    taken = ""
    if case == "held_by_another_link":
        command = _push("first@x.io")
        drain()
        taken = RemoteLink.objects.get(link_key=command.link_key).remote_id
    body = {"overlong": {"id": "cus_" + "x" * 300},
            "invisible": {"id": "cus_\u200bhidden"},
            "held_by_another_link": {"id": taken}}[case]
    pushed = _push("second@x.io")
    effect = RemoteEffect.objects.get(command=pushed)
    with _mock_client(200, body) as client:
        assert egress.effect_try_dispatch_one(worker_id="w1", client=client)
    effect.refresh_from_db()
    permit = DispatchPermit.objects.get(attempt__effect=effect)
    attempt = RemoteEffectAttempt.objects.get(effect=effect)
    assert permit.state == "returned", "the settled Permit must close"
    expected = reasons.REMOTE_LOCATOR_CONFLICT if case == "held_by_another_link" else reasons.RESPONSE_ID_MISSING
    assert (effect.state, effect.reason_code, effect.remote_id) == ("uncertain", expected, "")
    assert (attempt.state, attempt.response_status, attempt.remote_id) == ("uncertain", 200, "")
    assert not RemoteLink.objects.filter(link_key=pushed.link_key).exists()
    if case == "held_by_another_link":
        # Seed 002 stale remote-locator conflict: the link already holding the id is suspended, never PATCHed.
        held = RemoteLink.objects.get(remote_id=taken)
        assert (held.state, held.reason_code) == ("suspended_drift", reasons.REMOTE_LOCATOR_CONFLICT)
    # Parked for an operator: the reconciler never repeats it on its own.
    zero_backoff(outbox=True)
    assert not egress.effect_try_reconcile_one()
    assert RemoteEffect.objects.get(pk=effect.pk).state == "uncertain"


# === A3: nothing may fail between ``sending`` and the provider call ============================================
def test_unusable_secret_bytes_close_the_permit_before_sending_and_block_dispatch(org, billing_sandbox):
    """Bytes that cannot form the bearer header used to fail after ``granted -> sending`` committed:
    the Permit stayed ``sending`` (io_may_have_started) under a live holder although nothing was sent."""
    command = _push()
    grant = egress.permit_try_grant_one(worker_id="w1")
    assert grant is not None
    path = secret_path(org_id=ORG, account_key="billing-main", credential_ref="api_key",
                       secret_version=SECRET_VERSION)
    original = path.read_bytes()
    path.write_bytes(b"\xff\xfe not text")
    try:
        assert egress.permit_send(grant) is None
        permit = DispatchPermit.objects.get(pk=grant.permit_id)
        assert (permit.state, permit.io_may_have_started_at) == ("abandoned", None)
        assert permit.closed_evidence["proof"] == "holder_released_before_sending"
        assert RemoteEffect.objects.get(command=command).state == "prepared"
        # Acquisition now refuses too (no grant/abandon churn) while the material stays unusable.
        assert egress.permit_try_grant_one(worker_id="w1") is None
        assert DispatchPermit.objects.count() == 1
        assert billing_sandbox.state()["requests"] == 0
    finally:
        path.write_bytes(original)
    drain()
    assert RemoteEffect.objects.get(command=command).state == "finalized"
    assert [c["create_requests"] for c in billing_sandbox.state()["customers"]] == [1]


def _billing_pack(version: str, **profile_changes) -> dict:
    document = json.loads((ROOT / "packs" / "billing" / "pack.json").read_text())
    document["version"] = version
    profile = document["callout_profiles"][0]
    for key, value in profile_changes.items():
        if key == "header":
            profile["idempotency"]["header"] = value
        else:
            profile[key] = value
    return document


@pytest.mark.parametrize("change", [
    {"timeout_seconds": "5"}, {"timeout_seconds": 0}, {"timeout_seconds": -1}, {"timeout_seconds": None},
    {"timeout_seconds": True}, {"timeout_seconds": 1e9}, {"header": "Idempotency Key"},
    {"header": "Idempotency-Key\r\nX-Evil"}, {"header": ""},
    {"outcomes": {"refused": [200]}}, {"outcomes": {"refused": [400], "ambiguous": [400]}},
    {"outcomes": {"maybe": [418]}}, {"retry": {"max_attempts": 0}}, {"retry": {"max_attempts": 1.5}},
])
def test_pack_publish_refuses_a_callout_profile_the_adapter_cannot_use(change):
    from connectors.models import PackGeneration

    before = PackGeneration.objects.count()
    with pytest.raises(PackError):
        pack_publish(document=_billing_pack("9.9.9-bad", **change))
    assert PackGeneration.objects.count() == before


# === A4: successor EffectGeneration: concurrent requests, deleted source, quarantined predecessor ===============
def _refused_predecessor(sandbox) -> OutboundCommand:
    command = _push()
    sandbox.set_faults(fail_before_commit={"status": 400, "count": 1})
    assert egress.effect_try_dispatch_one(worker_id="w1")
    assert RemoteEffect.objects.get(command=command).state == "no_effect"
    return command


def test_two_concurrent_successor_requests_mint_one_generation_and_report_it_once(org, billing_sandbox):
    predecessor = _refused_predecessor(billing_sandbox)
    requests = [Worker(lambda n=n: outbound_command_author_successor(org_id=ORG, predecessor_command_id=predecessor.pk,
                                                                 actor="ops", reason=f"retry {n}"), f"successor-{n}")
                for n in range(2)]
    with transaction.atomic():
        # Hold the source record: both requests pass their unlocked pre-check and queue behind this lock.
        record_lock(org=OrgScope(ORG), object_name="Contact", record_key=predecessor.source_record_key)
        for request in requests:
            request.start()
            assert request.ready.wait(60)
            wait_until_blocked_on(request.connection_id, RECORD_TABLE)
    for request in requests:
        request.join(60)
    assert [r.error for r in requests] == [None, None]
    successors = list(OutboundCommand.objects.filter(predecessor=predecessor))
    assert len(successors) == 1
    assert {r.result[0].pk for r in requests} == {successors[0].pk}
    assert sorted(r.result[1] for r in requests) == [False, True], "exactly one request authored it"
    assert OutboxMessage.objects.filter(command=successors[0]).count() == 1
    assert successors[0].effect_generation_id == "2"


def test_successor_of_a_deleted_source_record_is_refused_with_a_code(org, billing_sandbox):
    predecessor = _refused_predecessor(billing_sandbox)
    with connection.cursor() as cursor:  # the record was deleted after the refusal
        cursor.execute("UPDATE records_record SET is_deleted = 1 WHERE record_key = %s",
                       [predecessor.source_record_key])
    before = _effect_facts()
    with pytest.raises(CommandError, match="^predecessor_source_deleted"):
        _run("effects", "successor", str(predecessor.pk), "--org", ORG, "--actor", "ops", "--reason", "again")
    assert _effect_facts() == before


def test_successor_of_a_quarantined_predecessor_or_from_another_org_is_refused(org, billing_sandbox):
    command = _push()
    effect = RemoteEffect.objects.get(command=command)
    effect_quarantine(org_id=ORG, effect_id=effect.pk, actor="ops", note="parked")
    before = _effect_facts()
    with pytest.raises(SuccessorRefused) as refused:
        outbound_command_author_successor(org_id=ORG, predecessor_command_id=command.pk, actor="ops", reason="r")
    assert refused.value.code == "predecessor_not_proven_no_effect"
    with pytest.raises(CommandError, match="^command_unknown"):
        _run("effects", "successor", str(command.pk), "--org", OTHER_ORG, "--actor", "ops", "--reason", "r")
    assert _effect_facts() == before
    drain()
    assert billing_sandbox.state()["requests"] == 0


# === A5: operator evidence abuse ============================================================================
@pytest.mark.parametrize("remote_id, code", [
    (" cus_padded", "reconcile_evidence_missing"),
    ("cus_\x00nul", "reconcile_evidence_missing"),
    ("cus_" + "x" * 400, "invalid_identity"),
    ("cus_\u200bzero_width", "invalid_identity"),
    ("cus_\udcffsurrogate", "invalid_identity"),
])
def test_operator_confirmation_with_a_non_canonical_remote_id_writes_nothing(org, billing_sandbox, remote_id, code):
    effect = _uncertain(billing_sandbox)
    before = _effect_facts()
    with pytest.raises(NexusError) as refused:  # EffectOperationRefused, or InvalidIdentity from the link write
        effect_reconcile(org_id=ORG, effect_id=effect.pk, outcome="confirmed", remote_id=remote_id, actor="ops",
                         note="seen in dashboard")
    assert refused.value.code == code
    assert _effect_facts() == before


def test_operator_cannot_link_another_records_remote_id_or_touch_another_orgs_effect(org, billing_sandbox):
    other = _push("other@x.io")
    drain()
    taken = RemoteLink.objects.get(link_key=other.link_key).remote_id
    effect = _uncertain(billing_sandbox, "mine@x.io")
    [mine] = [c["id"] for c in billing_sandbox.state()["customers"] if c["email"] == "mine@x.io"]
    before = _effect_facts()
    with pytest.raises(CommandError, match="^remote_id_conflict"):
        _run("effects", "reconcile", str(effect.pk), "--org", ORG, "--confirmed", taken, "--actor", "ops",
             "--note", "wrong customer")
    for args in (["reconcile", str(effect.pk), "--org", OTHER_ORG, "--confirmed", mine, "--actor", "ops", "--note", "n"],
                 ["reconcile", str(effect.pk), "--org", OTHER_ORG, "--no-effect", "--actor", "ops", "--note", "n"],
                 ["quarantine", str(effect.pk), "--org", OTHER_ORG, "--actor", "ops", "--note", "n"],
                 ["show", str(effect.pk), "--org", OTHER_ORG]):
        with pytest.raises(CommandError, match="^effect_unknown"):
            _run("effects", *args)
    assert _run("effects", "list", "--org", OTHER_ORG) == "0 effect(s)\n"
    assert _effect_facts() == before
    _run("effects", "reconcile", str(effect.pk), "--org", ORG, "--confirmed", mine, "--actor", "ops", "--note", "ok")
    drain()
    assert RemoteEffect.objects.get(pk=effect.pk).state == "finalized"
    assert sorted(c["create_requests"] for c in billing_sandbox.state()["customers"]) == [1, 1]


def test_operator_confirmation_of_an_uncertain_update_must_name_the_linked_id(org, billing_sandbox):
    first = _push("upd@x.io")
    drain()
    [customer] = billing_sandbox.state()["customers"]
    update = author(first.source_record_key, "push", root="root-update", email="upd@new.io")
    assert outbox_try_deliver_one()
    billing_sandbox.set_faults(drop_response_after_commit=1)
    assert egress.effect_try_dispatch_one(worker_id="w1")
    effect = RemoteEffect.objects.get(command=update)
    assert effect.state == "uncertain" and effect.attempts.get().operation == "update"
    before = _effect_facts()
    with pytest.raises(EffectOperationRefused) as refused:
        effect_reconcile(org_id=ORG, effect_id=effect.pk, outcome="confirmed", remote_id="cus_someone_else",
                         actor="ops", note="n")
    assert refused.value.code == "remote_id_conflict" and _effect_facts() == before
    effect_reconcile(org_id=ORG, effect_id=effect.pk, outcome="confirmed", remote_id=customer["id"], actor="ops",
                     note="dashboard shows the new email")
    drain()
    assert RemoteEffect.objects.get(pk=effect.pk).state == "finalized"
    assert RemoteLink.objects.count() == 1
    assert billing_sandbox.state()["customers"][0]["create_requests"] == 1


# === A6: revocation with several pre-I/O Permits; revoke / re-enable storm while three dispatchers race =======
def test_revocation_closes_every_granted_permit_in_one_lock_order(org, billing_sandbox):
    """Two workers each hold a ``granted`` Permit when the credential is revoked: revocation must
    close both (it locked them Permit by Permit: effect 2 after attempt 1, a lock-order reversal)."""
    _push("one@x.io")
    _push("two@x.io")
    grants = [egress.permit_try_grant_one(worker_id="w1"), egress.permit_try_grant_one(worker_id="w2")]
    assert None not in grants
    gate = _credential_gate()
    change = credential_revoke(org_id=ORG, credential_generation_id=gate.credential_generation_id, actor="ops",
                               note="leaked")
    assert sorted(change.closed_permits) == sorted(int(g.permit_id) for g in grants)
    assert set(DispatchPermit.objects.values_list("state", flat=True)) == {"abandoned"}
    assert set(RemoteEffect.objects.values_list("state", flat=True)) == {"prepared"}
    assert RemoteEffectEvidence.objects.filter(kind="credential_revoked").count() == 2
    assert [egress.permit_send(g) for g in grants] == [None, None]
    credential_reenable(org_id=ORG, credential_generation_id=gate.credential_generation_id, actor="ops")
    drain()
    assert sorted(c["create_requests"] for c in billing_sandbox.state()["customers"]) == [1, 1]


# === A6: revoke / re-enable storm while three dispatchers race ================================================
def test_credential_revoke_reenable_storm_never_lets_a_stale_fence_send(org, billing_sandbox):
    """No Permit may reach ``sending`` under a fence at which the credential gate was revoked, every
    pre-I/O Permit closed by revocation carries its proof, and no create is sent twice."""
    commands = [_push(f"storm{n}@x.io") for n in range(4)]
    gate = _credential_gate()
    enabled_parity = gate.fence_token % 2
    billing_sandbox.set_faults(delay_seconds=0.05)  # widen the window between sending and settlement
    stop = threading.Event()
    errors: list[BaseException] = []

    def dispatcher(n: int):
        def loop():
            while not stop.is_set():
                try:
                    egress.effect_try_dispatch_one(worker_id=f"storm-{n}")
                    egress.effect_try_finalize_one()
                except OperationalError as exc:
                    if exc.args[0] not in (1205, 1213):  # a deadlock victim retries; anything else is a bug
                        errors.append(exc)
                except Exception as exc:
                    errors.append(exc)
        return loop

    def storm():
        for n in range(12):
            credential_revoke(org_id=ORG, credential_generation_id=gate.credential_generation_id, actor="ops",
                              note=f"storm {n}")
            time.sleep(0.03)
            credential_reenable(org_id=ORG, credential_generation_id=gate.credential_generation_id, actor="ops")
            time.sleep(0.03)
        return True

    workers = [Worker(dispatcher(n), f"dispatch-{n}") for n in range(3)]
    toggler = Worker(storm, "storm")
    for worker in [*workers, toggler]:
        worker.start()
    toggler.join(120)
    stop.set()
    for worker in workers:
        worker.join(60)
    assert toggler.error is None and toggler.result is True
    assert not errors and all(w.error is None for w in workers), errors
    billing_sandbox.set_faults(delay_seconds=0)
    zero_backoff(outbox=True)
    drain()

    assert _credential_gate().state == "enabled"
    for permit in DispatchPermit.objects.all():
        assert permit.state in ("returned", "abandoned"), permit.state
        if permit.io_may_have_started_at is not None:
            assert permit.credential_fence_token % 2 == enabled_parity, "a Permit sent under a revoked fence"
        if permit.state == "abandoned":
            assert permit.io_may_have_started_at is None
            assert permit.closed_evidence["proof"] in ("credential_revoked_before_sending",
                                                       "holder_released_before_sending")
    assert {RemoteEffect.objects.get(command=c).state for c in commands} == {"finalized"}
    customers = billing_sandbox.state()["customers"]
    assert sorted(c["email"] for c in customers) == sorted(f"storm{n}@x.io" for n in range(4))
    assert all(c["create_requests"] == 1 for c in customers), customers


def test_a_deadlock_on_the_sending_transition_closes_the_permit_instead_of_leaking_it(org, billing_sandbox,
                                                                                     monkeypatch):
    """A ``granted -> sending`` transaction chosen as deadlock victim sends nothing; its holder closes
    the Permit (proof ``holder_released_before_sending``) so the effect is granted afresh, instead of
    staying ``granted`` until the worker process ends."""
    command = _push()
    real_hit = egress.failpoints.hit
    fired = []

    def deadlock_once(name):
        if name == egress.FP_SENDING_BEFORE_COMMIT and not fired:
            fired.append(name)
            raise OperationalError(1213, "Deadlock found when trying to get lock")
        real_hit(name)

    monkeypatch.setattr(egress.failpoints, "hit", deadlock_once)
    grant = egress.permit_try_grant_one(worker_id="w1")
    assert egress.permit_send(grant) is None
    permit = DispatchPermit.objects.get(pk=grant.permit_id)
    assert permit.state == "abandoned" and permit.io_may_have_started_at is None
    assert permit.closed_evidence["proof"] == "holder_released_before_sending"
    assert RemoteEffect.objects.get(command=command).state == "prepared"
    assert billing_sandbox.state()["requests"] == 0
    drain()
    assert RemoteEffect.objects.get(command=command).state == "finalized"
    assert billing_sandbox.state()["requests"] == 1


# === A7: two holders race one grant; operator races the exact-repeat reconciler ================================
def test_eight_threads_presenting_one_grant_cross_the_boundary_once(org, billing_sandbox):
    _push()
    grant = egress.permit_try_grant_one(worker_id="w1")
    barrier = threading.Barrier(8)

    def send():
        barrier.wait(30)
        return egress.permit_send(grant)

    senders = [Worker(send, f"send-{n}") for n in range(8)]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join(60)
    assert [s.error for s in senders] == [None] * 8
    responses = [s.result for s in senders if s.result is not None]
    assert len(responses) == 1 and responses[0].status == 200
    assert billing_sandbox.state()["requests"] == 1
    assert egress.permit_settle(grant, responses[0]) == "remote_confirmed"
    with pytest.raises(StaleVersion):  # a second settlement is fenced
        egress.permit_settle(grant, responses[0])
    assert DispatchPermit.objects.get().state == "returned"


def test_operator_no_effect_racing_the_exact_repeat_reconciler_decides_once(org, billing_sandbox):
    effect = _uncertain(billing_sandbox)
    zero_backoff(outbox=True)
    reconciler = Worker(egress.effect_try_reconcile_one, "reconciler")
    operator = Worker(lambda: effect_reconcile(org_id=ORG, effect_id=effect.pk, outcome="no_effect", actor="ops",
                                               note="provider says nothing happened"), "operator")
    with transaction.atomic():
        RemoteEffectStore.lock(ORG, effect.pk)  # both queue behind this row lock, decisions already read
        reconciler.start()
        assert reconciler.ready.wait(60)
        wait_until_blocked_on(reconciler.connection_id, EFFECT_TABLE)
        operator.start()
        assert operator.ready.wait(60)
        wait_until_blocked_on(operator.connection_id, EFFECT_TABLE)
    reconciler.join(60)
    operator.join(60)
    assert reconciler.error is None
    final = RemoteEffect.objects.get(pk=effect.pk)
    evidence = list(RemoteEffectEvidence.objects.filter(effect=effect).values_list("kind", "to_state"))
    if operator.error is None:  # the operator won: terminal, the reconciler stood down
        assert (final.state, evidence) == ("no_effect", [("operator_no_effect", "no_effect")])
    else:  # the reconciler won: the operator is refused and wrote nothing
        assert getattr(operator.error, "code", None) == "effect_not_uncertain"
        assert (final.state, evidence) == ("prepared", [("exact_repeat", "prepared")])
    drain()
    assert [c["create_requests"] for c in billing_sandbox.state()["customers"]] in ([1], [2])
    assert len(billing_sandbox.state()["customers"]) == 1


# === A8: kill a real egress worker after settlement; halt with a killed pre-I/O holder =========================
def test_worker_killed_after_settle_finalizes_without_a_second_call(org, billing_sandbox):
    command = _push()
    crashed = run_manage(["run_workers", "--role", "egress"], subprocess_env(NEXUS_FAILPOINTS="effect.after_settle"),
                         timeout=60)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert RemoteEffect.objects.get(command=command).state == "remote_confirmed"
    assert DispatchPermit.objects.get().state == "returned"
    restarted = run_manage(["run_workers", "--role", "egress", "--until-idle"], subprocess_env(), timeout=120)
    assert restarted.returncode == 0, restarted.stderr
    assert RemoteEffect.objects.get(command=command).state == "finalized"
    assert IntentResultReceipt.objects.get(command=command).outcome == "finalized"
    assert [c["create_requests"] for c in billing_sandbox.state()["customers"]] == [1]
    assert billing_sandbox.state()["requests"] == 1


def test_halt_waits_for_a_killed_holders_granted_permit_then_the_effect_resumes(org, billing_sandbox, tmp_path):
    from connectors.serving.handoff import halt_begin, halt_try_complete

    command = _push()
    env = subprocess_env(NEXUS_FAILPOINTS="permit.after_grant=pause", NEXUS_FAILPOINT_DIR=str(tmp_path))
    holder = subprocess.Popen([sys.executable, "manage.py", "run_workers", "--role", "egress"], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob("permit.after_grant.*")):
            assert time.monotonic() < deadline and holder.poll() is None, "the holder never reached its grant"
            time.sleep(0.05)
        halt_begin(org=OrgScope(ORG))
        assert halt_try_complete(org=OrgScope(ORG)).gates["billing-main"][0] == "halting_v2"
        assert egress.permit_try_abandon_one() is False  # the holder lives: its Permit stays open
    finally:
        holder.kill()
        holder.wait(30)
    assert halt_try_complete(org=OrgScope(ORG)).gates["billing-main"][0] == "halting_v2"
    assert egress.permit_try_abandon_one() is True
    permit = DispatchPermit.objects.get()
    assert (permit.state, permit.io_may_have_started_at) == ("abandoned", None)
    assert permit.closed_evidence["proof"] == "pid_absent"
    assert RemoteEffect.objects.get(command=command).state == "prepared"
    # Halting: no new Permit may be granted, so nothing is sent.
    assert egress.permit_try_grant_one(worker_id="w1") is None
    assert billing_sandbox.state()["requests"] == 0
