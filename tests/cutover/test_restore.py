"""``cutover restore``: the full V1 restore after a failed candidate (issue 21; seed 003 "Offline V1 shutdown,
cold rollback, and V2 cutover", the full restore, and "Transaction and crash rules").

Proofs S003-RP-44 (the restore half: the complete V1 point is restored while both runtimes stay stopped, then a
new process generation of the exact V1 release resumes with unchanged cursors, idempotency, ordering and
terminal-effect evidence) and S003-RP-45 (the decision: a restore never wins what activation won). Real MariaDB;
the V1 restore point is a real ``mariadb-dump`` (tests/cutover/test_activate.py's ``restorable``); crashes kill a
real ``manage.py cutover restore`` process at each named restore boundary; V1 serves again through a real
``run_workers --role v1`` process and the V1 ingress route.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db import connection

from connectors.models import (
    AccountServingGate,
    OrderingLane,
    V1EgressDenial,
    V1Event,
    V1MaintenanceBarrier,
    V1ProcessGeneration,
    V1ProviderCall,
    V1StreamCursor,
    V1TransportKey,
)
from cutover.activate import cutover_activate
from cutover.decision import DecisionLost, decision_of
from cutover.halt import cutover_halt_v1
from cutover.models import CutoverEvidence, RestoreAttempt, V1RestorePoint
from cutover.restore import BOUNDARIES, RestoreRefused, cutover_cold_abort, cutover_restore
from cutover.services import CutoverRefused
from cutover.status import cutover_status
from tests.conftest import ORG, hubspot_event, run_manage, subprocess_env
from tests.connectors.v1.support import post_v1
from tests.cutover.conftest import ATTEMPT

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

#: The V1 facts a restore must bring back unchanged (cursors, transport idempotency, ordering, effects, denials).
V1_FACTS = (V1StreamCursor, V1TransportKey, V1Event, V1ProviderCall, V1EgressDenial, V1ProcessGeneration)
CANDIDATE_TABLE = "candidate_v2_scratch"


def _v1_facts() -> dict[str, list[tuple]]:
    return {model.__name__: list(model.objects.filter(**({"org_id": ORG} if hasattr(model, "org_id") else {}))
                                 .order_by("pk").values_list()) for model in V1_FACTS}


@pytest.fixture(autouse=True)
def _no_candidate_table():
    """The candidate's table is schema, which the test databases' flush leaves: drop it around each test."""
    def drop():
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TABLE IF EXISTS {CANDIDATE_TABLE}")
    drop()
    yield
    drop()


def _fail_the_candidate() -> None:
    """What a candidate that failed validation leaves: a schema change and data beside the V2 candidate epoch."""
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE {CANDIDATE_TABLE} (id INT PRIMARY KEY)")
        cursor.execute(f"INSERT INTO {CANDIDATE_TABLE} VALUES (1)")


def _table_exists(name: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND "
                       "table_name = %s", (name,))
        return cursor.fetchone()[0] == 1


def _assert_restored(point_facts: dict) -> None:
    assert decision_of(ORG, ATTEMPT).state == "v1_restored"
    attempt = RestoreAttempt.objects.get(org_id=ORG, attempt_key=ATTEMPT)
    assert attempt.state == "completed" and attempt.evidence["isolation"]["decision"] == "restoring_v1"
    assert {g.state for g in AccountServingGate.objects.filter(org_id=ORG)} == {"v1_serving"}
    assert set(V1MaintenanceBarrier.objects.filter(org_id=ORG).values_list("state", flat=True)) == {"open"}
    assert not _table_exists(CANDIDATE_TABLE)  # the candidate's schema is gone
    assert not OrderingLane.objects.exists()  # the candidate's lanes are gone with it
    assert _v1_facts() == point_facts  # cursors, idempotency keys, events, calls, denials: as certified
    [proof] = CutoverEvidence.objects.filter(org_id=ORG, attempt_key=ATTEMPT, kind="v1_restored")
    assert proof.payload["restore_attempt_id"] == int(attempt.pk)


def _v1_serves_again(client, before: dict) -> None:
    """A V1-accepted delivery is answered from V1 idempotency; a new one is accepted and run by a new generation
    of the exact V1 release; the terminated generations stay denied."""
    redelivered = post_v1(client, [hubspot_event(1, 501, 1000), hubspot_event(2, 501, 1001, "email", "a@example.test")])
    assert redelivered.status_code == 200 and redelivered.json()["status"] == "redelivered"
    fresh = post_v1(client, [hubspot_event(7, 501, 1007, "email", "b@example.test")])
    assert fresh.status_code == 202, fresh.content
    worker = run_manage(["run_workers", "--role", "v1", "--until-idle", "--idle-sleep", "0"], subprocess_env())
    assert worker.returncode == 0, worker.stderr
    generations = list(V1ProcessGeneration.objects.order_by("pk"))
    assert len(generations) == len(before["V1ProcessGeneration"]) + 1
    assert generations[-1].release == generations[0].release  # the exact V1 release
    assert set(V1Event.objects.filter(org_id=ORG).values_list("state", flat=True)) == {"completed"}
    assert V1Event.objects.filter(org_id=ORG).count() == len(before["V1Event"]) + 1
    assert list(V1EgressDenial.objects.filter(org_id=ORG).values_list()) == before["V1EgressDenial"]


def test_a_failed_candidate_is_restored_to_the_v1_point_and_a_new_v1_generation_serves(validated, client):
    """S003-RP-44 (restore half): both runtimes stay stopped, the complete V1 point comes back byte-equal,
    then V1 serves again with unchanged cursors, idempotency, ordering and terminal-effect evidence."""
    point_facts = _v1_facts()
    _fail_the_candidate()
    assert OrderingLane.objects.exists()  # validation started the candidate's lanes
    report = cutover_restore(org=validated, attempt_key=ATTEMPT)
    assert report.decision == "v1_restored" and not report.already and report.holder_fence == 1
    assert set(report.seconds) == {"isolate", "load", "verify", "serve_v1"}
    _assert_restored(point_facts)
    assert cutover_restore(org=validated, attempt_key=ATTEMPT).already
    status = cutover_status(org=validated)
    assert status["phase"] == "v1_serving" and status["restore"]["state"] == "completed"
    assert "--attempt NEW_KEY" in status["next_command"]
    with pytest.raises(CutoverRefused, match="spent: it was restored to V1"):  # the attempt is spent: a new cutover needs a new key
        cutover_halt_v1(org=validated, attempt_key=ATTEMPT)
    with pytest.raises(DecisionLost):
        cutover_activate(org=validated, attempt_key=ATTEMPT)
    _v1_serves_again(client, point_facts)


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_a_restore_killed_at_any_boundary_resumes_the_same_attempt_and_completes(validated, client, boundary):
    """S003-RP-44: a coordinator killed anywhere leaves the decision with the restore and both runtimes stopped;
    the rerun takes the same RestoreAttempt over (fence 2) and finishes it."""
    point_facts = _v1_facts()
    _fail_the_candidate()
    killed = run_manage(["cutover", "restore", "--org", ORG, "--attempt", ATTEMPT],
                        subprocess_env(NEXUS_FAILPOINTS=boundary))
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert decision_of(ORG, ATTEMPT).state in ("restoring_v1", "v1_restored")
    with pytest.raises(DecisionLost):  # activation can never win it back
        cutover_activate(org=validated, attempt_key=ATTEMPT)
    rerun = run_manage(["cutover", "restore", "--org", ORG, "--attempt", ATTEMPT], subprocess_env())
    assert rerun.returncode == 0, rerun.stderr
    _assert_restored(point_facts)
    # killed before the attempt was journaled: the rerun writes it; after: one fenced takeover
    expected_fence = 1 if boundary == "cutover.restore.after_decision" else 2
    assert RestoreAttempt.objects.get(org_id=ORG, attempt_key=ATTEMPT).holder_fence == expected_fence


def test_a_restore_losing_the_decision_to_a_committed_activation_restores_nothing(validated):
    """S003-RP-45 and S003-RP-50: after activation committed, the restore is refused and the main database is
    untouched; V2 keeps serving."""
    cutover_activate(org=validated, attempt_key=ATTEMPT)
    _fail_the_candidate()
    with pytest.raises(DecisionLost):
        cutover_restore(org=validated, attempt_key=ATTEMPT)
    assert _table_exists(CANDIDATE_TABLE)
    assert {g.state for g in AccountServingGate.objects.filter(org_id=ORG)} == {"v2_serving"}
    assert decision_of(ORG, ATTEMPT).state == "v2_committed"
    assert not RestoreAttempt.objects.filter(org_id=ORG).exists()
    refused = run_manage(["cutover", "restore", "--org", ORG, "--attempt", ATTEMPT], subprocess_env())
    assert refused.returncode == 3 and "cutover_decision_lost" in refused.stderr


def test_a_corrupt_or_missing_restore_point_is_refused_before_the_decision(validated, tmp_path):
    point_facts = _v1_facts()
    point = V1RestorePoint.objects.get(org_id=ORG, attempt_key=ATTEMPT)
    main = Path(point.backup_path) / "default.sql"
    original = main.read_bytes()
    main.write_bytes(original[:-200])  # a truncated dump
    with pytest.raises(RestoreRefused) as refused:
        cutover_restore(org=validated, attempt_key=ATTEMPT)
    assert {b["reason_code"] for b in refused.value.blockers} == {"restore_point_backup_invalid"}
    assert decision_of(ORG, ATTEMPT).state == "rollback_open"  # the decision is still open: nothing was decided
    main.write_bytes(original)
    with pytest.raises(RestoreRefused) as missing:
        cutover_restore(org=validated, attempt_key="attempt-unknown")
    assert {b["reason_code"] for b in missing.value.blockers} == {"restore_point_missing"}
    cutover_restore(org=validated, attempt_key=ATTEMPT)
    _assert_restored(point_facts)


def test_once_any_epoch_of_the_deployment_was_active_no_v1_snapshot_is_restored(validated, billing_sandbox):
    """S003-RP-50: a full restore rewrites the whole main database; after any first activation (here another
    org's greenfield epoch) it is refused, from the control database's decision, and nothing is decided or loaded."""
    from connectors.serving.gates import service_configuration_apply
    from connectors.serving.generations import credential_publish
    from cutover.services import cutover_greenfield
    from nexusflow.kernel.scope import OrgScope
    from tests.conftest import CREDENTIAL_DOCUMENTS, service_document

    other = OrgScope("restore-other-org")
    for document in CREDENTIAL_DOCUMENTS:
        credential_publish(org=other, document={**document, "account_key": document["account_key"] + "-b"})
    document = service_document(billing_sandbox.base_url)
    for account in document["accounts"]:
        account["account_key"] += "-b"
    service_configuration_apply(org=other, document=document)
    cutover_greenfield(org=other)
    _fail_the_candidate()
    with pytest.raises(RestoreRefused) as refused:
        cutover_restore(org=validated, attempt_key=ATTEMPT)
    subjects = {b["subject"] for b in refused.value.blockers}
    assert {b["reason_code"] for b in refused.value.blockers} == {"restore_forward_only"}
    assert any(s.startswith("decision.restore-other-org.") for s in subjects) and "serving_epochs" in subjects
    assert decision_of(ORG, ATTEMPT).state == "rollback_open" and _table_exists(CANDIDATE_TABLE)
    assert not RestoreAttempt.objects.filter(org_id=ORG).exists()


def _start_v1() -> subprocess.CompletedProcess:
    return run_manage(["run_workers", "--role", "v1", "--until-idle", "--idle-sleep", "0"], subprocess_env())


def test_v1_cannot_restart_after_stop_but_a_full_restore_starts_a_new_exact_generation(stopped, client, tmp_path):
    """S003-RP-45: once ``cutover stop`` terminated V1, no V1 process generation starts (stopped, drained, and
    validating); the full restore is what authorizes one new generation of the exact release."""
    from cutover.certify import cutover_certify
    from cutover.restore_point import restore_point_capture, restore_point_record
    from cutover.validate import cutover_validate

    generations = V1ProcessGeneration.objects.count()
    refused = _start_v1()
    assert refused.returncode == 3 and "v1_generation_refused" in refused.stderr and "v1_stopped" in refused.stderr
    cutover_certify(org=stopped, attempt_key=ATTEMPT)
    capture = restore_point_capture(org=stopped, attempt_key=ATTEMPT, backup_dir=tmp_path)
    restore_point_record(org=stopped, capture=capture, rehearsal={"proven_by": "tests/cutover/test_restore_point.py"})
    cutover_validate(org=stopped, attempt_key=ATTEMPT)
    for _ in range(2):  # v2_validating, then again: a refusal starts nothing and changes nothing
        again = _start_v1()
        assert again.returncode == 3 and "v1_generation_refused" in again.stderr
    assert V1ProcessGeneration.objects.count() == generations
    cutover_restore(org=stopped, attempt_key=ATTEMPT)
    started = _start_v1()
    assert started.returncode == 0, started.stderr
    [new] = V1ProcessGeneration.objects.order_by("-pk")[:1]
    assert V1ProcessGeneration.objects.count() == generations + 1
    assert new.release == V1ProcessGeneration.objects.order_by("pk").first().release


def test_a_restored_snapshot_cannot_bring_v1_back_after_activation(validated):
    """S003-RP-50: after activation won (control database), loading the V1 point's dump into the main database by
    hand still starts no V1 generation: the control database's decision refuses it, whatever the main one says."""
    import json

    from cutover.restore import _load
    from cutover.restore_point import Capture

    cutover_activate(org=validated, attempt_key=ATTEMPT)
    point = V1RestorePoint.objects.get(org_id=ORG, attempt_key=ATTEMPT)
    _load(Capture(Path(point.backup_path), json.loads(bytes(point.manifest))))  # an operator restores a snapshot
    with connection.cursor() as cursor:  # ... and even forces its gates back to V1 behind the stores' back
        cursor.execute(f"UPDATE {AccountServingGate._meta.db_table} SET state = 'v1_serving', reason_code = '' "
                       "WHERE org_id = %s", (ORG,))
    generations = V1ProcessGeneration.objects.count()
    refused = _start_v1()
    assert refused.returncode == 3 and "v1_generation_refused" in refused.stderr
    assert "v2_committed, control database" in refused.stderr
    assert V1ProcessGeneration.objects.count() == generations
    with pytest.raises(DecisionLost):
        cutover_restore(org=validated, attempt_key=ATTEMPT)


def test_a_second_coordinator_is_refused_while_a_restore_runs_and_takes_over_after_it_died(validated, tmp_path):
    """One restore of the deployment at a time (a server named lock on the control database), and a killed
    coordinator's attempt is taken over under a new fence."""
    from django.conf import settings

    point_facts = _v1_facts()
    env = subprocess_env(NEXUS_FAILPOINTS="cutover.restore.after_isolation=pause", NEXUS_FAILPOINT_DIR=str(tmp_path))
    first = subprocess.Popen([sys.executable, "manage.py", "cutover", "restore", "--org", ORG, "--attempt", ATTEMPT],
                             cwd=settings.BASE_DIR, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob("cutover.restore.after_isolation.*")):
            assert first.poll() is None, first.stderr.read()
            assert time.monotonic() < deadline, "the first restore never reached its pause"
            time.sleep(0.05)
        second = run_manage(["cutover", "restore", "--org", ORG, "--attempt", ATTEMPT], subprocess_env())
        assert second.returncode == 3 and "restore_in_progress" in second.stderr
        assert RestoreAttempt.objects.get(org_id=ORG, attempt_key=ATTEMPT).state == "isolated"
    finally:
        first.kill()
        first.wait(60)
    cutover_restore(org=validated, attempt_key=ATTEMPT)  # the takeover, once the lock died with its holder
    _assert_restored(point_facts)
    assert RestoreAttempt.objects.get(org_id=ORG, attempt_key=ATTEMPT).holder_fence == 2


# --- cold abort: after certify, before any V2 mutation -----------------------------------------------------
def test_a_cold_abort_after_certify_serves_v1_again_with_a_new_exact_generation(drained, client):
    """S003-RP-45: from v1_drained, before V2 mutated anything, the certified cold abort returns every gate to
    v1_serving (new fences, barriers open) and authorizes a new exact-V1 generation; the V1 facts are untouched."""
    facts = _v1_facts()
    fences = {g.account_key: g.fence_token for g in AccountServingGate.objects.filter(org_id=ORG)}
    assert _start_v1().returncode == 3  # drained: V1 may not start yet
    done = run_manage(["cutover", "cold-abort", "--org", ORG, "--attempt", ATTEMPT], subprocess_env())
    assert done.returncode == 0, done.stderr
    gates = list(AccountServingGate.objects.filter(org_id=ORG))
    assert {g.state for g in gates} == {"v1_serving"} and all(g.fence_token > fences[g.account_key] for g in gates)
    assert set(V1MaintenanceBarrier.objects.filter(org_id=ORG).values_list("state", flat=True)) == {"open"}
    assert _v1_facts() == facts
    assert cutover_cold_abort(org=drained, attempt_key=ATTEMPT).already
    with pytest.raises(CutoverRefused, match="cold-aborted"):
        cutover_halt_v1(org=drained, attempt_key=ATTEMPT)
    assert "--attempt NEW_KEY" in cutover_status(org=drained)["next_command"]
    _v1_serves_again(client, facts)


def test_a_cold_abort_is_refused_once_validation_mutated_anything_for_v2(validated):
    """After validate (candidate lanes, gates v2_validating, the decision opened) only the full restore remains."""
    with pytest.raises(RestoreRefused) as refused:
        cutover_cold_abort(org=validated, attempt_key=ATTEMPT)
    assert {b["reason_code"] for b in refused.value.blockers} == {"cold_abort_v2_mutated"}
    assert {g.state for g in AccountServingGate.objects.filter(org_id=ORG)} == {"v2_validating"}
    shown = run_manage(["cutover", "cold-abort", "--org", ORG, "--attempt", ATTEMPT], subprocess_env())
    assert shown.returncode == 3 and "cold_abort_v2_mutated" in shown.stderr


def test_a_cold_abort_is_refused_before_certify(stopped):
    with pytest.raises(RestoreRefused) as refused:
        cutover_cold_abort(org=stopped, attempt_key=ATTEMPT)
    assert {b["reason_code"] for b in refused.value.blockers} == {"cold_abort_not_drained"}
    assert {g.state for g in AccountServingGate.objects.filter(org_id=ORG)} == {"v1_stopped"}
