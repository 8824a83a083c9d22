"""Attacks on the seed 002 push protocol (seed 002 "Attempt Key", "Before PATCH", "Remote Link State",
"2026-07-22 Finalized Mapping Revalidation CARVE_DOWN"; ARCHITECTURE.md section 6 "Lock order").

Every race runs real concurrent MariaDB transactions: an operator decision on a link
(retire, rebind, mapping revalidation) is held open at a row lock or a ``hold``
failpoint while a dispatcher grants a Permit for an effect that was delivered after
the decision looked at the link key's effects. The sandboxes count every request,
so a second create or a PATCH through a retired link is visible. Operator input
attacks run the real ``manage.py`` commands in a child process.
"""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest
from django.db import connection, transaction

from connectors import reasons
from connectors.links.link_decisions import link_rebind, link_retire
from connectors.links.mapping_revalidation import Applied, revalidation_apply, revalidation_draft
from connectors.models import (
    DispatchPermit,
    PackGeneration,
    PushLinkRevalidationReceipt,
    RemoteEffect,
    RemoteLink,
    RemoteLinkEvidence,
    ServingEpoch,
)
from connectors.outbound import egress
from connectors.outbound.effect_decisions import effect_reconcile
from nexusflow.kernel.scope import OrgScope
from runtime_outbox.models import OutboundCommand
from runtime_outbox.services import outbox_try_deliver_one
from tests.concurrency import LOCKING_READS, Worker, wait_until_blocked_on
from tests.conftest import ORG, ROOT, drain, make_serving_org, subprocess_env
from tests.connectors import push_helpers
from tests.connectors.push_helpers import BILLING, BILLING_ACCOUNT, contract_of
from tests.kits.outbound import author
from tests.kits.records import customer_contact

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

CONTRACT = "billing.customer"
LINK_TABLE = "connectors_remotelink"


@pytest.fixture
def org(billing_sandbox) -> OrgScope:
    return make_serving_org(billing_sandbox.base_url, deploy_flow=False)




# --- helpers ------------------------------------------------------------------------------------------------
def _save(record_key: str, **changes) -> OutboundCommand:
    """A save whose intent is delivered: its RemoteEffect is ``prepared``."""
    command = author(record_key, **changes)
    assert outbox_try_deliver_one()
    return command


def _linked(email: str = "ann@x.io") -> tuple[str, RemoteLink]:
    key = customer_contact(email, firstname="Ann", lastname="Lee").record_key
    command = _save(key)
    drain()
    return key, RemoteLink.objects.get(org_id=ORG, link_key=command.link_key)


def _effect(command: OutboundCommand) -> RemoteEffect:
    return RemoteEffect.objects.get(command=command)


def _permits(effect: RemoteEffect) -> int:
    return DispatchPermit.objects.filter(org_id=ORG, attempt__effect_id=effect.pk).count()


class RowLock:
    """Hold a row lock in its own transaction (own connection) until released."""

    def __init__(self, model, pk):
        self._release, self._held = threading.Event(), threading.Event()

        def hold():
            with transaction.atomic():
                model.objects.select_for_update().get(pk=pk)
                self._held.set()
                assert self._release.wait(120), "the row lock was never released"

        self.worker = Worker(hold, f"hold-{model.__name__}-{pk}")
        self.worker.start()
        assert self._held.wait(60)

    def release(self) -> None:
        self._release.set()
        self.worker.join(60)
        assert self.worker.error is None, self.worker.error


def _done_or_lock_waiting(worker: Worker, timeout: float = 60) -> str:
    """Wait until ``worker`` has finished (``"done"``) or waits in a locking read (``"waiting"``).

    A locking read seen in three polls in a row (40 ms apart) is queued behind a row lock.
    """
    assert worker.ready.wait(timeout)
    deadline, seen = time.monotonic() + timeout, 0
    while worker.is_alive():
        with connection.cursor() as cursor:
            cursor.execute("SELECT INFO FROM information_schema.PROCESSLIST WHERE ID = %s", [worker.connection_id])
            row = cursor.fetchone()
        seen = seen + 1 if row and row[0] and any(mark in row[0] for mark in LOCKING_READS) else 0
        if seen >= 3:
            return "waiting"
        assert time.monotonic() < deadline, f"{worker.name} neither finished nor waited for a lock"
        time.sleep(0.02)
    return "done"


def _grant_worker() -> Worker:
    worker = Worker(lambda: egress.permit_try_grant_one(worker_id="attacker"), "grant")
    worker.start()
    return worker


def _join(*workers: Worker) -> None:
    for worker in workers:
        worker.join(60)
        assert not worker.is_alive(), f"{worker.name} is stuck"


def _second_billing_slot(env) -> None:
    """Serve a second billing contract for Contact under its own stable slot, beside the first one."""
    def add_contract(doc):
        extra = json.loads(json.dumps(contract_of(doc, BILLING)))
        extra.update(contract_key="billing.customer.v2", action_slot_id="slot.push.customer.v2",
                     destination_slot_id="dest.billing.customer.v2")
        doc["push_contracts"].append(extra)

    def offer_both(account):
        account["push_contracts"] = [BILLING, "billing.customer.v2"]

    push_helpers.reconfigure(env, add_contract, account_key=BILLING_ACCOUNT, configure=offer_both)


def _finish(grant) -> None:
    """Send and settle a Permit granted in a worker thread, then drain everything else."""
    if grant is not None:
        egress.permit_settle(grant, egress.permit_send(grant))
    drain()


# === P1: a retire racing a PATCH grant =================================================================
def test_a_retire_racing_a_patch_grant_never_leaves_a_patch_in_flight_through_the_retired_link(org, billing_sandbox):
    """Seed 002 "Remote Link State": ``retired`` is never eligible for runtime send.

    The retire locks the link key's effects, then its link; an effect delivered after
    that first lock is invisible to it. A grant that plans the PATCH from an unlocked
    read of the link, while the retire waits for the link row, sends through a link
    the retire then ends.
    """
    key, link = _linked()
    command = author(key, lastname="Park")  # authored before, delivered after the retire locked the key's effects
    row = RowLock(RemoteLink, link.pk)  # the retire queues behind this lock, after its effect locks
    retire = Worker(lambda: link_retire(org_id=ORG, link_key=link.link_key, actor="ops", reason="merged"), "retire")
    retire.start()
    assert retire.ready.wait(60)
    wait_until_blocked_on(retire.connection_id, LINK_TABLE)
    assert outbox_try_deliver_one() and _effect(command).state == "prepared"
    grant = _grant_worker()
    _done_or_lock_waiting(grant)
    row.release()
    _join(retire, grant)
    assert grant.error is None, grant.error

    link.refresh_from_db()
    effect = _effect(command)
    if link.state == "retired":
        assert _permits(effect) == 0, "a PATCH was granted through a link retired before it was sent"
        assert retire.error is None and grant.result is None
        assert (effect.state, effect.reason_code) == ("quarantined", reasons.LINK_NOT_PATCHABLE)
    else:  # the grant won the link: the retire must see the effect in flight and refuse
        assert getattr(retire.error, "code", None) == "slot_occupied", retire.error
        assert link.state == "active" and grant.result is not None
    _finish(grant.result)
    [customer] = billing_sandbox.state()["customers"]
    assert customer["update_requests"] == (0 if link.state == "retired" else 1)


def _decide(decision: str, link: RemoteLink):
    if decision == "retire":
        return lambda: link_retire(org_id=ORG, link_key=link.link_key, actor="ops", reason="merged")
    return lambda: link_rebind(org_id=ORG, link_key=link.link_key, contract_key="billing.customer.v2", actor="ops",
                               reason="slot recreated")


@pytest.mark.parametrize("decision", ["retire", "rebind"])
def test_a_link_decision_paused_after_its_effect_locks_sees_a_patch_granted_meanwhile(
        billing_sandbox, hubspot_crm_sandbox, holds, decision):
    """The other interleaving of P1: the grant takes the link row before the decision does.

    The decision has locked the key's effects (the new effect is not among them) and
    is paused before its link lock; the grant locks effect and link and commits. The
    decision must then see the effect in flight instead of ending the link beneath it.
    """
    env = push_helpers.push_env(billing_sandbox, hubspot_crm_sandbox)
    record = push_helpers.contact("paused@x.io")
    push_helpers.save(record, contract=BILLING)
    drain()
    link = push_helpers.push_link(record, BILLING)
    if decision == "rebind":
        _second_billing_slot(env)
    command = push_helpers.save(record, contract=BILLING, deliver=False, lastname="Park")
    holds.arm("push_links.after_effect_locks")
    decide = Worker(_decide(decision, link), decision)
    decide.start()
    marker = holds.wait_held("push_links.after_effect_locks")
    assert outbox_try_deliver_one() and _effect(command).state == "prepared"
    grant = _grant_worker()
    _done_or_lock_waiting(grant)
    holds.release(marker)
    _join(decide, grant)
    assert grant.error is None, grant.error

    link.refresh_from_db()
    effect = _effect(command)
    if link.state == "retired":
        assert _permits(effect) == 0, f"a PATCH was granted through a link the {decision} ended"
        assert decide.error is None and grant.result is None
        assert (effect.state, effect.reason_code) == ("quarantined", reasons.LINK_NOT_PATCHABLE)
    else:
        assert getattr(decide.error, "code", None) == "slot_occupied", decide.error
        assert link.state == "active" and grant.result is not None
    _finish(grant.result)
    [customer] = billing_sandbox.state()["customers"]
    assert customer["update_requests"] == (0 if link.state == "retired" else 1)


# === P2: a rebind racing a create grant on the new link key ====================================================
def test_a_rebind_racing_a_create_grant_on_the_new_link_key_never_makes_a_second_remote_record(
        billing_sandbox, hubspot_crm_sandbox, holds):
    """Seed 002 "Attempt Key" / "Before POST": a finalized link for the key forbids a POST.

    The rebind checks the new key's effects and link, then inserts the new link; a
    create grant for that key looks for a link without any lock the rebind holds
    (there is no link row to lock yet). Held before its commit, the rebind lets the
    grant reserve a POST for the key it is about to link to the old remote record.
    """
    env = push_helpers.push_env(billing_sandbox, hubspot_crm_sandbox)
    record = push_helpers.contact("rebind@x.io")
    push_helpers.save(record, contract=BILLING)
    drain()
    old = push_helpers.push_link(record, BILLING)
    _second_billing_slot(env)

    # Authored first (authoring locks the account's serving gate), delivered while the rebind is held.
    command = push_helpers.save(record, contract="billing.customer.v2", deliver=False, lastname="Second")
    holds.arm("push_links.rebind_before_commit")
    rebind = Worker(lambda: link_rebind(org_id=ORG, link_key=old.link_key, contract_key="billing.customer.v2",
                                        actor="ops", reason="slot recreated"), "rebind")
    rebind.start()
    marker = holds.wait_held("push_links.rebind_before_commit")
    assert outbox_try_deliver_one() and _effect(command).state == "prepared"
    grant = _grant_worker()
    _done_or_lock_waiting(grant)
    holds.release(marker)
    _join(rebind, grant)
    assert rebind.error is None and grant.error is None, (rebind.error, grant.error)
    _finish(grant.result)

    customers = billing_sandbox.state()["customers"]
    assert len(customers) == 1 and customers[0]["create_requests"] == 1, customers
    new = RemoteLink.objects.get(org_id=ORG, link_key=command.link_key)
    assert (new.state, new.remote_id) == ("active", old.remote_id)
    effect = _effect(command)
    assert effect.state == "finalized" and [a.operation for a in effect.attempts.all()] == ["update"]
    assert customers[0]["name"] == "Rebind Second"


# === P3: a mapping revalidation apply racing a grant ============================================================
def _mapping_pack(serve: bool = True) -> PackGeneration:
    """Publish the billing pack with a reordered ``name`` mapping; ``serve``: switch the org to it (a
    revalidation applies only the fingerprints the org serves)."""
    from connectors.serving.generations import pack_publish
    from tests.connectors.links.test_push_revalidation import _serve_newest_pack

    document = json.loads((ROOT / "packs" / "billing" / "pack.json").read_text(encoding="utf-8"))
    document["version"] += "-mapping-attack"
    contract = document["push_contracts"][0]
    contract["mapping"] = [entry if entry["target"] != "name" else
                           {"target": "name", "source": ["lastname", "firstname"], "join": ", "}
                           for entry in contract["mapping"]]
    pack = pack_publish(document=document)[0]
    if serve:
        epoch = ServingEpoch.objects.get(org_id=ORG, state="active")
        billing = next(a for a in epoch.document["accounts"] if a["account_key"] == "billing-main")
        _serve_newest_pack(OrgScope(ORG), billing["base_url"])
    return pack


def test_a_revalidation_apply_racing_a_grant_decides_the_patch_on_the_committed_fingerprints(
        org, billing_sandbox, holds):
    """Seed 002 CARVE_DOWN invariant 3 and "Before PATCH": a grant decides on the link row it holds.

    The new mapping serves; the apply holds the member's link locked. A save's PATCH (frozen
    under the serving mapping) is granted while the apply is open: it must wait for the link
    row and decide on the committed fingerprints (PATCH once, after the receipts), never on
    an unlocked read of the old ones (which would refuse it ``mapping_drift``, or send beside
    an apply that then commits).
    """
    key, link = _linked()
    manifest = revalidation_draft(org=org, contract_key=CONTRACT, approved_by="mapping-owner", reason="reorder",
                                  pack_generation_id=_mapping_pack().pk, operation_id="op-race")
    holds.arm("revalidation.apply_before_commit")
    apply = Worker(lambda: revalidation_apply(org=org, manifest=manifest), "apply")
    apply.start()
    marker = holds.wait_held("revalidation.apply_before_commit")
    command = _save(key, lastname="Old-Mapping")  # frozen under the serving (old) mapping
    grant = _grant_worker()
    _done_or_lock_waiting(grant)
    holds.release(marker)
    _join(apply, grant)
    assert apply.error is None and grant.error is None, (apply.error, grant.error)

    assert isinstance(apply.result, Applied)
    link.refresh_from_db()
    assert link.last_mapping_revalidation_id == PushLinkRevalidationReceipt.objects.get(operation_id="op-race").pk
    _finish(grant.result)
    effect = _effect(command)
    assert effect.reason_code != reasons.MAPPING_DRIFT, "the grant decided on the uncommitted (old) fingerprints"
    assert _permits(effect) == 1 and effect.state in ("remote_confirmed", "finalized")
    assert billing_sandbox.state()["customers"][0]["update_requests"] == 1


# === P1 under a crash: the grant holding the link row is killed ================================================
def test_a_worker_killed_while_its_grant_holds_the_link_releases_it_and_no_patch_leaks(
        org, billing_sandbox, tmp_path):
    """A real ``run_workers --role egress`` is paused inside its grant transaction (effect and link
    rows locked) while a retire queues behind it; killing the worker rolls the grant back, the
    retire ends the link, and the restarted worker parks the effect without a request."""
    key, link = _linked("killed@x.io")
    command = _save(key, lastname="Park")
    env = subprocess_env(NEXUS_FAILPOINTS="permit.grant_before_commit=pause", NEXUS_FAILPOINT_DIR=str(tmp_path))
    worker = subprocess.Popen([sys.executable, "manage.py", "run_workers", "--role", "egress"], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    retire = None
    try:
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob("permit.grant_before_commit.*")):
            assert time.monotonic() < deadline and worker.poll() is None, "the worker never reached its grant"
            time.sleep(0.05)
        retire = Worker(lambda: link_retire(org_id=ORG, link_key=link.link_key, actor="ops", reason="merged"),
                        "retire")
        retire.start()
        assert _done_or_lock_waiting(retire) == "waiting"
    finally:
        worker.kill()
        worker.wait(30)
    _join(retire)
    assert retire.error is None, retire.error
    link.refresh_from_db()
    assert link.state == "retired" and not DispatchPermit.objects.filter(org_id=ORG, attempt__effect__command=command)
    restarted = subprocess.run([sys.executable, "manage.py", "run_workers", "--role", "egress", "--until-idle"],
                               cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert restarted.returncode == 0, restarted.stderr
    effect = _effect(command)
    assert (effect.state, effect.reason_code, _permits(effect)) == ("quarantined", reasons.LINK_NOT_PATCHABLE, 0)
    [customer] = billing_sandbox.state()["customers"]
    assert (customer["create_requests"], customer["update_requests"]) == (1, 0)


# === P4: the older-version supersede rule after an operator-confirmed update ===================================
def test_an_operator_confirmed_update_supersedes_a_late_delivered_older_version(org, billing_sandbox):
    """Seed 002 "Before PATCH" / ARCHITECTURE.md section 4: the remote never goes back to an older version.

    A newer version's PATCH whose response was lost is confirmed by an operator; an
    older version delivered late must then be superseded, as it is after a PATCH the
    provider confirmed directly.
    """
    key, link = _linked("late@x.io")
    older = author(key, lastname="Older")
    newer = author(key, lastname="Newer")
    with connection.cursor() as cursor:  # the older version's delivery failed once and backs off
        cursor.execute("UPDATE runtime_outbox_outboxmessage SET next_attempt_at = NOW() + INTERVAL 1 HOUR "
                       "WHERE command_id = %s", [older.pk])
    assert outbox_try_deliver_one()
    billing_sandbox.set_faults(drop_response_after_commit=1)
    assert egress.effect_try_dispatch_one(worker_id="w1")
    effect = _effect(newer)
    assert effect.state == "uncertain"
    assert billing_sandbox.state()["customers"][0]["name"] == "Ann Newer"
    effect_reconcile(org_id=ORG, effect_id=effect.pk, outcome="confirmed", remote_id=link.remote_id, actor="ops",
                     note="the customer shows the newer name")
    assert egress.effect_try_finalize_one()

    with connection.cursor() as cursor:
        cursor.execute("UPDATE runtime_outbox_outboxmessage SET next_attempt_at = NULL")
    drain()
    late = _effect(older)
    assert (late.state, late.reason_code) == ("quarantined", reasons.SUPERSEDED_BY_NEWER_VERSION)
    [customer] = billing_sandbox.state()["customers"]
    assert customer["name"] == "Ann Newer", "the remote went back to an older record version"
    assert customer["update_requests"] == 1 and not late.attempts.exists()
    link.refresh_from_db()
    assert link.last_pushed_version == newer.source_record_version


# === P5: bad operator input to the push link commands ===========================================================
def _manage(*args, stdin: bytes | None = None) -> tuple[int, str, str]:
    """Run ``manage.py`` in a child process; arguments may be raw bytes (an operator's shell passes bytes)."""
    done = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=subprocess_env(), input=stdin,
                          capture_output=True, timeout=120)
    return done.returncode, done.stdout.decode("utf-8", "replace"), done.stderr.decode("utf-8", "replace")


def _link_facts() -> tuple:
    return (sorted(RemoteLink.objects.values_list("id", "state", "version", "remote_id", "live_remote_id")),
            RemoteLinkEvidence.objects.count(), PushLinkRevalidationReceipt.objects.count())


def test_a_malformed_manifest_exits_with_a_stable_code_and_writes_nothing(org, billing_sandbox, tmp_path):
    """``push_link_revalidation validate|apply``: a manifest that cannot be read as bounded UTF-8 JSON is
    ``manifest_unreadable`` / ``manifest_too_large`` (exit 1), never a traceback, never a write."""
    from connectors.links.mapping_revalidation import MAX_MANIFEST_BYTES

    _linked()
    manifest = revalidation_draft(org=org, contract_key=CONTRACT, approved_by="mapping-owner", reason="reorder",
                                  pack_generation_id=_mapping_pack().pk, operation_id="op-bad-input")
    text = json.dumps(manifest).encode("utf-8")
    cases = {
        "not UTF-8": (text.replace(b'"reorder"', b'"re\xfforder"'), "manifest_unreadable"),
        "nested past the parser's depth": (b"[" * 200_000 + b"]" * 200_000, "manifest_unreadable"),
        "larger than the bound": (text + b" " * (MAX_MANIFEST_BYTES + 1 - len(text)), "manifest_too_large"),
    }
    before = _link_facts()
    for case, (content, code) in cases.items():
        path = tmp_path / "manifest.json"
        path.write_bytes(content)
        for subcommand, args, stdin in (("validate", ["--manifest", str(path)], None),
                                        ("apply", ["--manifest", "-"], content)):
            rc, _out, err = _manage("push_link_revalidation", subcommand, "--org", ORG, *args, stdin=stdin)
            assert (rc, err.startswith(f"CommandError: {code}:")) == (1, True), (case, subcommand, rc, err)
        assert _link_facts() == before, case
    # A draft whose approval is not UTF-8 text cannot even be sealed: refused with the manifest's own code.
    for option in ("--approved-by", "--operation-id"):
        rc, out, err = _manage("push_link_revalidation", "draft", "--org", ORG, "--contract", CONTRACT,
                               "--approved-by", "owner", "--reason", "reorder", option, b"bad\xff")
        assert (rc, err.startswith("CommandError: manifest_not_canonical:"), out) == (1, True, ""), (option, err)
    assert _link_facts() == before
    # The bounded, well-formed manifest still applies.
    path.write_bytes(text)
    rc, out, err = _manage("push_link_revalidation", "apply", "--org", ORG, "--manifest", str(path))
    assert rc == 0 and out.startswith("applied: operation op-bad-input"), err


def test_a_link_decision_with_malformed_actor_or_reason_exits_with_a_stable_code_and_writes_nothing(
        org, billing_sandbox):
    """``push_links retire|revalidate|rebind``: actor and reason are evidence text: a control
    character, invalid UTF-8 or an actor longer than the evidence column is refused before any write."""
    key, link = _linked()
    before = _link_facts()
    cases = {
        "actor with a control character": ("ops\x1b[2J", "merged"),
        "actor not UTF-8": (b"ops\xff", "merged"),
        "actor longer than the evidence column": ("o" * 121, "merged"),
        "reason not UTF-8": ("ops", b"merged \xfe"),
        "reason with a control character": ("ops", "merged\x07"),
    }
    decisions = (["retire"], ["revalidate"], ["rebind", "--contract", CONTRACT])
    for n, (case, (actor, reason)) in enumerate(cases.items()):
        decision = decisions[n % len(decisions)]
        rc, _out, err = _manage("push_links", decision[0], link.link_key, "--org", ORG, *decision[1:],
                                "--actor", actor, "--reason", reason)
        assert (rc, err.startswith("CommandError: link_evidence_invalid:")) == (1, True), (case, decision, err)
        assert _link_facts() == before, case
    # A read with a record filter that is not canonical text is bad usage too, not a traceback.
    rc, _out, err = _manage("push_links", "list", "--org", ORG, "--record", b"Contact/" + key.encode() + b"\xff")
    assert rc == 2 and err.startswith("CommandError: invalid_identity:"), err
    rc, out, err = _manage("push_links", "retire", link.link_key, "--org", ORG, "--actor", "ops",
                           "--reason", "merged remotely")
    assert rc == 0 and "active -> retired" in out, err


def test_a_rebind_onto_a_contract_of_another_remote_scope_is_refused_and_writes_nothing(
        billing_sandbox, hubspot_crm_sandbox):
    """A remote id names a record of one remote system (the link's ``remote_scope``, its account).

    Rebinding a CRM contact link onto the billing contract (same source object, another
    account) would make the next billing save PATCH ``/v1/customers/<CRM contact id>``:
    a record of another system, or an unrelated customer whose id happens to match.
    """
    env = push_helpers.push_env(billing_sandbox, hubspot_crm_sandbox)
    record = push_helpers.contact("scope@x.io")
    push_helpers.save(record)
    drain()
    link = push_helpers.push_link(record)
    assert link.remote_scope == "hubspot-crm"
    before = _link_facts()
    rc, _out, err = _manage("push_links", "rebind", link.link_key, "--org", ORG, "--contract", BILLING,
                            "--actor", "ops", "--reason", "moved to billing")
    assert (rc, err.startswith("CommandError: rebind_scope_mismatch:")) == (1, True), err
    assert _link_facts() == before
    # The billing slot of the record is still unlinked: its first save creates the customer.
    push_helpers.save(record, contract=BILLING)
    drain()
    [customer] = billing_sandbox.state()["customers"]
    assert (customer["create_requests"], customer["update_requests"]) == (1, 0)
    assert billing_sandbox.state()["requests"] == 1 and env.posts() == 1


# === P6: an ambiguous create whose exact repeats are never performed is not proven no_effect ====================
def test_a_create_whose_first_post_was_ambiguous_is_never_proven_no_effect_by_repeats_that_were_not_performed(
        org, billing_sandbox):
    """Seed 002 "After POST": a POST that may have succeeded blocks every further create until an operator
    reconciles it; only a proven terminal ``no_effect`` may be superseded (ARCHITECTURE.md section 4).

    The first POST is committed by the provider and its response lost; every exact repeat is
    answered 409 (not performed, not a rate limit) until the frozen policy's Attempts run out. Those answers
    say nothing about the first POST, so the effect must not become ``no_effect`` and an
    operator successor must not be allowed to POST again.
    """
    from runtime_outbox.services import SuccessorRefused, outbound_command_author_successor

    key = customer_contact("ambiguous@x.io", firstname="Ann", lastname="Lee").record_key
    command = _save(key)
    billing_sandbox.set_faults(drop_response_after_commit=1)
    assert egress.effect_try_dispatch_one(worker_id="w1")
    assert _effect(command).state == "uncertain" and len(billing_sandbox.state()["customers"]) == 1
    billing_sandbox.set_faults(fail_before_commit={"status": 409, "count": 100})
    for _ in range(20):
        with connection.cursor() as cursor:
            cursor.execute("UPDATE connectors_remoteeffect SET next_attempt_at = NULL")
        if not (egress.effect_try_reconcile_one() or egress.effect_try_dispatch_one(worker_id="w1")):
            break
    effect = _effect(command)
    assert effect.state != "no_effect", f"an ambiguous create was declared no_effect ({effect.reason_code})"
    assert effect.state in ("uncertain", "quarantined")
    with pytest.raises(SuccessorRefused):
        outbound_command_author_successor(org_id=ORG, predecessor_command_id=command.pk, actor="ops",
                                          reason="looks like nothing happened")
    billing_sandbox.set_faults(fail_before_commit={"status": 409, "count": 0})
    drain()
    assert len(billing_sandbox.state()["customers"]) == 1
