"""``cutover restore-point``: the post-drain V1 recovery point, rehearsed on an isolated server.

Seed 003 "Offline V1 shutdown, cold rollback, and V2 cutover", step 6, and "Compressed durable
model" (``V1RestorePoint``); proof S003-RP-43. Three resumable steps:

1. :func:`restore_point_capture` checks the preconditions (every gate of the org ``v1_drained``
   under the attempt's V1ShutdownCertificate, no reconciliation after it, the certified V1 release
   and schema, no V2 mutation since), reads the facts to bind from a consistent snapshot, then
   writes one ``mariadb-dump --single-transaction --routines --events --hex-blob`` file per
   database of the deployment (main and control) and a manifest (files and SHA-256, databases,
   rows and content digest per table, applied migrations, the org's V1 fact digests, the V1
   release, the certificate digest) into ``<backup dir>/<org>/<attempt>/<capture>/``;
2. :func:`restore_point_rehearse` checks the files (digest, completion marker, every database),
   starts a separate ``mariadbd`` on a fresh data directory, restores every dump into it,
   recomputes every table digest, row count and V1 fact digest from the restored copy with the
   same code, boots the release against it (``manage.py cutover status``: it must read
   ``v1_drained`` under the same certificate), then stops the server and removes its data;
3. :func:`restore_point_record` rereads the preconditions and the live V1 facts under the gate
   locks (drift since the capture rejects) and inserts the one :class:`~cutover.models.V1RestorePoint`
   on the ``control`` database with the rehearsal result.

Any failure rejects the point: nothing is inserted, the capture directory is renamed
``*.rejected``, one ``shutdown_blocked`` evidence row (phase ``restore_point``) records the
reason-coded blockers and the command exits 3. The live facts are read in their own snapshot
just before the dump's: a write between the two makes the rehearsal differ, so the point is
rejected rather than bound to facts the dump does not hold.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import MySQLdb
from django.conf import settings
from django.db import connections, transaction

from connectors.models import AccountServingGate, GateTransitionEvidence
from connectors.store import AccountServingGateStore
from connectors.v1.generations import v1_release
from nexusflow.kernel import canonical_json, failpoints
from nexusflow.kernel.clock import db_now
from nexusflow.kernel.digests import digest_v2
from nexusflow.kernel.models import insert
from nexusflow.kernel.net import free_local_port
from nexusflow.kernel.scope import OrgScope

from . import reasons, selectors
from .models import CutoverEvidence, V1RestorePoint, V1ShutdownCertificate
from .v1_shutdown import ShutdownBlocked, attempt_certificate, blocker, record_blocked

MANIFEST_FORMAT = "nexusflow.v1-restore-point.v1"
MANIFEST_NAME = "manifest.json"
PHASE = "restore_point"
DUMP_FLAGS = ("--single-transaction", "--routines", "--events", "--hex-blob", "--triggers",
              "--default-character-set=utf8mb4")
#: The last comment ``mariadb-dump`` writes: a file without it is a partial dump.
COMPLETION_MARKER = b"-- Dump completed"
#: How long the rehearsal server may take to answer, and to stop.
SERVER_START_SECONDS = 60.0
SERVER_STOP_SECONDS = 60.0
#: A crash after the capture is complete and before its rehearsal: the rerun resumes that capture.
FP_AFTER_CAPTURE = failpoints.declare("cutover.restore_point.after_capture")


class RestorePointRejected(ShutdownBlocked):
    """The restore point was refused or rejected; nothing was recorded (exit 3). ``blockers`` as ShutdownBlocked."""

    code = "restore_point_rejected"


@dataclass
class Capture:
    """One captured backup: ``path`` holds the dump files and ``manifest.json``; ``manifest`` is its content."""

    path: Path
    manifest: dict

    @property
    def manifest_bytes(self) -> bytes:
        return canonical_json.dumps(self.manifest)


@dataclass
class RestorePointReport:
    """``restore_point_id``/``manifest_digest``: the V1RestorePoint; ``rehearsal``: timings and digests."""

    attempt_key: str
    restore_point_id: int
    manifest_digest: str
    certificate_digest: str
    backup_path: str
    rehearsal: dict
    already: bool = False


def _digest(domain: str, value) -> str:
    return digest_v2(domain, [("value", canonical_json.dumps(value))]).hexdigest


def backup_root(backup_dir: str | os.PathLike | None = None) -> Path:
    """The restore-point directory: ``backup_dir``, else ``settings.NEXUS_BACKUP_DIR``."""
    return Path(backup_dir) if backup_dir else Path(settings.NEXUS_BACKUP_DIR)


def _code_identity() -> dict:
    """The running code: the V1 release digest and the git commit when the tree is a checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=settings.BASE_DIR, capture_output=True, text=True,
                              timeout=30)
        commit = head.stdout.strip() if head.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"v1_release": v1_release(), "git_commit": commit}


# --- the databases of this deployment ------------------------------------------------------------------------
def _databases() -> list[dict]:
    """``[{"alias", "name", "host", "port", "user", "password"}]``: every NexusFlow database, main first."""
    out, seen = [], set()
    for alias in connections:
        cfg = connections[alias].settings_dict
        where = (cfg.get("HOST") or "127.0.0.1", int(cfg.get("PORT") or 3306), cfg["NAME"])
        if where in seen:
            continue
        seen.add(where)
        out.append({"alias": alias, "name": cfg["NAME"], "host": where[0], "port": where[1],
                    "user": cfg.get("USER") or "root", "password": cfg.get("PASSWORD") or ""})
    return out


def _connect(db: dict, *, database: str | None = None):
    return MySQLdb.connect(host=db["host"], port=db["port"], user=db["user"], passwd=db["password"],
                           db=database or db["name"], charset="utf8mb4")


def _client_args(db: dict) -> tuple[list[str], dict]:
    env = {**os.environ, "MYSQL_PWD": db["password"]}
    return [f"--host={db['host']}", f"--port={db['port']}", f"--user={db['user']}"], env


def _facts(db: dict, *, org_id: str | None, schema: str | None = None, include_tables: bool = True) -> dict:
    """The facts of one database in one consistent snapshot (:func:`cutover.selectors.database_content_facts`)."""
    conn = _connect(db, database=schema)
    try:
        cursor = conn.cursor()
        selectors.open_consistent_snapshot(cursor)
        facts = selectors.database_content_facts(cursor, schema=schema or db["name"], org_id=org_id,
                                                 include_tables=include_tables)
        conn.rollback()
        return facts
    finally:
        conn.close()


# --- preconditions -------------------------------------------------------------------------------------------
def _preconditions(org: OrgScope, attempt_key: str, gates: list[AccountServingGate]
                   ) -> tuple[V1ShutdownCertificate | None, dict, list[dict]]:
    """``(certificate, its document, blockers)``: empty blockers when a restore point may be captured now."""
    certificate = V1ShutdownCertificate.objects.filter(org_id=org.org_id, attempt_key=attempt_key).first()
    if certificate is None:
        return None, {}, [blocker(reasons.RESTORE_POINT_NOT_DRAINED, f"attempt.{attempt_key}",
                                  "the attempt has no V1ShutdownCertificate (run cutover certify)")]
    document = json.loads(bytes(certificate.document))
    out = []
    states = sorted({g.state for g in gates})
    if not gates:
        out.append(blocker(reasons.RESTORE_POINT_NOT_DRAINED, "gates", "the org has no AccountServingGate"))
    elif states != ["v1_drained"]:
        past = [s for s in states if s.startswith("v2") or s.endswith("_v2")]
        code = reasons.RESTORE_POINT_V2_MUTATED if past else reasons.RESTORE_POINT_NOT_DRAINED
        out.append(blocker(code, "gates", f"every gate must be v1_drained; gates are {', '.join(states)}"))
    else:
        drained = {e.gate_id: e.evidence for e in GateTransitionEvidence.objects.filter(
            org_id=org.org_id, gate__in=[g.pk for g in gates], to_state="v1_drained")}
        for gate in gates:
            if (drained.get(gate.pk) or {}).get("digest") != certificate.digest:
                out.append(blocker(reasons.RESTORE_POINT_NOT_DRAINED, f"gate.{gate.account_key}",
                                   "the gate did not enter v1_drained under this attempt's V1ShutdownCertificate"))
    reconciliations = sorted([row.account_key, row.digest] for row in CutoverEvidence.objects.filter(
        org_id=org.org_id, attempt_key=attempt_key, kind="v1_reconciliation"))
    if reconciliations != sorted(document.get("reconciliations", [])):
        out.append(blocker(reasons.RESTORE_POINT_NOT_DRAINED, "v1_reconciliation",
                           "the attempt's reconciliation evidence differs from the certified final reconciliation"))
    certified = document.get("v1_release", {}).get("current_tree")
    if certified != v1_release():
        out.append(blocker(reasons.RESTORE_POINT_DRIFT, "v1_release",
                           f"the running V1 release {v1_release()[:16]} is not the certified {str(certified)[:16]}"))
    if selectors.applied_migrations_digest() != document.get("schema_digest"):
        out.append(blocker(reasons.RESTORE_POINT_V2_MUTATED, "schema",
                           "the applied migrations differ from the schema the V1ShutdownCertificate bound"))
    for fact, count in sorted(selectors.v2_mutations_since(org_id=org.org_id, since=certificate.created_at).items()):
        out.append(blocker(reasons.RESTORE_POINT_V2_MUTATED, f"v2.{fact}",
                           f"{count} V2 fact(s) after the V1ShutdownCertificate: the V1 point is gone"))
    return certificate, document, out


def _refuse(org: OrgScope, attempt_key: str, blockers: list[dict], capture: Capture | None = None):
    if capture is not None and capture.path.exists():
        capture.path.rename(capture.path.with_name(capture.path.name + ".rejected"))
    record_blocked(org, attempt_key, PHASE, blockers)
    raise RestorePointRejected(PHASE, blockers)


def _check(org: OrgScope, attempt_key: str) -> tuple[V1ShutdownCertificate, dict]:
    gates = list(AccountServingGate.objects.filter(org_id=org.org_id).order_by("account_key"))
    certificate, document, blockers = _preconditions(org, attempt_key, gates)
    if blockers:
        _refuse(org, attempt_key, blockers)
    return certificate, document


# --- 1. capture ----------------------------------------------------------------------------------------------
def _attempt_dir(org: OrgScope, attempt_key: str, backup_dir) -> Path:
    return backup_root(backup_dir) / org.org_id / attempt_key


def _open_capture(org: OrgScope, attempt_key: str, backup_dir) -> Capture | None:
    """The attempt's latest complete, not rejected capture (resume), or ``None``."""
    root = _attempt_dir(org, attempt_key, backup_dir)
    if not root.is_dir():
        return None
    for path in sorted(root.iterdir(), reverse=True):
        if path.suffix in (".rejected", ".partial") or not (path / MANIFEST_NAME).is_file():
            continue
        try:
            manifest = json.loads((path / MANIFEST_NAME).read_bytes())
        except ValueError:
            continue
        if manifest.get("format") == MANIFEST_FORMAT and manifest.get("attempt_key") == attempt_key:
            return Capture(path, manifest)
    return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _dump(db: dict, target: Path) -> None:
    args, env = _client_args(db)
    with target.open("wb") as out:
        done = subprocess.run(["mariadb-dump", "--no-defaults", *args, *DUMP_FLAGS, db["name"]], stdout=out,
                              stderr=subprocess.PIPE, env=env, timeout=None)
    if done.returncode != 0:
        raise OSError(f"mariadb-dump {db['name']} exited {done.returncode}: "
                      f"{done.stderr.decode('utf-8', 'replace').strip()[:500]}")


def restore_point_capture(*, org: OrgScope, attempt_key: str, backup_dir: str | os.PathLike | None = None
                          ) -> Capture:
    """Capture the full backup of every NexusFlow database for ``attempt_key`` (or resume the open capture).

    Args:
        attempt_key: the attempt ``cutover certify`` certified.
        backup_dir: the restore-point directory (default ``settings.NEXUS_BACKUP_DIR``).

    Returns:
        :class:`Capture`: ``path`` (``<dir>/<org>/<attempt>/<capture>``) and ``manifest``
        ``{"format", "org_id", "attempt_key", "certificate": {"id", "digest"}, "code": {"v1_release",
        "git_commit"}, "schema_digest", "captured_at", "dump": {"tool", "flags"}, "databases": [{"alias",
        "name", "file", "sha256", "bytes", "tables": {table: {"rows", "digest"}}, "migrations_digest"}],
        "v1_facts": {name: {"rows", "digest"}}, "v1_facts_digest"}``.

    Raises:
        InvalidIdentity / CertificateMissing: see :func:`cutover.v1_shutdown.attempt_certificate`.
        RestorePointRejected: a precondition fails (``restore_point_not_drained``, ``restore_point_v2_mutated``,
            ``restore_point_drift``) or ``mariadb-dump`` fails (``restore_point_backup_invalid``).

    Seed 003 "Offline V1 shutdown, cold rollback, and V2 cutover", step 6; proof S003-RP-43.
    """
    attempt_key, _ = attempt_certificate(org, attempt_key)
    certificate, _ = _check(org, attempt_key)
    existing = _open_capture(org, attempt_key, backup_dir)
    if existing is not None:
        return existing
    root = _attempt_dir(org, attempt_key, backup_dir)
    name = f"{db_now().strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
    partial = root / f"{name}.partial"
    partial.mkdir(parents=True)
    databases = []
    try:
        facts = {db["alias"]: _facts(db, org_id=org.org_id if db["alias"] == "default" else None)
                 for db in _databases()}
        for db in _databases():
            target = partial / f"{db['alias']}.sql"
            _dump(db, target)
            databases.append({"alias": db["alias"], "name": db["name"], "file": target.name,
                              "sha256": _sha256(target), "bytes": target.stat().st_size,
                              "tables": facts[db["alias"]]["tables"],
                              "migrations_digest": _digest("cutover.schema", facts[db["alias"]]["migrations"])})
    except (OSError, subprocess.SubprocessError, MySQLdb.Error) as exc:
        shutil.rmtree(partial, ignore_errors=True)
        _refuse(org, attempt_key, [blocker(reasons.RESTORE_POINT_BACKUP_INVALID, "capture", str(exc)[:500])])
    v1_facts = facts["default"]["v1_facts"]
    manifest = {
        "format": MANIFEST_FORMAT, "org_id": org.org_id, "attempt_key": attempt_key,
        "certificate": {"id": int(certificate.pk), "digest": certificate.digest},
        "code": _code_identity(), "schema_digest": selectors.applied_migrations_digest(),
        "captured_at": db_now().isoformat(), "dump": {"tool": "mariadb-dump", "flags": list(DUMP_FLAGS)},
        "databases": databases, "v1_facts": v1_facts, "v1_facts_digest": _digest("cutover.v1-facts", v1_facts),
    }
    (partial / MANIFEST_NAME).write_bytes(canonical_json.dumps(manifest))
    final = root / name
    partial.rename(final)
    return Capture(final, manifest)


# --- 2. rehearsal --------------------------------------------------------------------------------------------
def _file_blockers(capture: Capture) -> list[dict]:
    """Every dump file present, byte-equal to its digest, complete; every database of the deployment covered."""
    out = []
    listed = {d["name"] for d in capture.manifest.get("databases", [])}
    for db in _databases():
        if db["name"] not in listed:
            out.append(blocker(reasons.RESTORE_POINT_BACKUP_INVALID, f"database.{db['alias']}",
                               f"the backup does not hold database {db['name']}: not a complete deployment backup"))
    for entry in capture.manifest.get("databases", []):
        path = capture.path / entry["file"]
        subject = f"file.{entry['file']}"
        if not path.is_file():
            out.append(blocker(reasons.RESTORE_POINT_BACKUP_INVALID, subject, "the dump file is missing"))
            continue
        if _sha256(path) != entry["sha256"] or path.stat().st_size != entry["bytes"]:
            out.append(blocker(reasons.RESTORE_POINT_BACKUP_INVALID, subject,
                               "the dump file's SHA-256 differs from the manifest: corrupt content"))
            continue
        with path.open("rb") as f:
            f.seek(max(0, entry["bytes"] - 256))
            tail = f.read()
        if COMPLETION_MARKER not in tail:
            out.append(blocker(reasons.RESTORE_POINT_BACKUP_INVALID, subject,
                               "the dump has no completion marker: a partial backup"))
    return out


@contextmanager
def rehearsal_server():
    """Run a separate ``mariadbd`` on a fresh data directory; yield ``{"host", "port", "user", "password",
    "version", "seconds"}`` and stop it and remove its directory on exit.

    Raises:
        OSError: the server could not be installed or did not answer within :data:`SERVER_START_SECONDS`.
    """
    workdir = Path(tempfile.mkdtemp(prefix="nexusflow-rehearsal-"))
    as_root = ["--user=root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
    process = None
    log = (workdir / "server.log").open("wb")
    try:
        started = time.monotonic()
        # Its own tmpdir: a starting mariadbd deletes every ``#sql*`` file in its tmpdir as left over from an
        # earlier run of itself, and the shared default (/tmp) holds the live server's temporary tables.
        (workdir / "tmp").mkdir()
        own_tmp = f"--tmpdir={workdir / 'tmp'}"
        install = subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={workdir / 'data'}",
                                  "--auth-root-authentication-method=normal", "--skip-test-db", own_tmp, *as_root],
                                 capture_output=True, timeout=300)
        if install.returncode != 0:
            raise OSError(f"mariadb-install-db exited {install.returncode}: "
                          f"{install.stderr.decode('utf-8', 'replace')[-500:]}")
        installed = time.monotonic()
        port = free_local_port()
        process = subprocess.Popen(
            ["mariadbd", "--no-defaults", f"--datadir={workdir / 'data'}", f"--socket={workdir / 'sock'}",
             f"--port={port}", "--bind-address=127.0.0.1", "--skip-grant-tables", "--skip-log-bin", own_tmp,
             "--innodb-buffer-pool-size=64M", f"--pid-file={workdir / 'server.pid'}", *as_root],
            stdout=log, stderr=subprocess.STDOUT)
        server = {"host": "127.0.0.1", "port": port, "user": "root", "password": "", "name": "mysql"}
        deadline = time.monotonic() + SERVER_START_SECONDS
        while True:
            if process.poll() is not None:
                raise OSError(f"mariadbd exited {process.returncode} before answering: "
                              f"{(workdir / 'server.log').read_text(errors='replace')[-500:]}")
            try:
                conn = _connect(server)
                server["version"] = conn.get_server_info()
                conn.close()
                break
            except MySQLdb.OperationalError:
                if time.monotonic() > deadline:
                    raise OSError("the rehearsal mariadbd did not answer in time") from None
                time.sleep(0.1)
        server["seconds"] = {"install": round(installed - started, 3), "start": round(time.monotonic() - installed, 3)}
        yield server
    finally:
        if process is not None and process.poll() is None:
            process.terminate()  # SIGTERM: mariadbd shuts down cleanly
            try:
                process.wait(SERVER_STOP_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(SERVER_STOP_SECONDS)
        log.close()
        shutil.rmtree(workdir, ignore_errors=True)


def _restore(server: dict, entry: dict, path: Path) -> None:
    args, env = _client_args(server)
    created = subprocess.run(["mariadb-admin", "--no-defaults", *args, "create", entry["name"]],
                             capture_output=True, env=env, timeout=120)
    if created.returncode != 0:
        raise OSError(f"mariadb-admin create {entry['name']}: {created.stderr.decode('utf-8', 'replace')[:300]}")
    with path.open("rb") as dump:
        loaded = subprocess.run(["mariadb", "--no-defaults", *args, "--default-character-set=utf8mb4",
                                 entry["name"]], stdin=dump, capture_output=True, env=env, timeout=None)
    if loaded.returncode != 0:
        raise OSError(f"restoring {entry['file']} exited {loaded.returncode}: "
                      f"{loaded.stderr.decode('utf-8', 'replace')[:500]}")


def _boot_release(server: dict, manifest: dict, names: dict[str, str]) -> dict:
    """Run the release against the restored copy (``manage.py cutover status``); it must read ``v1_drained``."""
    base = f"mysql://root@{server['host']}:{server['port']}/"
    env = {k: v for k, v in os.environ.items() if k not in ("NEXUS_FAILPOINTS", "MYSQL_PWD")}
    env.update({"NEXUS_DB_URL": base + names["default"], "NEXUS_CONTROL_DB_URL": base + names["control"]})
    done = subprocess.run([sys.executable, "manage.py", "cutover", "status", "--org", manifest["org_id"], "--json"],
                          cwd=settings.BASE_DIR, env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise OSError(f"the release could not read the restored copy: {done.stderr.strip()[-500:]}")
    status = json.loads(done.stdout)
    return {"phase": status["phase"], "gates": status["gates"],
            "shutdown_certificate": (status.get("shutdown_certificate") or {}).get("digest")}


def _compare(manifest: dict, restored: dict[str, dict]) -> list[dict]:
    out = []
    for entry in manifest["databases"]:
        facts = restored.get(entry["alias"], {"tables": {}, "migrations": []})
        for table in sorted(set(entry["tables"]) | set(facts["tables"])):
            want, got = entry["tables"].get(table), facts["tables"].get(table)
            if want != got:
                out.append(blocker(reasons.RESTORE_POINT_REHEARSAL_FAILED, f"{entry['alias']}.{table}",
                                   f"the restored copy differs: bound {want}, restored {got}"))
        if _digest("cutover.schema", facts["migrations"]) != entry["migrations_digest"]:
            out.append(blocker(reasons.RESTORE_POINT_REHEARSAL_FAILED, f"{entry['alias']}.django_migrations",
                               "the restored schema (applied migrations) differs from the manifest"))
    v1_facts = restored.get("default", {}).get("v1_facts", {})
    for name in sorted(set(manifest["v1_facts"]) | set(v1_facts)):
        if manifest["v1_facts"].get(name) != v1_facts.get(name):
            out.append(blocker(reasons.RESTORE_POINT_REHEARSAL_FAILED, f"v1_facts.{name}",
                               "the restored V1 facts differ from the ones the manifest binds"))
    return out


def _drift_blockers(org: OrgScope, manifest: dict) -> list[dict]:
    """The org's live V1 facts, schema and release compared with the manifest (drift since the capture)."""
    main = next(db for db in _databases() if db["alias"] == "default")
    live = _facts(main, org_id=org.org_id, include_tables=False)["v1_facts"]
    out = [blocker(reasons.RESTORE_POINT_DRIFT, f"v1_facts.{name}",
                   f"the live {name} changed since the capture (rows {manifest['v1_facts'].get(name, {}).get('rows')}"
                   f" -> {live.get(name, {}).get('rows')})")
           for name in sorted(set(manifest["v1_facts"]) | set(live))
           if manifest["v1_facts"].get(name) != live.get(name)]
    if selectors.applied_migrations_digest() != manifest["schema_digest"]:
        out.append(blocker(reasons.RESTORE_POINT_DRIFT, "schema", "the applied migrations changed since the capture"))
    if v1_release() != manifest["code"]["v1_release"]:
        out.append(blocker(reasons.RESTORE_POINT_DRIFT, "v1_release", "the V1 release changed since the capture"))
    return out


def restore_point_rehearse(*, org: OrgScope, capture: Capture) -> dict:
    """Restore ``capture`` into an isolated ``mariadbd`` and verify every bound digest from the restored copy.

    Args:
        capture: from :func:`restore_point_capture`.

    Returns:
        ``{"server_version", "seconds": {"install", "start", "restore", "verify", "boot", "total"},
        "databases": {alias: {"tables", "rows", "digest"}}, "v1_facts_digest", "boot": {"phase", "gates",
        "shutdown_certificate"}}``: what the rehearsal recomputed from the restored copy.

    Raises:
        RestorePointRejected: a file is missing, corrupt or partial, or the deployment is not fully covered
            (``restore_point_backup_invalid``); the live V1 facts drifted from the manifest
            (``restore_point_drift``); the server could not run, the restore failed, a restored digest, row
            count or V1 fact differs, or the release does not read the restored copy as ``v1_drained`` under
            the certificate (``restore_point_rehearsal_failed``). The capture is renamed ``*.rejected``.

    Seed 003 "Offline V1 shutdown, cold rollback, and V2 cutover", step 6; proof S003-RP-43.
    """
    manifest = capture.manifest
    attempt_key = manifest["attempt_key"]
    blockers = _file_blockers(capture) or _drift_blockers(org, manifest)
    if blockers:
        _refuse(org, attempt_key, blockers, capture)
    began = time.monotonic()
    try:
        with rehearsal_server() as server:
            restored, names = {}, {}
            t0 = time.monotonic()
            for entry in manifest["databases"]:
                _restore(server, entry, capture.path / entry["file"])
                names[entry["alias"]] = entry["name"]
            t1 = time.monotonic()
            for entry in manifest["databases"]:
                restored[entry["alias"]] = _facts(
                    server, schema=entry["name"], org_id=org.org_id if entry["alias"] == "default" else None)
            t2 = time.monotonic()
            blockers = _compare(manifest, restored)
            boot = {}
            if not blockers:
                boot = _boot_release(server, manifest, names)
                if boot["phase"] != "v1_drained" or boot["shutdown_certificate"] != manifest["certificate"]["digest"]:
                    blockers.append(blocker(reasons.RESTORE_POINT_REHEARSAL_FAILED, "release",
                                            f"the release reads the restored copy as {boot['phase']} under "
                                            f"certificate {boot['shutdown_certificate']}"))
            t3 = time.monotonic()
            seconds = {**server["seconds"], "restore": round(t1 - t0, 3), "verify": round(t2 - t1, 3),
                       "boot": round(t3 - t2, 3)}
            version = server["version"]
    except (OSError, subprocess.SubprocessError, MySQLdb.Error, ValueError) as exc:
        blockers = [blocker(reasons.RESTORE_POINT_REHEARSAL_FAILED, "rehearsal", str(exc)[:500])]
    if blockers:
        _refuse(org, attempt_key, blockers, capture)
    seconds["total"] = round(time.monotonic() - began, 3)
    return {
        "server_version": version, "seconds": seconds, "boot": boot,
        "databases": {alias: {"tables": len(f["tables"]), "rows": sum(t["rows"] for t in f["tables"].values()),
                              "digest": _digest("cutover.restored-tables", f["tables"])}
                      for alias, f in restored.items()},
        "v1_facts_digest": _digest("cutover.v1-facts", restored["default"]["v1_facts"]),
    }


# --- 3. record -----------------------------------------------------------------------------------------------
def _report(point: V1RestorePoint, *, already: bool) -> RestorePointReport:
    return RestorePointReport(point.attempt_key, int(point.pk), point.manifest_digest, point.certificate_digest,
                              point.backup_path, point.rehearsal, already=already)


def restore_point_record(*, org: OrgScope, capture: Capture, rehearsal: dict) -> V1RestorePoint:
    """Insert the one V1RestorePoint of ``capture`` (control database) after rereading everything under the gate locks.

    Args:
        capture: a capture :func:`restore_point_rehearse` accepted; ``rehearsal`` its result.

    Raises:
        RestorePointRejected: a precondition fails now or the live V1 facts drifted (``restore_point_drift``);
            nothing is inserted.

    Seed 003 "Offline V1 shutdown, cold rollback, and V2 cutover", step 6; proof S003-RP-43.
    """
    manifest = capture.manifest
    attempt_key = manifest["attempt_key"]
    blockers: list[dict] = []
    with transaction.atomic(durable=True):
        gates = AccountServingGateStore.lock_all(org.org_id)
        certificate, _, blockers = _preconditions(org, attempt_key, gates)
        if not blockers and certificate.digest != manifest["certificate"]["digest"]:
            blockers.append(blocker(reasons.RESTORE_POINT_DRIFT, "certificate",
                                    "the capture binds another V1ShutdownCertificate"))
        blockers = blockers or _drift_blockers(org, manifest)
        if not blockers:
            with transaction.atomic(using="control"):
                point = V1RestorePoint.objects.filter(org_id=org.org_id, attempt_key=attempt_key).first()
                if point is None:
                    point = insert(V1RestorePoint, org_id=org.org_id, attempt_key=attempt_key,
                                   certificate_id=certificate.pk, certificate_digest=certificate.digest,
                                   v1_release=manifest["code"]["v1_release"], schema_digest=manifest["schema_digest"],
                                   backup_path=str(capture.path.resolve()), manifest=capture.manifest_bytes,
                                   manifest_digest=_digest("cutover.restore-manifest", manifest),
                                   rehearsal=rehearsal)
            return point
    _refuse(org, attempt_key, blockers, capture)


def cutover_restore_point(*, org: OrgScope, attempt_key: str, backup_dir: str | os.PathLike | None = None
                          ) -> RestorePointReport:
    """Capture, rehearse and record the V1 restore point of ``attempt_key`` (resumable, idempotent).

    Args:
        attempt_key: the attempt ``cutover certify`` certified.
        backup_dir: where the dump files go (default ``settings.NEXUS_BACKUP_DIR``).

    Returns:
        :class:`RestorePointReport`; ``already`` when the attempt's V1RestorePoint exists (nothing re-run).

    Raises:
        InvalidIdentity / CertificateMissing: see :func:`cutover.v1_shutdown.attempt_certificate`.
        RestorePointRejected: see :func:`restore_point_capture`, :func:`restore_point_rehearse` and
            :func:`restore_point_record` (exit 3); a rerun captures afresh.

    Seed 003 "Offline V1 shutdown, cold rollback, and V2 cutover", step 6; proof S003-RP-43.
    """
    attempt_key, _ = attempt_certificate(org, attempt_key)
    point = V1RestorePoint.objects.filter(org_id=org.org_id, attempt_key=attempt_key).first()
    if point is not None:
        return _report(point, already=True)
    capture = restore_point_capture(org=org, attempt_key=attempt_key, backup_dir=backup_dir)
    failpoints.hit(FP_AFTER_CAPTURE)
    rehearsal = restore_point_rehearse(org=org, capture=capture)
    point = restore_point_record(org=org, capture=capture, rehearsal=rehearsal)
    return _report(point, already=False)


def representative_rehearsal() -> dict:
    """A restore rehearsal of the live main database as it is now (``cutover preflight --rehearse``).

    Dumps the main database (``mariadb-dump --single-transaction``, a consistent snapshot while V1 serves),
    restores it into a separate ``mariadbd`` on its own data directory and port, recomputes every table's
    rows and digest from the restored copy and removes the server: the measured figure the plan's
    ``restore_rehearsal`` budget is checked against before maintenance (the certified restore point of
    ``cutover restore-point`` is rehearsed again on its own).

    Returns:
        ``{"ok": bool, "detail": str, "seconds": {"dump", "install", "start", "restore", "verify", "total"},
        "bytes": int, "tables": int, "server_version": str}``.
    """
    main = next(db for db in _databases() if db["alias"] == "default")
    began = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="nexusflow-preflight-rehearsal-"))
    out: dict = {"ok": False, "detail": "", "seconds": {}, "bytes": 0, "tables": 0, "server_version": ""}
    try:
        target = workdir / "default.sql"
        _dump(main, target)
        out["bytes"] = target.stat().st_size
        dumped = time.monotonic()
        with rehearsal_server() as server:
            t0 = time.monotonic()
            _restore(server, {"name": main["name"], "file": target.name}, target)
            t1 = time.monotonic()
            restored = _facts(server, schema=main["name"], org_id=None)
            out.update(tables=len(restored["tables"]), server_version=server["version"])
            out["seconds"] = {"dump": round(dumped - began, 3), **server["seconds"], "restore": round(t1 - t0, 3),
                              "verify": round(time.monotonic() - t1, 3)}
        out["ok"] = out["tables"] > 0
        out["detail"] = "" if out["ok"] else "the restored copy holds no table"
    except (OSError, subprocess.SubprocessError, MySQLdb.Error) as exc:
        out["detail"] = str(exc)[:500]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    out["seconds"]["total"] = round(time.monotonic() - began, 3)
    return out
