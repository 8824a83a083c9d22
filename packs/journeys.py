"""Journeys: named end-to-end stories against a provider sandbox, run through the real processes.

A journey is registered by a pack module (journeys name a provider, so they
live under ``packs/<pack>/journeys.py``; :data:`JOURNEY_MODULES` lists the
modules) and run with ``manage.py journeys run <name> [--json]``. Each run:

1. drops and recreates its own databases ``<main>_journey`` and
   ``<main>_journey_control`` and migrates them (and collects the static
   files the web server serves);
2. calls the journey's ``stage`` (the pack's set-up: start the provider
   sandbox process, publish packs, credentials and the service configuration,
   ``cutover greenfield``, ``flow_deploy``) through :class:`Harness` helpers;
3. starts the web server (gunicorn) and one ``run_workers`` process per role;
4. calls the journey's ``story``, which drives the system only from outside
   (signed webhooks over HTTP, sandbox controls) and records checks;
5. reports what the provider saw (its requests by method and path, its final
   records) and every check, then stops every process it started.

Exit codes (:func:`run_journey`): 0 every check passed, 1 a check failed,
2 the journey could not run (unknown name, a process or set-up step failed).
"""
from __future__ import annotations

import hashlib
import importlib
import json
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from django.conf import settings

from nexusflow.kernel.net import free_local_port
from packs.demo.run import (
    DemoError,
    Processes,
    _progress_marker,
    _wait_http,
    collect_static,
    db_url,
    manage_failures,
    migrate_databases,
    use_database,
    web_server_argv,
)
from packs.demo.schema import create_migrated_databases

ROOT = Path(settings.BASE_DIR)
#: Pack modules that register journeys (imported by :func:`registry`).
JOURNEY_MODULES = ("packs.hubspot.journeys", "packs.hubspot.conversion_journeys", "packs.hubspot.wait_journeys",
                   "packs.demo.cutover_journeys")
WORKER_ROLES = ("connector", "runtime", "flow", "egress")
IDLE_STABLE_SECONDS = 1.5
STALL_TIMEOUT_SECONDS = 60.0


class JourneyError(Exception):
    """The journey could not run (exit code 2); a failed check exits 1 instead."""


@dataclass(frozen=True)
class Journey:
    """One registered journey.

    Attributes:
        name: the name ``journeys run`` takes (lower case, dashes).
        summary: one line for ``journeys list``.
        stage: ``stage(harness)`` prepares providers and configuration (before web and workers start).
        story: ``story(harness)`` drives the system and records checks (web and workers running).
        provider_report: ``provider_report(harness) -> dict``: what the provider saw, for the report.
    """

    name: str
    summary: str
    stage: Callable[[Harness], None]
    story: Callable[[Harness], None]
    provider_report: Callable[[Harness], dict]


_REGISTRY: dict[str, Journey] = {}


def register(journey: Journey) -> Journey:
    """Register ``journey`` under its name; returns it.

    Raises:
        ValueError: the name is already registered.
    """
    if journey.name in _REGISTRY and _REGISTRY[journey.name] is not journey:
        raise ValueError(f"journey {journey.name!r} is registered twice")
    _REGISTRY[journey.name] = journey
    return journey


def registry() -> dict[str, Journey]:
    """Every registered journey by name (imports :data:`JOURNEY_MODULES` first)."""
    for module in JOURNEY_MODULES:
        importlib.import_module(module)
    return dict(sorted(_REGISTRY.items()))


@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""


@dataclass
class Harness:
    """What a journey's stage and story use: processes, databases, HTTP helpers and checks.

    Helpers raise :class:`JourneyError` when the journey cannot go on; checks
    (:meth:`check`, :meth:`check_equal`) collect failures and never raise.
    """

    name: str
    run_dir: Path
    env: dict
    databases: tuple[str, str]
    say: Callable[..., None]
    procs: Processes = field(default_factory=Processes)
    checks: list[Check] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)
    web_base: str = ""

    # -- set-up ---------------------------------------------------------------------------------
    def manage(self, *args: str) -> str:
        """Run ``manage.py ARGS`` against the journey databases; return its stdout.

        Raises:
            JourneyError: the command exited non-zero (its output is in the message).
        """
        import subprocess

        proc = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=self.env, capture_output=True,
                              text=True)
        if proc.returncode != 0:
            raise JourneyError(f"manage.py {' '.join(args)} failed:\n{proc.stdout}{proc.stderr}")
        self.say(f"journey: {proc.stdout.strip()}")
        return proc.stdout.strip()

    def manage_all(self, *commands: list[str]) -> None:
        """Run several ``manage.py`` commands at once (independent steps, e.g. migrating two databases).

        Raises:
            JourneyError: any of them exited non-zero.
        """
        failed = manage_failures(commands, self.env)
        if failed:
            raise JourneyError("\n".join(failed))

    def start_sandbox(self, name: str, module: str, secret_flag: str, secret: str) -> str:
        """Start ``python -m module --port 0 <secret_flag> secret`` and return its base URL.

        Raises:
            JourneyError: the sandbox did not write its port within 20 s.
        """
        port_file = self.run_dir / f"{name}.port"
        port_file.unlink(missing_ok=True)
        self.procs.start(name, [sys.executable, "-m", module, "--port", "0", secret_flag, secret,
                                "--port-file", str(port_file)], self.env, self.run_dir)
        deadline = time.monotonic() + 20
        while not port_file.exists() or not port_file.read_text().strip():
            if time.monotonic() > deadline:
                raise JourneyError(f"the {name} process did not start (log: {self.run_dir / (name + '.log')})")
            time.sleep(0.1)
        return f"http://127.0.0.1:{int(port_file.read_text())}"

    def write_file(self, name: str, document: Any) -> Path:
        """Write ``document`` as JSON into the run directory; return the path."""
        path = self.run_dir / name
        path.write_text(json.dumps(document, indent=2), encoding="utf-8")
        return path

    def start_web_and_workers(self) -> None:
        """Start gunicorn and one ``run_workers`` process per role of :data:`WORKER_ROLES` (plus the roles a stage
        put in ``values["extra_roles"]``, e.g. ``v1``); wait for health."""
        port = free_local_port()
        self.web_base = f"http://127.0.0.1:{port}"
        self.procs.start("web", web_server_argv(port, workers=1), self.env, self.run_dir)
        for index, role in enumerate((*WORKER_ROLES, *self.values.get("extra_roles", ()))):
            self.procs.start(f"worker-{role}-{index}", [sys.executable, "manage.py", "run_workers", "--role", role],
                             self.env, self.run_dir)
        try:
            _wait_http(self.web_base + "/api/v2/health/")
        except DemoError as exc:
            raise JourneyError(str(exc)) from None
        use_database(*self.databases)

    def restart_worker(self, role: str, *, during: str = "") -> None:
        """Kill the running ``run_workers --role ROLE`` process (SIGKILL, its whole group) and start a new one.

        ``during`` names the moment, for the progress line.

        Raises:
            JourneyError: no worker of ``role`` is running.
        """
        for index, (name, proc) in enumerate(self.procs.procs):
            if name.startswith(f"worker-{role}-") and proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
                del self.procs.procs[index]
                break
        else:
            raise JourneyError(f"no running {role} worker to kill")
        restarts = self.values["worker_restarts"] = self.values.get("worker_restarts", 0) + 1
        self.say(f"journey: killed the {role} worker{' ' + during if during else ''}; starting another")
        self.procs.start(f"worker-{role}-restart{restarts}", [sys.executable, "manage.py", "run_workers", "--role",
                                                               role], self.env, self.run_dir)

    # -- driving the system ---------------------------------------------------------------------------
    def post_webhook(self, events: list[dict], *, account_key: str, channel: str, secret: bytes) -> int:
        """POST one webhook batch to the real ingress, signed by the pack's sender; return the HTTP status.

        Raises:
            JourneyError: the request failed below HTTP, or the ingress did not accept it (2xx).
        """
        from packs.hubspot.sender import Delivery, deliver_all

        url = f"{self.web_base}/api/v2/ingress/{account_key}/{channel}/"
        try:
            [result] = deliver_all([Delivery(events)], url=url, secret=secret)
        except httpx.HTTPError as exc:
            raise JourneyError(f"webhook to {url} failed: {exc}") from None
        if not 200 <= result.status < 300:
            raise JourneyError(f"webhook to {url} answered {result.status}: {result.response}")
        return result.status

    def wait_until(self, what: str, predicate: Callable[[], bool], *, timeout: float = 30.0) -> None:
        """Wait until ``predicate()`` holds (polling); a synchronisation point, not an assertion.

        Raises:
            JourneyError: it did not hold within ``timeout`` seconds, or a process exited.
        """
        deadline = time.monotonic() + timeout
        while not predicate():
            self._require_processes()
            if time.monotonic() > deadline:
                raise JourneyError(f"timed out waiting until {what}")
            time.sleep(0.1)

    def wait_idle(self) -> dict[str, int]:
        """Wait until no work is open (reconcilable parked effects included) for a stable moment.

        Returns:
            The open-work counts at the end (all zero when idle was reached).

        Raises:
            JourneyError: a process exited, or nothing progressed for :data:`STALL_TIMEOUT_SECONDS`.
        """
        idle_since, last_marker, last_change = None, None, time.monotonic()
        while True:
            self._require_processes()
            counts = open_work()
            marker = _progress_marker()
            now = time.monotonic()
            if marker != last_marker:
                last_marker, last_change = marker, now
            if sum(counts.values()) == 0:
                idle_since = idle_since or now
                if now - idle_since >= IDLE_STABLE_SECONDS:
                    return counts
            else:
                idle_since = None
            if now - last_change > STALL_TIMEOUT_SECONDS:
                raise JourneyError(f"no progress for {STALL_TIMEOUT_SECONDS:.0f} s; open work: {counts}")
            time.sleep(0.2)

    def _require_processes(self) -> None:
        for name, proc in self.procs.procs:
            if proc.poll() is not None:
                raise JourneyError(f"process {name} exited early with code {proc.returncode} "
                                   f"(log: {self.run_dir / (name + '.log')})")

    # -- checks -------------------------------------------------------------------------------------------
    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        """Record one check; returns ``ok``."""
        self.checks.append(Check(name, bool(ok), "" if ok else detail))
        return bool(ok)

    def check_equal(self, name: str, actual: Any, expected: Any) -> bool:
        """Record that ``actual == expected`` (the detail shows both when it fails)."""
        return self.check(name, actual == expected, f"expected {expected!r}, got {actual!r}")

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]


def open_work() -> dict[str, int]:
    """The demo's open-work counts plus parked effects a worker resolves on its own (``reconcilable``).

    ``reconcilable`` counts the ``uncertain`` effects parked as create
    conflicts, which the egress reconciler settles by a verify read; other
    ``uncertain`` effects may wait for an operator and are not waited for.
    """
    from nexusflow.kernel import workers

    return workers.open_work(parked=("reconcilable",))


# -- correlation: which provider request did what send ------------------------------------------------------
def request_key(method: str, path: str, body: bytes) -> tuple[str, str, str]:
    """``(METHOD, path, hex SHA-256 of the exact body bytes)``: how a provider request is told apart on the wire."""
    return method.upper(), path, hashlib.sha256(body).hexdigest()


@dataclass(frozen=True)
class Attributed:
    """One provider request and what sent it.

    Attributes:
        request: the provider's request log entry (``seq``, ``method``, ``path``, ``body_sha256``).
        command_id: the OutboundCommand whose push attempt sent it; ``None`` when no push attempt did.
        attempt_id: that RemoteEffectAttempt's id, or ``None``.
        own: the journey sent it itself (e.g. seeding the provider before the story).
    """

    request: dict
    command_id: int | None = None
    attempt_id: int | None = None
    own: bool = False


def attribute_requests(log: list[dict], *, path_prefix: str = "",
                       own: list[tuple[str, str, str]] = ()) -> list[Attributed]:
    """Attribute each request a provider logged to what sent it, by correlation (never by when it arrived).

    A request is the journey's own when it matches one of ``own`` (:func:`request_key` values, each pairs
    with one request), else the push attempt of the egress adapter that sent exactly those bytes: a
    ``RemoteEffectAttempt`` whose Permit crossed into ``sending`` (``io_may_have_started_at`` set), with the
    same method, ``path_prefix + attempt.path`` and SHA-256 of ``request_body``. Requests identical on the
    wire are paired with such attempts in send order (the Permit's I/O start, then the attempt id); a request
    left without an unpaired attempt is attributed to nothing (``command_id`` None). Reads the egress adapter
    makes outside an attempt (a create-conflict verify GET) are attributed to nothing.

    Args:
        log: the provider's request log, oldest first (each entry ``method``, ``path``, ``body_sha256``).
        path_prefix: the path of the provider base URL the push bindings name (``""`` for a bare host).
        own: keys of the requests the journey itself sent to the provider.

    Returns:
        One :class:`Attributed` per log entry, in log order.
    """
    from connectors.models import DispatchPermit

    sent: dict[tuple[str, str, str], list[tuple[int, int]]] = {}
    permits = (DispatchPermit.objects.filter(io_may_have_started_at__isnull=False)
               .select_related("attempt__effect").order_by("io_may_have_started_at", "attempt_id"))
    for permit in permits:
        attempt = permit.attempt
        key = request_key(attempt.method, path_prefix + attempt.path, bytes(attempt.request_body))
        sent.setdefault(key, []).append((int(attempt.effect.command_id), int(attempt.pk)))
    unpaired_own = list(own)
    out = []
    for entry in log:
        key = (entry["method"].upper(), entry["path"], entry["body_sha256"])
        if key in unpaired_own:
            unpaired_own.remove(key)
            out.append(Attributed(entry, own=True))
        elif sent.get(key):
            command_id, attempt_id = sent[key].pop(0)
            out.append(Attributed(entry, command_id=command_id, attempt_id=attempt_id))
        else:
            out.append(Attributed(entry))
    return out


def journey_report(harness: Harness, journey: Journey, provider: dict) -> dict:
    """The report ``journeys run`` prints: checks, provider view and the verdict."""
    return {"journey": journey.name, "ok": not harness.failures and bool(harness.checks),
            "checks": [{"check": c.name, "ok": c.ok, **({"detail": c.detail} if c.detail else {})}
                       for c in harness.checks],
            "provider": provider}


def _print_text(report: dict) -> None:
    print(f"journey {report['journey']}: {'PASS' if report['ok'] else 'FAIL'}")
    print("provider requests (method path: count):")
    for route, count in sorted(report["provider"].get("requests_by_route", {}).items()):
        print(f"  {route}: {count}")
    for key, rows in report["provider"].items():
        if key == "requests_by_route":
            continue
        if not isinstance(rows, (list, dict)):
            print(f"provider {key}: {rows}")
            continue
        print(f"provider {key}:")
        for row in rows if isinstance(rows, list) else [rows]:
            print(f"  {json.dumps(row, sort_keys=True)}")
    print("checks:")
    for check in report["checks"]:
        print(f"  [{'ok' if check['ok'] else 'FAILED'}] {check['check']}"
              + (f": {check['detail']}" if check.get("detail") else ""))


def journey_database_names(main: str) -> tuple[str, str]:
    """A journey run's own (main, control) databases for the main database name ``main``.

    ``(<main>_journey, <main>_journey_control)``; ``make db`` grants them
    (``scripts/create_databases.py``).
    """
    return f"{main}_journey", f"{main}_journey_control"


def run_journey(name: str, *, as_json: bool = False, report_out: dict | None = None,
                options: dict | None = None) -> int:
    """Run one journey end to end; return the exit code (0 pass, 1 a check failed, 2 could not run).

    Args:
        name: a registered journey name (see :func:`registry`).
        as_json: print the report as one JSON object (progress goes to stderr).
        report_out: when given, filled with the report (tests read it).
        options: journey options (``{"events": PATH}``), in the harness's ``values["options"]``.
    """
    journeys = registry()
    journey = journeys.get(name)
    if journey is None:
        print(f"journeys: unknown journey {name!r}; known: {', '.join(journeys) or 'none'}", file=sys.stderr)
        return 2
    say = (lambda *a: print(*a, file=sys.stderr)) if as_json else print
    cfg = settings.DATABASES["default"]
    databases = journey_database_names(cfg["NAME"])
    run_dir = ROOT / "var" / "journeys" / name
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    env = {**os.environ, "NEXUS_DB_URL": db_url(cfg, databases[0]),
           "NEXUS_CONTROL_DB_URL": db_url(cfg, databases[1]), "NEXUS_SECRETS_DIR": str(run_dir / "secrets"),
           "PYTHONUNBUFFERED": "1"}
    env.pop("NEXUS_FAILPOINTS", None)
    harness = Harness(name=name, run_dir=run_dir, env=env, databases=databases, say=say)
    harness.values["options"] = dict(options or {})
    original = {alias: dict(connection_settings) for alias, connection_settings in
                ((a, settings.DATABASES[a]) for a in ("default", "control"))}

    def _terminated(signum, frame):
        raise JourneyError(f"stopped by signal {signum}")

    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminated) if main_thread else None
    try:
        started = time.monotonic()
        say(f"journey {name}: recreating databases {', '.join(databases)}")
        create_migrated_databases(cfg, *databases, migrate=lambda main, control: migrate_databases(
            {**env, "NEXUS_DB_URL": db_url(cfg, main), "NEXUS_CONTROL_DB_URL": db_url(cfg, control)}))
        collect_static(harness.env)
        say(f"journey {name}: migrated in {time.monotonic() - started:.1f} s")
        journey.stage(harness)
        harness.start_web_and_workers()
        say(f"journey {name}: staged at {time.monotonic() - started:.1f} s (since the start)")
        journey.story(harness)
        say(f"journey {name}: story done at {time.monotonic() - started:.1f} s (since the start)")
        report = journey_report(harness, journey, journey.provider_report(harness))
    except (JourneyError, DemoError) as exc:
        print(f"journey {name}: could not run: {exc}\nlogs: {run_dir}", file=sys.stderr)
        return 2
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
        harness.procs.stop_all()
        use_database(original["default"]["NAME"], original["control"]["NAME"])
    if report_out is not None:
        report_out.update(report)
    if as_json:
        print(json.dumps(report))
    else:
        _print_text(report)
    return 0 if report["ok"] else 1
