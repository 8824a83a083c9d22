"""Halt, OrderingHandoff, successor activation and predecessor resume (seed 003 "Generation and replay").

Every test runs on the real MariaDB against a serving org built by the
operator path (configuration generation + greenfield cutover); successors are
new configuration generations prepared and verified like any epoch. Races use
threads with their own connections and wait until the database reports the
second transaction blocked on the first one's row lock.
"""
from __future__ import annotations

import signal
import threading

import pytest

from connectors import reasons
from connectors.inbound.executions import execution_run, execution_try_claim_one, execution_try_run_one
from connectors.models import (
    AccountServingGate,
    DispatchPermit,
    Execution,
    GateTransitionEvidence,
    OrderingDecision,
    OrderingHandoff,
    OrderingLane,
    RemoteEffect,
    RemoteEffectAttempt,
    ServingEpoch,
)
from connectors.reasons import HALT_WAITING_OPEN_PERMITS, HALTED_FOR_SUCCESSOR
from connectors.serving import handoff
from connectors.serving.gates import epoch_prepare, epoch_verify, service_configuration_apply
from connectors.serving.handoff import (
    HaltRefused,
    HandoffRefused,
    OrderingContractChanged,
    ResumeRefused,
    TransitionClassUnsupported,
    halt_begin,
    halt_try_complete,
    handoff_stage,
    predecessor_resume,
    successor_activate,
)
from connectors.store import DispatchPermitStore, ExecutionStore, OrderingLaneStore, RemoteEffectStore
from nexusflow.kernel.scope import OrgScope
from nexusflow.records.models import Record
from runtime_outbox.models import ApplicationResult
from tests.concurrency import Worker, wait_until_blocked_on
from tests.conftest import (
    ORG,
    WEBHOOK_SECRET,
    hubspot_event,
    make_serving_org,
    post_signed,
    run_manage,
    service_document,
    subprocess_env,
)
from tests.kernel import rows

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])


# --- helpers ---------------------------------------------------------------------------
@pytest.fixture
def org(billing_sandbox) -> OrgScope:
    return make_serving_org(billing_sandbox.base_url, deploy_flow=False)


def successor_epoch(org: OrgScope, billing_url: str, monkeypatch, name: str = "NEXT") -> ServingEpoch:
    """Author a new configuration generation (a new webhook secret version) and verify its epoch."""
    from connectors.serving.generations import credential_publish

    monkeypatch.setenv(f"NEXUS_TEST_WEBHOOK_SECRET_{name}", WEBHOOK_SECRET)
    version = f"test-{name.lower()}"
    credential_publish(org=org, document={"account_key": "crm-webhooks", "credential_ref": "webhook_secret",
                                          "version": version,
                                          "secret": {"from_env": f"NEXUS_TEST_WEBHOOK_SECRET_{name}"}})
    document = service_document(billing_url)
    document["accounts"][0]["credentials"]["webhook_secret"] = version
    service_configuration_apply(org=org, document=document)
    candidate = epoch_prepare(org=org)
    return epoch_verify(org=org, epoch_id=candidate.pk)


def run_all() -> None:
    while execution_try_run_one(worker_id="t"):
        pass


def halt(org: OrgScope) -> None:
    halt_begin(org=org)
    assert halt_try_complete(org=org).all_halted


def gates() -> list[AccountServingGate]:
    return list(AccountServingGate.objects.filter(org_id=ORG).order_by("account_key"))


def gate_summary() -> set[tuple[str, int]]:
    return {(g.state, int(g.epoch_id)) for g in gates()}


def lane() -> OrderingLane:
    return OrderingLane.objects.get(org_id=ORG, epoch__state="active")


def email_event(event_id: int, occurred_at: int, value: str) -> dict:
    return hubspot_event(event_id, 501, occurred_at, "email", value)


def serve_position_100(client) -> ServingEpoch:
    """The predecessor applies position 100 of contact 501's email; returns the predecessor epoch."""
    assert post_signed(client, [email_event(100, 100, "hundred@x.io")]).status_code == 202
    run_all()
    assert Record.objects.get().fields["email"] == "hundred@x.io"
    return ServingEpoch.objects.get(org_id=ORG, state="active")


def halt_with_a_claim_in_flight(org: OrgScope, monkeypatch) -> None:
    """Halt every gate although an Execution is claimed: the gate inventory is blinded on purpose.

    The lane-level proof of the handoff transaction must hold on its own,
    whatever the gate inventory concluded.
    """
    blind = handoff.PredecessorInventory(0, 0, 0, 0, 0, 0)
    with monkeypatch.context() as patch:
        patch.setattr(handoff, "predecessor_inventory", lambda gate: blind)
        halt(org)


# --- S003-RP-18: the successor starts from the byte-exact frozen high-water --------------------------
def test_successor_position_99_after_handoff_high_water_100_is_superseded_without_runtime(
        client, org, billing_sandbox, monkeypatch):
    predecessor = serve_position_100(client)
    frozen = bytes(lane().high_water_position)
    halt(org)
    successor = successor_epoch(org, billing_sandbox.base_url, monkeypatch)
    report = handoff_stage(org=org, successor_id=successor.pk)
    assert len(report.handed_off) == 1
    record = OrderingHandoff.objects.get(org_id=ORG)
    staged = OrderingLane.objects.get(org_id=ORG, epoch=successor)
    assert bytes(record.high_water_position) == frozen
    assert bytes(staged.baseline_position) == bytes(staged.high_water_position) == frozen
    assert staged.baseline_origin == "handoff" and staged.partition_key == record.partition_key

    activation = successor_activate(org=org, successor_id=successor.pk)
    assert activation.predecessor_epoch_id == predecessor.pk and activation.handoffs == 1

    assert post_signed(client, [email_event(99, 99, "ninety-nine@x.io")]).status_code == 202
    run_all()
    late = Execution.objects.get(org_id=ORG, projection__event__source_event_key__endswith="99")
    assert late.lane_id == staged.pk
    assert late.state == "superseded"
    assert not ApplicationResult.objects.filter(org_id=ORG, command_id=late.command_id).exists()
    decision = OrderingDecision.objects.get(org_id=ORG, execution=late)
    assert bytes(decision.high_water_position) == frozen
    assert Record.objects.get().fields["email"] == "hundred@x.io"

    assert post_signed(client, [email_event(101, 101, "hundred-one@x.io")]).status_code == 202
    run_all()
    newer = Execution.objects.get(org_id=ORG, projection__event__source_event_key__endswith="101")
    assert newer.state == "completed" and newer.lane_id == staged.pk
    assert Record.objects.get().fields["email"] == "hundred-one@x.io"
    assert OrderingLane.objects.get(pk=record.predecessor_lane_id).high_water_position == frozen


def test_changed_comparator_or_partition_derivation_without_transformation_fails(
        client, billing_sandbox, monkeypatch, tmp_path, settings):
    import json
    import shutil

    from tests.conftest import ROOT

    packs = tmp_path / "packs"
    shutil.copytree(ROOT / "packs", packs, ignore=shutil.ignore_patterns("__pycache__"))
    settings.NEXUS_PACKS_DIR = packs
    org = make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    predecessor = serve_position_100(client)
    halt(org)
    pack_file = packs / "hubspot" / "pack.json"
    document = json.loads(pack_file.read_text())
    document["version"] = document["version"] + "-comparator-2"
    document["inbound_routes"][0]["ordering"]["comparator_version"] = "2"
    pack_file.write_text(json.dumps(document))
    from connectors.serving.generations import pack_publish_file

    pack_publish_file(pack_file)  # the pack owner publishes the changed definition as a new generation
    successor = successor_epoch(org, billing_sandbox.base_url, monkeypatch)

    with pytest.raises(OrderingContractChanged):
        handoff_stage(org=org, successor_id=successor.pk)
    with pytest.raises(HandoffRefused, match="no frozen handoff"):
        successor_activate(org=org, successor_id=successor.pk)
    assert not OrderingHandoff.objects.exists()
    assert lane().state == "open" and lane().epoch_id == predecessor.pk
    assert ServingEpoch.objects.get(pk=successor.pk).state == "verified"
    assert gate_summary() == {("v2_halted", int(predecessor.pk))}


# --- S003-RP-16: predecessor completion racing the OrderingHandoff ---------------------------------
def _claimed_execution(client) -> tuple:
    assert post_signed(client, [email_event(100, 100, "hundred@x.io")]).status_code == 202
    claim = execution_try_claim_one(worker_id="racer")
    assert claim is not None
    return claim


def test_predecessor_completion_racing_handoff_commits_first_and_is_included(
        client, org, billing_sandbox, monkeypatch):
    claim = _claimed_execution(client)
    halt_with_a_claim_in_flight(org, monkeypatch)
    successor = successor_epoch(org, billing_sandbox.base_url, monkeypatch)

    holding, release = threading.Event(), threading.Event()
    real_transition = ExecutionStore.transition.__func__

    def paused_transition(cls, **kwargs):
        # The completion holds the lane lock (taken first by execution_complete) while it waits here.
        holding.set()
        assert release.wait(60)
        return real_transition(cls, **kwargs)

    monkeypatch.setattr(ExecutionStore, "transition", classmethod(paused_transition))
    completion = Worker(lambda: execution_run(claim), "completion")
    completion.start()
    assert holding.wait(60)
    staging = Worker(lambda: handoff_stage(org=org, successor_id=successor.pk), "handoff")
    staging.start()
    assert staging.ready.wait(60)
    wait_until_blocked_on(staging.connection_id, "connectors_orderinglane")
    release.set()
    completion.join(60)
    staging.join(60)

    assert completion.error is None and completion.result is True
    assert staging.error is None and len(staging.result.handed_off) == 1
    done = Execution.objects.get(pk=claim.execution_id)
    assert done.state == "completed"
    predecessor_lane = OrderingLane.objects.get(pk=claim.lane_id)
    record = OrderingHandoff.objects.get(org_id=ORG)
    assert predecessor_lane.state == "handed_off" and predecessor_lane.active_execution_id is None
    assert bytes(record.high_water_position) == bytes(done.position) == bytes(predecessor_lane.high_water_position)
    staged = OrderingLane.objects.get(pk=record.successor_lane_id)
    assert bytes(staged.baseline_position) == bytes(done.position)


def test_predecessor_completion_racing_handoff_makes_the_handoff_fail_when_it_locks_first(
        client, org, billing_sandbox, monkeypatch):
    claim = _claimed_execution(client)
    halt_with_a_claim_in_flight(org, monkeypatch)
    successor = successor_epoch(org, billing_sandbox.base_url, monkeypatch)

    holding, release = threading.Event(), threading.Event()
    real_lock = OrderingLaneStore.lock.__func__

    def paused_lock(cls, org_id, pk, **kwargs):
        row = real_lock(cls, org_id, pk, **kwargs)
        if threading.current_thread().name == "handoff":
            holding.set()
            assert release.wait(60)
        return row

    monkeypatch.setattr(OrderingLaneStore, "lock", classmethod(paused_lock))
    staging = Worker(lambda: handoff_stage(org=org, successor_id=successor.pk), "handoff")
    staging.start()
    assert holding.wait(60)
    completion = Worker(lambda: execution_run(claim), "completion")
    completion.start()
    assert completion.ready.wait(60)
    wait_until_blocked_on(completion.connection_id, "connectors_orderinglane")
    release.set()
    staging.join(60)
    completion.join(60)

    assert isinstance(staging.error, HandoffRefused) and "nonterminal" in str(staging.error)
    assert completion.error is None and completion.result is True
    assert not OrderingHandoff.objects.exists()
    predecessor_lane = OrderingLane.objects.get(pk=claim.lane_id)
    done = Execution.objects.get(pk=claim.execution_id)
    assert predecessor_lane.state == "open" and done.state == "completed"
    assert bytes(predecessor_lane.high_water_position) == bytes(done.position)
    monkeypatch.undo()
    # Retrying after the completion committed includes its high-water.
    handoff_stage(org=org, successor_id=successor.pk)
    assert bytes(OrderingHandoff.objects.get(org_id=ORG).high_water_position) == bytes(done.position)


def test_no_predecessor_high_water_advances_after_the_handoff_commits(client, org, monkeypatch):
    claim = _claimed_execution(client)
    frozen_lane = OrderingLane.objects.get(pk=claim.lane_id)
    before = frozen_lane.high_water_position
    # The lane is frozen while a claim is still out (as if a handoff had missed it).
    OrderingLaneStore.transition(org_id=ORG, pk=frozen_lane.pk, src="open", dst="handed_off",
                                 version=frozen_lane.version)
    assert execution_run(claim) is False
    after = OrderingLane.objects.get(pk=claim.lane_id)
    assert after.high_water_position == before and after.state == "handed_off"
    assert Execution.objects.get(pk=claim.execution_id).state == "ready"


def test_successor_cannot_activate_with_a_predecessor_lane_that_was_not_handed_off(
        client, org, billing_sandbox, monkeypatch):
    predecessor = serve_position_100(client)
    halt(org)
    successor = successor_epoch(org, billing_sandbox.base_url, monkeypatch)
    with pytest.raises(HandoffRefused, match="no frozen handoff"):
        successor_activate(org=org, successor_id=successor.pk)
    assert ServingEpoch.objects.get(pk=predecessor.pk).state == "active"
    assert ServingEpoch.objects.get(pk=successor.pk).state == "verified"
    assert gate_summary() == {("v2_halted", int(predecessor.pk))}


def test_successor_cannot_activate_while_a_predecessor_fact_is_nonterminal(client, org, billing_sandbox, monkeypatch):
    from connectors.models import Event, Projection

    predecessor = serve_position_100(client)
    halt(org)
    successor = successor_epoch(org, billing_sandbox.base_url, monkeypatch)
    handoff_stage(org=org, successor_id=successor.pk)
    # A predecessor fact the halt inventory did not see (written behind the gate's back).
    event = rows.make(Event, org_id=ORG, epoch=predecessor, account_key="crm-webhooks")
    rows.make(Execution, org_id=ORG, projection=rows.make(Projection, org_id=ORG, event=event), state="ready",
              version=1)
    with pytest.raises(HandoffRefused, match="not terminal"):
        successor_activate(org=org, successor_id=successor.pk)
    assert ServingEpoch.objects.get(pk=predecessor.pk).state == "active"
    assert ServingEpoch.objects.get(pk=successor.pk).state == "verified"
    assert gate_summary() == {("v2_halted", int(predecessor.pk))}
    assert OrderingHandoff.objects.get(org_id=ORG).state == "frozen"


# --- halting with an open DispatchPermit --------------------------------------------------------
def _open_permit_on(gate: AccountServingGate, *, effect_account: str | None = None) -> DispatchPermit:
    effect = rows.make(RemoteEffect, org_id=ORG, state="dispatching", version=1,
                       account_key=effect_account or gate.account_key)
    attempt = rows.make(RemoteEffectAttempt, org_id=ORG, effect=effect, attempt_number=1, state="started")
    return rows.make(DispatchPermit, org_id=ORG, attempt=attempt, gate=gate, state="granted", version=1)


def test_halting_with_an_open_permit_stays_halting_until_it_settles(org):
    billing = AccountServingGate.objects.get(org_id=ORG, account_key="billing-main")
    permit = _open_permit_on(billing)
    halt_begin(org=org)
    report = halt_try_complete(org=org)
    assert report.gates["billing-main"] == ("halting_v2", HALT_WAITING_OPEN_PERMITS)
    assert report.gates["crm-webhooks"] == ("v2_halted", HALTED_FOR_SUCCESSOR)
    assert not report.all_halted
    # The one call of the granted Permit may still go out while halting: the permit settles, the effect moves on.
    DispatchPermitStore.transition(org_id=ORG, pk=permit.pk, src="granted", dst="sending", version=1)
    DispatchPermitStore.transition(org_id=ORG, pk=permit.pk, src="sending", dst="returned", version=2)
    assert halt_try_complete(org=org).gates["billing-main"][0] == "halting_v2"  # the effect is still in flight
    effect = RemoteEffect.objects.get(org_id=ORG, account_key="billing-main")
    RemoteEffectStore.transition(org_id=ORG, pk=effect.pk, src="dispatching", dst="remote_confirmed", version=1)
    RemoteEffectStore.transition(org_id=ORG, pk=effect.pk, src="remote_confirmed", dst="finalized", version=2)
    final = halt_try_complete(org=org)
    assert final.all_halted
    evidence = GateTransitionEvidence.objects.filter(gate=billing).order_by("-id").first()
    assert (evidence.from_state, evidence.to_state) == ("halting_v2", "v2_halted")
    assert evidence.evidence["inventory"]["open_permits"] == 0


def test_the_open_permit_set_of_the_gate_alone_keeps_it_halting(org, billing_sandbox, monkeypatch):
    # The Permit is counted on the gate row it was granted under, whatever its effect's lifecycle says.
    predecessor = ServingEpoch.objects.get(org_id=ORG, state="active")
    billing = AccountServingGate.objects.get(org_id=ORG, account_key="billing-main")
    permit = _open_permit_on(billing, effect_account="elsewhere")
    halt_begin(org=org)
    assert halt_try_complete(org=org).gates["billing-main"] == ("halting_v2", HALT_WAITING_OPEN_PERMITS)
    successor = successor_epoch(org, billing_sandbox.base_url, monkeypatch)
    with pytest.raises(HandoffRefused, match="v2_halted"):
        handoff_stage(org=org, successor_id=successor.pk)
    with pytest.raises(HandoffRefused, match="v2_halted"):
        successor_activate(org=org, successor_id=successor.pk)
    assert ServingEpoch.objects.get(pk=predecessor.pk).state == "active"
    assert ServingEpoch.objects.get(pk=successor.pk).state == "verified"
    DispatchPermitStore.transition(org_id=ORG, pk=permit.pk, src="granted", dst="abandoned", version=1)
    assert halt_try_complete(org=org).all_halted


def test_halt_is_refused_while_work_still_needs_a_serving_gate(client, org):
    assert post_signed(client, [email_event(7, 7, "seven@x.io")]).status_code == 202
    with pytest.raises(HaltRefused):
        halt_begin(org=org)
    assert {g.state for g in gates()} == {"v2_serving"}
    run_all()
    halt(org)
    assert {(g.state, g.reason_code) for g in gates()} == {("v2_halted", HALTED_FOR_SUCCESSOR)}
    assert post_signed(client, [email_event(8, 8, "eight@x.io")]).status_code == 503


# --- S003-RP-17: resume only before the first handoff ------------------------------------------------
def test_successor_attempt_may_resume_the_predecessor_only_while_no_handoff_exists(
        client, org, billing_sandbox, monkeypatch):
    predecessor = serve_position_100(client)
    halt(org)
    fences = {g.account_key: g.fence_token for g in gates()}
    successor_epoch(org, billing_sandbox.base_url, monkeypatch)
    resumed = predecessor_resume(org=org)
    assert resumed.epoch_id == predecessor.pk
    assert gate_summary() == {("v2_serving", int(predecessor.pk))}
    assert all(g.fence_token == fences[g.account_key] + 1 and g.reason_code == "" for g in gates())
    assert post_signed(client, [email_event(101, 101, "after-resume@x.io")]).status_code == 202
    run_all()
    assert Record.objects.get().fields["email"] == "after-resume@x.io"


def test_after_the_first_handoff_every_predecessor_resume_fails_and_recovery_goes_forward(
        client, org, billing_sandbox, monkeypatch):
    predecessor = serve_position_100(client)
    frozen = bytes(lane().high_water_position)
    halt(org)
    first = successor_epoch(org, billing_sandbox.base_url, monkeypatch, "FIRST")
    handoff_stage(org=org, successor_id=first.pk)
    with pytest.raises(ResumeRefused):
        predecessor_resume(org=org)
    assert gate_summary() == {("v2_halted", int(predecessor.pk))}

    # The first successor attempt is given up; a newly verified successor derives from the same frozen high-water.
    second = successor_epoch(org, billing_sandbox.base_url, monkeypatch, "SECOND")
    handoff_stage(org=org, successor_id=second.pk)
    abandoned = OrderingHandoff.objects.get(org_id=ORG, successor_epoch=first)
    current = OrderingHandoff.objects.get(org_id=ORG, successor_epoch=second)
    assert abandoned.state == "abandoned"
    assert current.state == "frozen" and current.cites_handoff_id == abandoned.pk
    assert bytes(current.high_water_position) == bytes(abandoned.high_water_position) == frozen
    with pytest.raises(ResumeRefused):
        predecessor_resume(org=org)
    with pytest.raises(HandoffRefused):
        successor_activate(org=org, successor_id=first.pk)
    with pytest.raises(HandoffRefused, match="abandoned"):
        handoff_stage(org=org, successor_id=first.pk)
    successor_activate(org=org, successor_id=second.pk)
    assert gate_summary() == {("v2_serving", int(second.pk))}
    assert OrderingLane.objects.get(org_id=ORG, epoch=second).baseline_position == frozen
    assert ServingEpoch.objects.get(pk=predecessor.pk).state == "draining"


def test_resume_racing_the_first_handoff_lets_exactly_one_win(client, org, billing_sandbox, monkeypatch):
    predecessor = serve_position_100(client)
    halt(org)
    successor = successor_epoch(org, billing_sandbox.base_url, monkeypatch)
    start = threading.Barrier(2)

    def after(barrier_fn):
        def run():
            start.wait(30)
            return barrier_fn()
        return run

    racers = [Worker(after(lambda: predecessor_resume(org=org)), "resume"),
              Worker(after(lambda: handoff_stage(org=org, successor_id=successor.pk)), "handoff")]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join(60)
    resume, staging = racers
    assert (resume.error is None) != (staging.error is None), (resume.error, staging.error)
    if resume.error is None:
        assert isinstance(staging.error, HandoffRefused)
        assert not OrderingHandoff.objects.exists()
        assert gate_summary() == {("v2_serving", int(predecessor.pk))}
    else:
        assert isinstance(resume.error, ResumeRefused)
        assert OrderingHandoff.objects.filter(org_id=ORG).count() == 1
        assert gate_summary() == {("v2_halted", int(predecessor.pk))}


# --- S003-RP-52: only requires_drain -------------------------------------------------------------
@pytest.mark.parametrize("transition_class", ["online_compatible", "rolling_overlap", "REQUIRES_DRAIN", ""])
def test_every_successor_transition_class_other_than_requires_drain_is_rejected(
        client, org, billing_sandbox, monkeypatch, transition_class):
    predecessor = serve_position_100(client)
    halt(org)
    successor = successor_epoch(org, billing_sandbox.base_url, monkeypatch)
    evidence = {"compatibility": "proven", "online_compatible": True, "certificate": "signed"}
    with pytest.raises(TransitionClassUnsupported):
        handoff_stage(org=org, successor_id=successor.pk, transition_class=transition_class,
                      compatibility_evidence=evidence)
    handoff_stage(org=org, successor_id=successor.pk)
    with pytest.raises(TransitionClassUnsupported):
        successor_activate(org=org, successor_id=successor.pk, transition_class=transition_class,
                           compatibility_evidence=evidence)
    assert OrderingHandoff.objects.get(org_id=ORG).transition_class == "requires_drain"
    assert ServingEpoch.objects.get(pk=successor.pk).state == "verified"
    assert gate_summary() == {("v2_halted", int(predecessor.pk))}
    successor_activate(org=org, successor_id=successor.pk)
    assert gate_summary() == {("v2_serving", int(successor.pk))}


# --- S003-RP-51: crash inside successor activation ---------------------------------------------------
def test_successor_activation_crash_leaves_predecessor_halted_or_successor_serving(
        client, org, billing_sandbox, monkeypatch):
    predecessor = serve_position_100(client)
    halt(org)
    successor = successor_epoch(org, billing_sandbox.base_url, monkeypatch)
    handoff_stage(org=org, successor_id=successor.pk)
    args = ["connector_activate_successor", "--org", ORG, "--successor", str(successor.pk)]

    crashed = run_manage(args, subprocess_env(NEXUS_FAILPOINTS="successor.activation_before_commit"))
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert ServingEpoch.objects.get(pk=predecessor.pk).state == "active"
    assert ServingEpoch.objects.get(pk=successor.pk).state == "verified"
    assert gate_summary() == {("v2_halted", int(predecessor.pk))}
    assert OrderingHandoff.objects.get(org_id=ORG).state == "frozen"

    crashed = run_manage(args, subprocess_env(NEXUS_FAILPOINTS="successor.activation_after_commit"))
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert ServingEpoch.objects.get(pk=predecessor.pk).state == "draining"
    assert ServingEpoch.objects.get(pk=successor.pk).state == "active"
    assert gate_summary() == {("v2_serving", int(successor.pk))}
    assert {g.epoch_digest for g in gates()} == {successor.digest}
    assert OrderingHandoff.objects.get(org_id=ORG).state == "activated"

    again = run_manage(args, subprocess_env())
    assert again.returncode == 0 and "already active" in again.stdout, again.stderr
    assert post_signed(client, [email_event(99, 99, "late@x.io")]).status_code == 202
    run_all()
    assert Execution.objects.get(projection__event__source_event_key__endswith="99").state == "superseded"


# --- operations ---------------------------------------------------------------------------------
def test_commands_report_clear_exit_codes(client, org, billing_sandbox, monkeypatch):
    serve_position_100(client)
    env = subprocess_env()
    billing = AccountServingGate.objects.get(org_id=ORG, account_key="billing-main")
    permit = _open_permit_on(billing)
    pending = run_manage(["connector_halt", "--org", ORG], env)
    assert pending.returncode == 4 and "halt_pending" in pending.stderr, pending.stderr
    assert "billing-main\thalting_v2\thalt_waiting_open_permits" in pending.stdout
    DispatchPermitStore.transition(org_id=ORG, pk=permit.pk, src="granted", dst="abandoned", version=1)
    effect = RemoteEffect.objects.get(org_id=ORG, account_key="billing-main")
    RemoteEffectStore.transition(org_id=ORG, pk=effect.pk, src="dispatching", dst="prepared", version=1)
    RemoteEffectStore.transition(org_id=ORG, pk=effect.pk, src="prepared", dst="quarantined", version=2,
                                 set_fields={"reason_code": "retry_exhausted"})
    halted = run_manage(["connector_halt", "--org", ORG], env)
    assert halted.returncode == 0, halted.stderr

    successor = successor_epoch(org, billing_sandbox.base_url, monkeypatch)
    env = subprocess_env()
    unknown = run_manage(["connector_handoff", "--org", ORG, "--successor", "999999"], env)
    assert unknown.returncode == 1 and "unknown_epoch" in unknown.stderr
    online = run_manage(["connector_handoff", "--org", ORG, "--successor", str(successor.pk),
                         "--transition-class", "online_compatible"], env)
    assert online.returncode == 3 and "transition_class_unsupported" in online.stderr
    staged = run_manage(["connector_handoff", "--org", ORG, "--successor", str(successor.pk)], env)
    assert staged.returncode == 0 and "1 lane(s) handed off" in staged.stdout, staged.stderr
    refused = run_manage(["connector_resume", "--org", ORG], env)
    assert refused.returncode == 3 and "resume_refused" in refused.stderr
    activated = run_manage(["connector_activate_successor", "--org", ORG, "--successor", str(successor.pk)], env)
    assert activated.returncode == 0, activated.stderr
    assert gate_summary() == {("v2_serving", int(successor.pk))}


# --- S003-RP-29: Permit acquisition racing v2_serving -> halting_v2 ----------------------------------
def _prepared_push() -> RemoteEffect:
    """One Runtime outbound intent for the billing account, accepted as a ``prepared`` RemoteEffect."""
    from django.db import transaction

    from nexusflow.kernel.scope import TrustedRuntimeWorkScope
    from nexusflow.records.services import record_create
    from runtime_outbox.services import outbound_command_author, outbox_try_deliver_one

    with transaction.atomic():
        record = record_create(org=OrgScope(ORG), object_name="Contact",
                               values={"email": "ann@x.io", "firstname": "Ann", "lastname": "Lee",
                                       "lifecyclestage": "customer"})
        outbound_command_author(scope=TrustedRuntimeWorkScope(ORG, "core", "flow-runtime", "test-binding"),
                                effect_root_id="root-" + record.record_key, effect_slot_id="push-1",
                                effect_generation_id="1", contract_key="billing.customer", record=record,
                                origin_flow_run_id=None)
    assert outbox_try_deliver_one()
    return RemoteEffect.objects.get(org_id=ORG, state="prepared")


def test_permit_acquisition_racing_halt_commits_first_and_keeps_the_gate_halting(org, billing_sandbox, monkeypatch):
    from connectors.outbound import egress, permit_grant

    _prepared_push()
    holding, release = threading.Event(), threading.Event()
    real_serving_lock = permit_grant.serving_lock

    def paused_serving_lock(**kwargs):
        ctx = real_serving_lock(**kwargs)
        if threading.current_thread().name == "grant":
            holding.set()
            assert release.wait(60)
        return ctx

    monkeypatch.setattr(permit_grant, "serving_lock", paused_serving_lock)
    grant = Worker(lambda: egress.permit_try_grant_one(worker_id="holder"), "grant")
    grant.start()
    assert holding.wait(60)
    halting = Worker(lambda: halt_begin(org=org), "halt")
    halting.start()
    assert halting.ready.wait(60)
    wait_until_blocked_on(halting.connection_id, "connectors_accountservinggate")
    release.set()
    grant.join(60)
    halting.join(60)

    assert grant.error is None and grant.result is not None
    assert halting.error is None and {g.state for g in gates()} == {"halting_v2"}
    permit = DispatchPermit.objects.get(org_id=ORG)
    billing = AccountServingGate.objects.get(org_id=ORG, account_key="billing-main")
    assert permit.state == "granted" and permit.gate_fence_token < billing.fence_token
    assert halt_try_complete(org=org).gates["billing-main"] == ("halting_v2", HALT_WAITING_OPEN_PERMITS)
    # The paused holder still makes its one authorized call and settles while the gate is halting.
    egress.permit_settle(grant.result, egress.permit_send(grant.result))
    assert len(billing_sandbox.state()["customers"]) == 1
    assert halt_try_complete(org=org).gates["billing-main"][0] == "halting_v2"
    assert egress.effect_try_finalize_one()
    assert halt_try_complete(org=org).all_halted
    assert DispatchPermit.objects.get(org_id=ORG).state == "returned"


def test_halt_racing_permit_acquisition_commits_first_and_the_acquisition_fails(org, billing_sandbox, monkeypatch):
    from connectors.outbound import egress

    effect = _prepared_push()
    holding, release = threading.Event(), threading.Event()
    real_lock_gate_set = handoff._lock_gate_set

    def paused_lock_gate_set(scope):
        locked = real_lock_gate_set(scope)
        if threading.current_thread().name == "halt":
            holding.set()
            assert release.wait(60)
        return locked

    monkeypatch.setattr(handoff, "_lock_gate_set", paused_lock_gate_set)
    # The prepared effect needs a serving gate to drain, so an operator halting now must force it.
    halting = Worker(lambda: halt_begin(org=org, force=True), "halt")
    halting.start()
    assert holding.wait(60)
    grant = Worker(lambda: egress.permit_try_grant_one(worker_id="holder"), "grant")
    grant.start()
    assert grant.ready.wait(60)
    wait_until_blocked_on(grant.connection_id, "connectors_accountservinggate")
    release.set()
    halting.join(60)
    grant.join(60)

    assert halting.error is None and {g.state for g in gates()} == {"halting_v2"}
    assert grant.error is None and grant.result is None
    assert not DispatchPermit.objects.filter(org_id=ORG).exists()
    assert RemoteEffect.objects.get(pk=effect.pk).state == "prepared"
    assert billing_sandbox.state()["customers"] == []
    report = halt_try_complete(org=org)
    assert report.gates["billing-main"] == ("halting_v2", reasons.HALT_WAITING_PREDECESSOR_WORK)


def test_crash_inside_the_handoff_commits_nothing_and_the_predecessor_may_still_resume(
        client, org, billing_sandbox, monkeypatch):
    predecessor = serve_position_100(client)
    halt(org)
    successor = successor_epoch(org, billing_sandbox.base_url, monkeypatch)
    crashed = run_manage(["connector_handoff", "--org", ORG, "--successor", str(successor.pk)],
                         subprocess_env(NEXUS_FAILPOINTS="handoff.before_commit"))
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert not OrderingHandoff.objects.exists()
    assert not OrderingLane.objects.filter(org_id=ORG, epoch=successor).exists()
    assert OrderingLane.objects.get(org_id=ORG, epoch=predecessor).state == "open"
    predecessor_resume(org=org)
    assert gate_summary() == {("v2_serving", int(predecessor.pk))}


def test_an_operator_rotates_a_credential_through_a_successor_epoch_with_the_commands(
        client, org, billing_sandbox, monkeypatch, tmp_path):
    """Credential rotation end to end as documented: publish, configure, prepare, halt, hand off, activate."""
    import io
    import json

    from django.core.management import call_command
    from django.core.management.base import CommandError

    predecessor = serve_position_100(client)
    monkeypatch.setenv("NEXUS_TEST_WEBHOOK_SECRET_ROTATED", WEBHOOK_SECRET)
    credentials = tmp_path / "credentials.json"
    credentials.write_text(json.dumps({"account_key": "crm-webhooks", "credential_ref": "webhook_secret",
                                       "version": "test-rotated",
                                       "secret": {"from_env": "NEXUS_TEST_WEBHOOK_SECRET_ROTATED"}}))
    document = service_document(billing_sandbox.base_url)
    document["accounts"][0]["credentials"]["webhook_secret"] = "test-rotated"
    config = tmp_path / "service.json"
    config.write_text(json.dumps(document))
    out = io.StringIO()
    call_command("connector_credential_publish", "--org", ORG, str(credentials), stdout=out)
    call_command("connector_config_apply", "--org", ORG, str(config), stdout=out)
    prepared = io.StringIO()
    call_command("connector_epoch_prepare", "--org", ORG, stdout=prepared)
    successor = ServingEpoch.objects.get(org_id=ORG, state="verified")
    assert prepared.getvalue().startswith(f"epoch {successor.pk} verified")
    assert post_signed(client, [email_event(101, 101, "still-predecessor@x.io")]).status_code == 202  # not yet
    run_all()
    with pytest.raises(CommandError, match="every gate must be v2_halted"):
        call_command("connector_handoff", "--org", ORG, "--successor", str(successor.pk), stdout=out)
    call_command("connector_halt", "--org", ORG, stdout=out)
    call_command("connector_handoff", "--org", ORG, "--successor", str(successor.pk), stdout=out)
    call_command("connector_activate_successor", "--org", ORG, "--successor", str(successor.pk), stdout=out)
    assert gate_summary() == {("v2_serving", int(successor.pk))}
    assert ServingEpoch.objects.get(pk=predecessor.pk).state == "draining"
    assert post_signed(client, [email_event(99, 99, "late@x.io")]).status_code == 202
    assert post_signed(client, [email_event(102, 102, "rotated@x.io")]).status_code == 202
    run_all()
    assert Record.objects.get().fields["email"] == "rotated@x.io"
