"""``cutover restore-point`` (issue 21: the V1 restore point after ``certify``).

Seed 003 "Offline V1 shutdown, cold rollback, and V2 cutover", step 6; proof S003-RP-43. Real
MariaDB: the dumps come from ``mariadb-dump`` and the rehearsal restores them into a separate
``mariadbd`` started on a fresh data directory (two tests: starting a server takes seconds). The
refusals that need no server (pre-drain, V2 mutation, corrupt, partial or reset-only files, drift)
are rejected before any server starts.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import signal
import tempfile
from pathlib import Path

import pytest
from django.db import connections, transaction

from connectors.models import ServingEpoch, V1StreamCursor
from connectors.store import ServingEpochStore
from connectors.v1.store import V1StreamCursorStore
from cutover import reasons
from cutover.models import CutoverEvidence, V1RestorePoint, V1ShutdownCertificate
from cutover.restore_point import (
    MANIFEST_NAME,
    RestorePointRejected,
    cutover_restore_point,
    restore_point_capture,
    restore_point_record,
)
from cutover.status import cutover_status
from nexusflow.kernel.clock import db_now
from tests.conftest import ORG, run_manage, subprocess_env
from tests.cutover.conftest import ATTEMPT

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])


def _codes(exc: RestorePointRejected) -> set[str]:
    return {b["reason_code"] for b in exc.blockers}


@pytest.fixture(autouse=True)
def own_tempdir(monkeypatch):
    """This test's own temporary directory for the rehearsal's work directory (short: it holds the server's
    socket), so that a rehearsal another test worker runs meanwhile never shows among this test's."""
    own = Path(tempfile.mkdtemp(prefix="rp-"))
    monkeypatch.setattr(tempfile, "tempdir", str(own))
    yield own
    shutil.rmtree(own, ignore_errors=True)


def _rehearsal_dirs() -> set[Path]:
    """The rehearsal work directories in this test's temporary directory (:func:`own_tempdir`)."""
    return set(Path(tempfile.gettempdir()).glob("nexusflow-rehearsal-*"))


def _rewrite(capture, name: str, data: bytes) -> None:
    """Replace a dump file and make the manifest agree with it (the dump itself, not its transfer, is wrong)."""
    path = capture.path / name
    path.write_bytes(data)
    for entry in capture.manifest["databases"]:
        if entry["file"] == name:
            entry.update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
    (capture.path / MANIFEST_NAME).write_text(json.dumps(capture.manifest))


def _assert_rejected(org, tmp_path, code: str) -> RestorePointRejected:
    with pytest.raises(RestorePointRejected) as rejected:
        cutover_restore_point(org=org, attempt_key=ATTEMPT, backup_dir=tmp_path)
    assert code in _codes(rejected.value), rejected.value.blockers
    assert not V1RestorePoint.objects.exists()
    row = CutoverEvidence.objects.filter(org_id=ORG, kind="shutdown_blocked").order_by("-id").first()
    assert row.payload["phase"] == "restore_point" and code in {b["reason_code"] for b in row.payload["blockers"]}
    return rejected.value


# --- preconditions -------------------------------------------------------------------------------------------
def test_a_restore_point_before_v1_drained_is_refused_and_nothing_is_captured(stopped, tmp_path):
    """S003-RP-43: a pre-drain snapshot is not a V1 restore point."""
    _assert_rejected(stopped, tmp_path, reasons.RESTORE_POINT_NOT_DRAINED)
    assert list(tmp_path.iterdir()) == []
    assert "cutover certify" in cutover_status(org=stopped)["next_command"]
    refused = run_manage(["cutover", "restore-point", "--org", ORG, "--attempt", ATTEMPT, "--backup-dir",
                          str(tmp_path)], subprocess_env())
    assert refused.returncode == 3 and "restore_point_not_drained" in refused.stderr, refused.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_restore_point_after_a_v2_mutation_is_refused(drained, tmp_path):
    """S003-RP-43: once an epoch was activated the V1 point no longer represents the service."""
    epoch = ServingEpoch.objects.filter(org_id=ORG, state="verified").order_by("-id").first()
    with transaction.atomic():
        ServingEpochStore.transition(org_id=ORG, pk=epoch.pk, src="verified", dst="active", version=epoch.version,
                                     set_fields={"activated_at": db_now()})
    rejected = _assert_rejected(drained, tmp_path, reasons.RESTORE_POINT_V2_MUTATED)
    assert "v2.serving_epochs_activated" in {b["subject"] for b in rejected.blockers}
    assert list(tmp_path.iterdir()) == []


# --- files and drift: rejected before any server starts -------------------------------------------------------
def _flip_a_byte(capture) -> None:
    path = capture.path / "default.sql"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _truncate(capture) -> None:
    data = (capture.path / "default.sql").read_bytes()
    _rewrite(capture, "default.sql", data[: data.rindex(b"INSERT INTO")])


def _reset_only(capture) -> None:
    capture.manifest["databases"] = [d for d in capture.manifest["databases"] if d["alias"] == "default"]
    (capture.path / MANIFEST_NAME).write_text(json.dumps(capture.manifest))


def _cursor_moved(capture) -> None:
    cursor = V1StreamCursor.objects.filter(org_id=ORG).order_by("id").first()
    with transaction.atomic():
        locked = V1StreamCursorStore.lock(ORG, cursor.pk)
        V1StreamCursorStore.touch(org_id=ORG, pk=locked.pk, state=locked.state, version=locked.version,
                                  set_fields={"cursor": b'{"after":"moved-after-capture"}'})


@pytest.mark.parametrize("damage,code,subject", [
    (_flip_a_byte, reasons.RESTORE_POINT_BACKUP_INVALID, "file.default.sql"),
    (_truncate, reasons.RESTORE_POINT_BACKUP_INVALID, "file.default.sql"),
    (_reset_only, reasons.RESTORE_POINT_BACKUP_INVALID, "database.control"),
    (_cursor_moved, reasons.RESTORE_POINT_DRIFT, "v1_facts.v1_stream_cursors"),
], ids=["corrupt_byte", "partial_dump", "reset_only_backup", "cursor_drift"])
def test_a_corrupt_partial_or_reset_only_backup_or_v1_drift_rejects_the_point(drained, tmp_path, monkeypatch, damage,
                                                                              code, subject):
    """S003-RP-43: the capture is checked against its manifest and the live V1 facts before it is rehearsed."""
    import cutover.restore_point as restore_point

    def no_server():
        raise AssertionError("a rejected capture must not reach the rehearsal server")

    monkeypatch.setattr(restore_point, "rehearsal_server", no_server)
    capture = restore_point_capture(org=drained, attempt_key=ATTEMPT, backup_dir=tmp_path)
    assert {d["alias"] for d in capture.manifest["databases"]} == {"default", "control"}
    assert capture.manifest["v1_facts"]["v1_stream_cursors"]["rows"] >= 1
    damage(capture)
    before = _rehearsal_dirs()
    rejected = _assert_rejected(drained, tmp_path, code)
    assert subject in {b["subject"] for b in rejected.blockers}
    assert _rehearsal_dirs() == before  # no server was started for it
    assert not capture.path.exists() and capture.path.with_name(capture.path.name + ".rejected").is_dir()


def test_drift_during_the_rehearsal_is_rejected_by_the_final_check_under_the_gate_locks(drained, tmp_path):
    """S003-RP-43: the record step rereads the live V1 facts; a cursor moved after the rehearsal rejects the point."""
    capture = restore_point_capture(org=drained, attempt_key=ATTEMPT, backup_dir=tmp_path)
    _cursor_moved(capture)
    with pytest.raises(RestorePointRejected) as rejected:
        restore_point_record(org=drained, capture=capture, rehearsal={"seconds": {}})
    assert {b["subject"] for b in rejected.value.blockers} == {"v1_facts.v1_stream_cursors"}
    assert _codes(rejected.value) == {reasons.RESTORE_POINT_DRIFT}
    assert not V1RestorePoint.objects.exists()


# --- the rehearsal: a real isolated mariadbd ------------------------------------------------------------------
def test_a_restore_point_is_captured_rehearsed_on_an_isolated_server_and_recorded_once(drained, tmp_path):
    """S003-RP-43: the happy path binds the complete database and V1 release; a rerun returns the same point.

    The first run is killed after its capture: the rerun resumes that capture, rehearses and records it.
    """
    before = _rehearsal_dirs()
    killed = run_manage(["cutover", "restore-point", "--org", ORG, "--attempt", ATTEMPT, "--backup-dir", str(tmp_path)],
                        subprocess_env(NEXUS_FAILPOINTS="cutover.restore_point.after_capture"))
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    [captured] = (tmp_path / ORG / ATTEMPT).iterdir()
    assert (captured / MANIFEST_NAME).is_file() and not V1RestorePoint.objects.exists()
    report = cutover_restore_point(org=drained, attempt_key=ATTEMPT, backup_dir=tmp_path)
    assert not report.already and report.backup_path == str(captured.resolve())
    point = V1RestorePoint.objects.using("control").get(org_id=ORG, attempt_key=ATTEMPT)
    # The receipt lives outside the database a restore rewrites.
    assert "cutover_v1restorepoint" in connections["control"].introspection.table_names()
    assert "cutover_v1restorepoint" not in connections["default"].introspection.table_names()
    assert int(point.pk) == report.restore_point_id and V1RestorePoint.objects.count() == 1
    certificate = V1ShutdownCertificate.objects.get(org_id=ORG, attempt_key=ATTEMPT)
    assert point.certificate_digest == certificate.digest and int(point.certificate_id) == int(certificate.pk)
    manifest = json.loads(bytes(point.manifest))
    assert manifest["certificate"] == {"id": int(certificate.pk), "digest": certificate.digest}
    assert manifest["code"]["v1_release"] == point.v1_release == \
        json.loads(bytes(certificate.document))["v1_release"]["current_tree"]
    files = {d["alias"]: d for d in manifest["databases"]}
    assert set(files) == {"default", "control"}
    for entry in files.values():
        data = (Path(point.backup_path) / entry["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"] and b"-- Dump completed" in data[-256:]
    assert files["default"]["tables"]["connectors_v1streamcursor"]["rows"] >= 1
    assert set(manifest["v1_facts"]) >= {"v1_stream_cursors", "v1_transport_keys", "v1_provider_calls",
                                         "receipt_admission_keys", "account_serving_gates"}
    # What the rehearsal recomputed from the restored copy, and the release reading it.
    rehearsal = point.rehearsal
    assert rehearsal["boot"] == {"phase": "v1_drained", "gates": {"v1_drained": 2},
                                 "shutdown_certificate": certificate.digest}
    assert rehearsal["databases"]["default"]["tables"] == len(files["default"]["tables"])
    assert rehearsal["databases"]["default"]["rows"] == sum(t["rows"] for t in files["default"]["tables"].values())
    assert set(rehearsal["seconds"]) >= {"install", "start", "restore", "verify", "boot", "total"}
    assert _rehearsal_dirs() == before  # the server stopped and its data directory is gone

    again = cutover_restore_point(org=drained, attempt_key=ATTEMPT, backup_dir=tmp_path)
    assert again.already and again.restore_point_id == report.restore_point_id
    assert V1RestorePoint.objects.count() == 1
    status = cutover_status(org=drained)
    assert status["restore_point"]["manifest_digest"] == point.manifest_digest
    assert "cutover validate" in status["next_command"]
    shown = run_manage(["cutover", "restore-point", "--org", ORG, "--attempt", ATTEMPT, "--json"], subprocess_env())
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["restore_point_id"] == report.restore_point_id


def test_the_rehearsal_rejects_a_dump_whose_content_differs_from_the_bound_facts(drained, tmp_path):
    """S003-RP-43: a dump that restores cleanly but holds other facts (a gate state) is not a restore point."""
    capture = restore_point_capture(org=drained, attempt_key=ATTEMPT, backup_dir=tmp_path)
    data = (capture.path / "default.sql").read_bytes()
    start = data.index(b"INSERT INTO `connectors_accountservinggate`")
    at = data.index(b"'v1_drained'", start)
    _rewrite(capture, "default.sql", data[:at] + b"'v1_serving'" + data[at + len(b"'v1_drained'"):])
    before = _rehearsal_dirs()
    # A starting mariadbd deletes the ``#sql*`` files of its tmpdir; the live server keeps its temporary
    # tables in its own tmpdir, and the rehearsal must leave them alone.
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT @@tmpdir")
        [live_tmpdir] = cursor.fetchone()
    probe = Path(live_tmpdir.split(":")[0]) / f"#sql-temptable-rehearsal-probe-{tmp_path.name}.MAI"
    probe.write_bytes(b"a temporary table of the live server")
    rejected = _assert_rejected(drained, tmp_path, reasons.RESTORE_POINT_REHEARSAL_FAILED)
    assert probe.exists(), "the rehearsal server deleted the live server's temporary table files"
    probe.unlink()
    assert {"default.connectors_accountservinggate", "v1_facts.account_serving_gates"} <= \
        {b["subject"] for b in rejected.blockers}
    assert _rehearsal_dirs() == before
    assert capture.path.with_name(capture.path.name + ".rejected").is_dir()
    # The command reports the refusal with its reason codes and exit 3.
    refused = run_manage(["cutover", "restore-point", "--org", ORG, "--attempt", "attempt-unknown"],
                         subprocess_env())
    assert refused.returncode == 3 and "certificate_missing" in refused.stderr
