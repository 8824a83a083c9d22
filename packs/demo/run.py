"""The demo: the main job end to end on the bundled provider input.

Starts the billing sandbox, the web server and one worker process per role
as real processes on 127.0.0.1, activates a fresh install with
``cutover greenfield``, posts every delivery of a webhook file over HTTP
signed like the provider, waits until no work is left, checks the
invariants, prints a summary and stops every process it started.

Each run uses its own databases (``<main>_demo`` and ``<main>_demo_control``),
dropped and recreated, and a fresh sandbox, so no run sees another's state.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import MySQLdb
from django.conf import settings
from django.db import connections

from nexusflow.kernel.net import free_local_port
from packs.demo.common import KEEPALIVE_SECONDS, DemoError, attention_effects, attention_flow_runs, web_server_argv
from packs.demo.schema import create_migrated_databases

ROOT = Path(settings.BASE_DIR)
SERVICE_FILE = ROOT / "packs" / "demo" / "service.json"
WORKER_ROLES = ("connector", "connector", "runtime", "flow", "egress")
IDLE_STABLE_SECONDS = 2.0
STALL_TIMEOUT_SECONDS = 60.0
TOTAL_TIMEOUT_SECONDS = 900.0


@dataclass
class Processes:
    procs: list[tuple[str, subprocess.Popen]] = field(default_factory=list)

    def start(self, name: str, argv: list[str], env: dict, log_dir: Path) -> subprocess.Popen:
        with open(log_dir / f"{name}.log", "ab") as log:  # the child keeps its own descriptor
            proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        self.procs.append((name, proc))
        return proc

    def stop_all(self) -> None:
        for _name, proc in reversed(self.procs):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        for _name, proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()


def demo_database_names(main: str) -> tuple[str, str]:
    """The demo's own (main, control) databases for the main database name ``main``.

    ``(<main>_demo, <main>_demo_control)``; ``make db`` grants them
    (``scripts/create_databases.py``).
    """
    return f"{main}_demo", f"{main}_demo_control"


def db_url(cfg: dict, name: str) -> str:
    """``mysql://user:password@host:port/name`` for database ``name`` on the server of settings ``cfg``."""
    return f"mysql://{cfg['USER']}:{cfg['PASSWORD']}@{cfg['HOST'] or '127.0.0.1'}:{cfg['PORT'] or 3306}/{name}"


def recreate_databases(cfg: dict, names: list[str]) -> None:
    """Drop and create each database of ``names`` (utf8mb4) on the server of ``cfg``, as ``cfg``'s user.

    Raises:
        MySQLdb.Error: the server refused (for example, the user may not create that name).
    """
    conn = MySQLdb.connect(host=cfg["HOST"] or "127.0.0.1", port=int(cfg["PORT"] or 3306), user=cfg["USER"],
                           password=cfg["PASSWORD"])
    try:
        cursor = conn.cursor()
        for name in names:
            cursor.execute(f"DROP DATABASE IF EXISTS `{name}`")
            cursor.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci")
    finally:
        conn.close()


def manage_failures(commands: Sequence[list[str]], env: dict) -> list[str]:
    """Run the ``manage.py`` ``commands`` side by side with ``env``; one message per command that exited non-zero.

    Each message names the command and holds its output (stdout and stderr).
    """
    running = [(args, subprocess.Popen([sys.executable, "manage.py", *args], cwd=ROOT, env=env, text=True,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
               for args in commands]
    failed = []
    for args, proc in running:
        output, _ = proc.communicate()
        if proc.returncode != 0:
            failed.append(f"manage.py {' '.join(args)} failed:\n{output}")
    return failed


def migrate_databases(env: dict) -> None:
    """``manage.py migrate`` for the ``default`` and the ``control`` database that ``env`` names, side by side.

    Raises:
        DemoError: either exited non-zero (its output in the message).
    """
    failed = manage_failures([["migrate", "--noinput", "-v0"], ["migrate", "--noinput", "-v0", "--database", "control"]],
                             env)
    if failed:
        raise DemoError("\n".join(failed))


def _manage(args: list[str], env: dict) -> str:
    proc = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise DemoError(f"manage.py {' '.join(args)} failed:\n{proc.stdout}{proc.stderr}")
    return proc.stdout.strip()


def _static_stamp(static_root: Path) -> Path:
    """Touched beside (never inside: it would be served) the static root after :func:`collect_static` ran."""
    return static_root.parent / f"{static_root.name}.collected"


def static_current(static_root: Path) -> bool:
    """``static_root`` holds a ``collectstatic`` newer than every static source file the finders list."""
    from django.contrib.staticfiles.finders import get_finders

    stamp = _static_stamp(static_root)
    if not stamp.exists():
        return False
    collected_at = stamp.stat().st_mtime
    for finder in get_finders():
        for path, storage in finder.list([]):
            if os.path.getmtime(storage.path(path)) > collected_at:
                return False
    return True


def collect_static(env: dict) -> None:
    """``manage.py collectstatic`` for the web process that serves the admin's assets (WhiteNoise), unless the
    static root of ``env`` already holds a collection newer than every source file (then nothing would change).

    Raises:
        DemoError: ``collectstatic`` failed.
    """
    static_root = Path(env.get("NEXUS_STATIC_ROOT") or settings.STATIC_ROOT)
    if static_current(static_root):
        return
    began = time.time()
    _manage(["collectstatic", "--noinput", "-v0"], env)
    stamp = _static_stamp(static_root)
    stamp.touch()
    os.utime(stamp, (began, began))  # a source file changed while it ran is newer than the stamp


def _wait_http(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1.0)
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise DemoError(f"{url} did not answer within {timeout:.0f} s")


def service_secrets_env(run_dir: Path) -> dict[str, str]:
    """Fresh secrets of one run of the demo service, as the environment its processes read.

    Returns ``NEXUS_DEMO_WEBHOOK_SECRET`` (the CRM's webhook signing secret,
    48 hex digits), ``NEXUS_DEMO_BILLING_API_KEY`` (the billing sandbox's API
    key) and ``NEXUS_SECRETS_DIR`` (``run_dir/secrets``: the run's own
    versioned secret backend, emptied here as the run's databases are
    recreated); ``service.json``'s credential generations name the first two.
    """
    secrets_dir = run_dir / "secrets"
    shutil.rmtree(secrets_dir, ignore_errors=True)
    return {"NEXUS_DEMO_WEBHOOK_SECRET": secrets.token_hex(24),
            "NEXUS_DEMO_BILLING_API_KEY": "sk_demo_" + secrets.token_hex(12), "NEXUS_SECRETS_DIR": str(secrets_dir)}


def start_billing_sandbox(procs: Processes, *, env: dict, run_dir: Path) -> str:
    """Start the billing sandbox on a free port of 127.0.0.1; return its base URL (``http://127.0.0.1:PORT``).

    It reads the API key from ``env["NEXUS_DEMO_BILLING_API_KEY"]``, never its command line (see
    :func:`service_secrets_env`) and logs to ``run_dir/billing-sandbox.log``.

    Raises:
        DemoError: it did not write its port within 20 s.
    """
    port_file = run_dir / "billing.port"
    port_file.unlink(missing_ok=True)
    # The key travels in the environment, never on the command line (which every local user can read).
    procs.start("billing-sandbox", [sys.executable, "-m", "packs.billing.sandbox", "--port", "0",
                                    "--secret-env", "NEXUS_DEMO_BILLING_API_KEY", "--port-file", str(port_file)],
                env, run_dir)
    deadline = time.monotonic() + 20
    while not port_file.exists() or not port_file.read_text().strip():
        if time.monotonic() > deadline:
            raise DemoError("the billing sandbox did not start")
        time.sleep(0.1)
    return f"http://127.0.0.1:{int(port_file.read_text())}"


def service_activate(service: dict, *, env: dict, run_dir: Path, billing_url: str, say,
                     flows: list[str] | None = None, v1: bool = False) -> None:
    """Make ``service`` (``packs/demo/service.json``) serve in the databases of ``env``.

    Publishes its packs and credential generations, applies its configuration
    (accounts, the billing account at ``billing_url``), activates it with
    ``cutover greenfield`` and deploys ``flows`` (repository-relative paths;
    default: the service's ``flows``). ``say`` gets one line per step. With
    ``v1`` it installs the V1 service instead (``cutover v1-install``) and
    deploys no Flow (V1 runs none).

    Raises:
        DemoError: a step's ``manage.py`` command failed (its output is in the message).
    """
    config = json.loads(json.dumps({"org_id": service["org_id"], "accounts": service["accounts"]})
                        .replace("{billing_base_url}", billing_url))
    config_path = run_dir / "service.json"
    config_path.write_text(json.dumps(config, indent=2), encoding="utf-8")
    org = service["org_id"]
    say(_manage(["connector_pack_publish", *[str(ROOT / p) for p in service["packs"]]], env))
    credentials_path = run_dir / "credentials.json"
    credentials_path.write_text(json.dumps(service["credential_generations"], indent=2), encoding="utf-8")
    say(_manage(["connector_credential_publish", "--org", org, str(credentials_path)], env))
    say(_manage(["connector_config_apply", "--org", org, str(config_path)], env))
    if v1:
        say(_manage(["cutover", "v1-install", "--org", org], env))
        return
    say(_manage(["cutover", "greenfield", "--org", org], env))
    flows = service["flows"] if flows is None else flows
    if flows:
        say(_manage(["flow_deploy", "--org", org, *[str(ROOT / f) for f in flows]], env))


def ingress_url(service: dict, base: str) -> str:
    """The full webhook URL of ``service``'s ingress on the web server at ``base`` (``http://host:port``)."""
    ingress = service["ingress"]
    return f"{base}/api/v2/ingress/{ingress['account_key']}/{ingress['channel']}/"


def use_database(main: str, control: str) -> None:
    """Point this process's ``default`` and ``control`` connections at databases ``main`` and ``control``."""
    for alias, name in (("default", main), ("control", control)):
        conn = connections[alias]
        conn.close()
        conn.settings_dict["NAME"] = name


def _work_counts() -> dict[str, int]:
    """Work not yet in a terminal or intentionally parked state, per authority (the apps' registered counters).

    Parked ``uncertain`` effects are not waited for: the summary reports them
    (``uncertain_effects``) and its invariants judge them.
    """
    from nexusflow.kernel.workers import open_work

    return open_work()


def _progress_marker() -> tuple:
    from connectors.models import Execution, RemoteEffect
    from nexusflow.flows.models import FlowRun

    return (Execution.objects.exclude(state="ready").count(), RemoteEffect.objects.exclude(state="prepared").count(),
            FlowRun.objects.filter(state__in=("Succeeded", "TerminalFailed", "Quarantined", "Cancelled")).count(),
            RemoteEffect.objects.filter(state="finalized").count())


def _wait_idle(procs: Processes) -> dict[str, int]:
    start = time.monotonic()
    idle_since = None
    last_marker, last_change = None, time.monotonic()
    while True:
        for name, proc in procs.procs:
            if proc.poll() is not None:
                raise DemoError(f"process {name} exited early with code {proc.returncode}")
        counts = _work_counts()
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
        if now - last_change > STALL_TIMEOUT_SECONDS or now - start > TOTAL_TIMEOUT_SECONDS:
            return counts
        time.sleep(0.3)


class TimedPoster:
    """POST signed deliveries one at a time over one keep-alive HTTP client, timing each request.

    The provider side of ``make bench``'s admission figures: :meth:`post` is
    :func:`packs.hubspot.sender.deliver_all` of one delivery (a 503 or 429
    answer is retried after ``Retry-After`` as the provider does, and the time
    includes those retries), timed with the client's monotonic clock. Use it
    as a context manager (the client is closed on exit).

    Args:
        url: the full ingress URL (also the signed URL).
        secret: the webhook client secret (non-empty bytes).
    """

    def __init__(self, *, url: str, secret: bytes):
        from packs.hubspot.sender import REQUEST_TIMEOUT_SECONDS

        self.url, self.secret = url, secret
        # An idle connection is dropped here before the web server drops it (gunicorn closes one idle for
        # KEEPALIVE_SECONDS): a request never goes out on a socket the server is closing (a reset, not an answer).
        self._http = httpx.Client(timeout=REQUEST_TIMEOUT_SECONDS,
                                  limits=httpx.Limits(keepalive_expiry=KEEPALIVE_SECONDS / 2))

    def __enter__(self) -> TimedPoster:
        return self

    def __exit__(self, *exc) -> None:
        self._http.close()

    def post(self, delivery: Any) -> tuple[int, float]:
        """POST ``delivery``; return ``(final HTTP status, seconds from the first request to the last answer)``.

        Raises:
            DemoError: the request failed below HTTP (refused, reset, timed out).
        """
        from packs.hubspot.sender import deliver_all

        began = time.perf_counter()
        try:
            (result,) = deliver_all([delivery], url=self.url, secret=self.secret, client=self._http)
        except httpx.TransportError as exc:
            raise DemoError(f"POST {self.url} failed: {type(exc).__name__}: {exc}") from exc
        return result.status, time.perf_counter() - began


#: Chaos demo: a delivery whose requests keep failing for this long stops the demo (exit 2).
RESEND_DEADLINE_SECONDS = 120.0
RESEND_WAIT_SECONDS = (0.2, 1.0)  # first wait, cap; doubled per failed request


class ResendingPoster(threading.Thread):
    """Post every delivery in order, resending one whose HTTP request failed, as a provider does.

    A request *failed* when it raised :class:`httpx.TransportError` (refused,
    reset, timed out: the web process died or restarts) or was answered 5xx
    other than 503; it is sent again with the same body, re-signed with a fresh
    timestamp, after a wait doubling from 0.2 s to 1 s. 503 and 429 are retried
    after ``Retry-After`` as :mod:`packs.hubspot.sender` does. After
    :data:`RESEND_DEADLINE_SECONDS` of failures for one delivery the thread
    stops with ``error`` set.

    Attributes (read after ``done`` is set): ``results`` (one
    :class:`packs.hubspot.sender.DeliveryResult` per delivery), ``resends``
    (requests sent again after a failed one), ``error`` (``None`` or a message).
    """

    def __init__(self, deliveries: Sequence[Any], *, url: str, secret: bytes):
        super().__init__(name="chaos-poster", daemon=True)
        self.deliveries, self.url, self.secret = list(deliveries), url, secret
        self.results: list[Any] = []
        self.resends = 0
        self.error: str | None = None
        self.done = threading.Event()

    def run(self) -> None:
        from packs.hubspot import webhook_route

        auth = webhook_route()["auth"]
        try:
            with httpx.Client(timeout=10.0) as http:
                for index, delivery in enumerate(self.deliveries):
                    result = self._deliver(index, delivery, http, auth)
                    if result is None:
                        return
                    self.results.append(result)
        except Exception as exc:  # reported by the supervisor as a demo error, never swallowed
            self.error = f"poster crashed: {type(exc).__name__}: {exc}"
        finally:
            self.done.set()

    def _deliver(self, index: int, delivery: Any, http: httpx.Client, auth: dict):
        from packs.hubspot.sender import (
            MAX_TRIES,
            RETRY_STATUSES,
            DeliveryResult,
            _json_or_none,
            _retry_wait_seconds,
            signed_headers,
        )

        body = delivery.body_bytes()
        attempts = busy = 0
        wait = RESEND_WAIT_SECONDS[0]
        failing_since = None
        while True:
            attempts += 1
            headers = {"Content-Type": "application/json"}
            headers.update(signed_headers(delivery, auth=auth, url=self.url, secret=self.secret,
                                          now_epoch_seconds=time.time()))
            try:
                response = http.post(self.url, content=body, headers=headers)
            except httpx.TransportError as exc:
                failure = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code in RETRY_STATUSES and busy + 1 < MAX_TRIES:
                    busy += 1
                    time.sleep(_retry_wait_seconds(response.headers.get("Retry-After")))
                    continue
                if response.status_code < 500 or response.status_code in RETRY_STATUSES:
                    return DeliveryResult(index=index, status=response.status_code,
                                          response=_json_or_none(response),
                                          retry_after=response.headers.get("Retry-After"), attempts=attempts)
                failure = f"HTTP {response.status_code}"
            now = time.monotonic()
            failing_since = failing_since or now
            if now - failing_since > RESEND_DEADLINE_SECONDS:
                self.error = (f"delivery {index} got no answer for {RESEND_DEADLINE_SECONDS:g} s "
                              f"(last: {failure})")
                return None
            self.resends += 1
            time.sleep(wait)
            wait = min(wait * 2, RESEND_WAIT_SECONDS[1])


def _run_chaos(seed: int, *, procs: Processes, env: dict, run_dir: Path, web_port: int, url: str,
               deliveries: list, secret: bytes, databases: tuple[str, str], say) -> tuple[Any, list, dict[str, int]]:
    """Start the slot processes under a ChaosSupervisor, post with resends, supervise until drained.

    Returns ``(supervisor, delivery results, open-work counts)``; the counts
    are #2's (``uncertain_effects`` is reported by the summary itself).

    Raises:
        DemoError: the web server never answered, a process crashed other than
            by a chaos kill, or a delivery could not be posted.
    """
    from nexusflow.kernel.workers import open_work
    from packs.demo.chaos import ChaosSupervisor

    supervisor = ChaosSupervisor(seed=seed, procs=procs, env=env, run_dir=run_dir, web_port=web_port, say=say)
    say(f"demo: chaos seed {seed}: {len(supervisor.schedule)} planned arms: "
        + ", ".join(f"{a.slot}@{a.failpoint}" for a in supervisor.schedule))
    supervisor.start()
    _wait_http(url.split("/api/")[0] + "/api/v2/health/", timeout=60)
    use_database(*databases)
    say(f"demo: posting {len(deliveries)} deliveries to {url} (failed requests are resent)")
    poster = ResendingPoster(deliveries, url=url, secret=secret)
    poster.start()
    # Reconciliation is work too: under chaos, every ``uncertain`` effect is waited for.
    supervisor.run(poster, work_counts=lambda: open_work(parked=("uncertain_effects",)),
                   progress_marker=_progress_marker)
    supervisor.resent_requests = poster.resends
    say(f"demo: chaos done: {len(supervisor.kills)} kills, {poster.resends} requests resent")
    counts = _work_counts()
    return supervisor, poster.results, counts


def _inbound_field_map(service: dict) -> dict[str, str]:
    from connectors.contracts.pack_document import load_pack

    account = next(a for a in service["accounts"] if a["account_key"] == service["ingress"]["account_key"])
    route = load_pack(account["pack"]).route_for_channel(service["ingress"]["channel"], account["routes"])
    return route["application"]["field_map"]


def reason_class_counts() -> dict[str, Any]:
    """Rows that carry a reason code now, by the code's severity class (docs/operations.md "What `make demo` does").

    Every row of every installed model with a ``reason_code`` column counts
    once (a row carries a code only while it is halted, refused, superseded
    or quarantined). Returns ``{"attention": int, "benign": int,
    "attention_codes": {code: int}}``; ``attention`` is the trouble count, the
    rows an operator must look at; ``benign`` the expected, recorded outcomes.
    ARCHITECTURE.md section 6, "Reason codes".
    """
    from django.apps import apps
    from django.db.models import Count

    from nexusflow.kernel.reasons import ATTENTION, BENIGN, load_all_reasons

    reasons = load_all_reasons()
    by_code: Counter[str] = Counter()
    for model in apps.get_models():
        if not any(f.name == "reason_code" for f in model._meta.concrete_fields):
            continue
        for row in model.objects.exclude(reason_code="").values("reason_code").annotate(n=Count("pk")).order_by():
            by_code[row["reason_code"]] += row["n"]
    classes = {code: reasons[code].severity_class for code in by_code}
    return {"attention": sum(n for code, n in by_code.items() if classes[code] == ATTENTION),
            "benign": sum(n for code, n in by_code.items() if classes[code] == BENIGN),
            "attention_codes": {code: n for code, n in sorted(by_code.items()) if classes[code] == ATTENTION}}


def _local_state(service: dict) -> dict[str, dict[str, Any]]:
    from connectors.models import RemoteLink
    from nexusflow.records.models import Record

    push = service["push"]
    out: dict[str, dict[str, Any]] = {}
    links = RemoteLink.objects.filter(owner_key=push["inbound_owner_key"],
                                      destination_slot_id=push["inbound_destination_slot_id"], state="active")
    records = {r.record_key: r for r in Record.objects.filter(object_name=push["object"], is_deleted=False)}
    for link in links:
        record = records.get(link.source_record_key)
        if record is None:
            continue
        entry = {name: record.fields.get(name) for name in
                 [push["email_field"], *push["name_fields"], push["stage_field"]]}
        entry[push["mirror_field"]] = record.mirrors.get(push["mirror_field"])
        entry["_record_key"] = record.record_key
        out[link.remote_id] = entry
    return out


def _summary(service: dict, results: list, remote: dict, expected: dict, counts: dict) -> tuple[dict, list[str], dict]:
    from connectors.models import Event, Execution, ReceiptComponent, RemoteEffect, RemoteLink
    from nexusflow.flows.models import FlowRun
    from nexusflow.kernel.reasons import BENIGN, codes_of_class

    push = service["push"]
    local = _local_state(service)
    trouble = attention_effects()
    failed_runs = attention_flow_runs()
    customers = remote["customers"]
    push_links = RemoteLink.objects.filter(action_type="PushToConnector", state="active")
    linked_ids = {link.remote_id: link.source_record_key for link in push_links}
    duplicates = sum(1 for c in customers if c["id"] not in linked_ids)
    summary = {
        "deliveries": len(results),
        "accepted": sum(1 for r in results if r.status == 202),
        "redeliveries": sum(1 for r in results if r.status == 200),
        "rejected": sum(1 for r in results if r.status is not None and 400 <= r.status < 500),
        "events_admitted": Event.objects.count(),
        "executions_completed": Execution.objects.filter(state="completed").count(),
        "superseded": Execution.objects.filter(state="superseded").count(),
        "quarantined": ReceiptComponent.objects.filter(disposition="quarantined").count(),
        "remote_creates": len(customers),
        "remote_updates": sum(c.get("update_requests", 0) for c in customers),
        "duplicate_remote_creates": duplicates,
        "uncertain_effects": RemoteEffect.objects.filter(state="uncertain").count(),
        "quarantined_effects": RemoteEffect.objects.filter(state="quarantined").count(),
        "attention_effects": len(trouble),
        "benign_effects": RemoteEffect.objects.filter(reason_code__in=sorted(codes_of_class(BENIGN))).count(),
        "flow_runs_ended": FlowRun.objects.filter(state__in=("TerminalFailed", "Quarantined")).count(),
        "attention_flow_runs": len(failed_runs),
        **reason_class_counts(),
        "nonterminal": sum(counts.values()),
    }
    failures: list[str] = []
    if trouble:
        failures.append(f"{len(trouble)} effects need an operator (attention reason codes): "
                        f"{json.dumps(trouble[:5])}")
    if failed_runs:
        failures.append(f"{len(failed_runs)} flow runs need an operator (attention reason codes): "
                        f"{json.dumps(failed_runs[:5])}")
    field_map = service["push"]["inbound_field_map"]
    for object_id, props in expected.items():
        row = local.get(object_id)
        if row is None:
            failures.append(f"contact {object_id}: no local record")
            continue
        for prop, value in props.items():
            field = field_map.get(prop)
            if field is not None and row.get(field) != value:
                failures.append(f"contact {object_id}: {field}={row.get(field)!r}, latest event says {value!r}")
    extra = set(local) - set(expected)
    if extra:
        failures.append(f"unexpected local contacts: {sorted(extra)[:5]}")
    by_id = {c["id"]: c for c in customers}
    by_record = {}
    for customer_id, record_key in linked_ids.items():
        by_record.setdefault(record_key, []).append(customer_id)
    for object_id, row in local.items():
        linked = by_record.get(row["_record_key"], [])
        if row.get(push["stage_field"]) == push["stage_value"]:
            pushable = row.get(push["email_field"]) or any(row.get(n) for n in push["name_fields"])
            if not pushable:
                # nothing to send: the push is refused before any request (mapping_produced_no_body)
                if linked:
                    failures.append(f"contact {object_id}: {len(linked)} remote customers for an empty push")
                continue
            if len(linked) != 1:
                failures.append(f"contact {object_id}: {len(linked)} remote customers, expected 1")
                continue
            customer = by_id.get(linked[0])
            want_name = " ".join(v for v in (row.get(n) for n in push["name_fields"]) if v)
            if customer is None:
                failures.append(f"contact {object_id}: linked customer {linked[0]} missing remotely")
            elif (customer.get("email") or "") != (row.get(push["email_field"]) or "") \
                    or (customer.get("name") or "") != want_name:
                failures.append(f"contact {object_id}: remote {customer.get('email')!r}/{customer.get('name')!r} "
                                f"!= local {row.get(push['email_field'])!r}/{want_name!r}")
            if row.get(push["mirror_field"]) != linked[0]:
                failures.append(f"contact {object_id}: mirror {row.get(push['mirror_field'])!r} != link {linked[0]}")
    if duplicates:
        failures.append(f"{duplicates} duplicate remote creates")
    if summary["nonterminal"]:
        failures.append(f"nonterminal work left: {counts}")
    dump = {
        "local": {oid: {k: v for k, v in row.items() if not k.startswith("_")} for oid, row in local.items()},
        "remote": [{"id": c["id"], "email": c.get("email"), "name": c.get("name"),
                    "create_requests": c.get("create_requests", 0)} for c in customers],
    }
    for _oid, row in dump["local"].items():
        row["billing_id"] = row.pop(push["mirror_field"], None)
    return summary, failures, dump


def _print_table(summary: dict, ok: bool, failures: list[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="NexusFlow demo")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for key, value in summary.items():
        table.add_row(key, json.dumps(value) if isinstance(value, dict) else str(value))
    table.add_row("invariants_ok", "yes" if ok else "NO")
    console = Console(stderr=False)
    console.print(table)
    for failure in failures[:20]:
        console.print(f"[red]invariant failed:[/red] {failure}")


def run_demo(*, events: str | None, as_json: bool, dump_path: str | None, keep_logs: bool = True,
             chaos_seed: int | None = None, run_dir: str | Path | None = None) -> int:
    """Run the demo; return the process exit code (0 ok, 1 invariant failed, 2 could not run).

    ``run_dir`` (default ``var/demo``) receives the processes' logs, the
    applied configuration and the run's secret backend (``run_dir/secrets``);
    a test gives each run its own.

    With ``chaos_seed`` (a non-negative int) it is the chaos demo of
    :mod:`packs.demo.chaos`: worker processes are SIGKILLed at the seed's
    failpoints and restarted, failed webhook requests are resent, and the
    summary adds ``kills`` and the chaos invariants (exit 1 when they fail).
    """
    from packs.hubspot.fixtures.make_demo_webhooks import expected_final_state
    from packs.hubspot.sender import deliver_all, load_deliveries

    chaos = supervisor = None
    if chaos_seed is not None:
        from packs.demo.chaos import validate_seed

        try:
            chaos = validate_seed(chaos_seed)
        except ValueError as exc:
            print(f"demo: {exc}", file=sys.stderr)
            return 2
    service = json.loads(SERVICE_FILE.read_text(encoding="utf-8"))
    service["push"]["inbound_field_map"] = _inbound_field_map(service)
    events_path = Path(events) if events else ROOT / service["events"]
    try:
        deliveries = load_deliveries(events_path)
    except (OSError, ValueError) as exc:
        print(f"demo: cannot read events file {events_path}: {exc}", file=sys.stderr)
        return 2
    cfg = settings.DATABASES["default"]
    main_db, control_db = demo_database_names(cfg["NAME"])
    run_dir = Path(run_dir) if run_dir else ROOT / "var" / "demo"
    run_dir.mkdir(parents=True, exist_ok=True)
    for old in run_dir.glob("*.log"):
        old.unlink()
    env = {**os.environ, "NEXUS_DB_URL": db_url(cfg, main_db), "NEXUS_CONTROL_DB_URL": db_url(cfg, control_db),
           **service_secrets_env(run_dir), "PYTHONUNBUFFERED": "1"}
    webhook_secret = env["NEXUS_DEMO_WEBHOOK_SECRET"]
    env.pop("NEXUS_FAILPOINTS", None)
    procs = Processes()
    say = (lambda *a: print(*a, file=sys.stderr)) if as_json else print

    def _terminated(signum, frame):
        raise DemoError(f"stopped by signal {signum}")

    main_thread = threading.current_thread() is threading.main_thread()
    previous_sigterm = signal.signal(signal.SIGTERM, _terminated) if main_thread else None  # children stop too
    try:
        say(f"demo: recreating databases {main_db}, {control_db}")
        create_migrated_databases(cfg, main_db, control_db, migrate=lambda main, control: migrate_databases(
            {**env, "NEXUS_DB_URL": db_url(cfg, main), "NEXUS_CONTROL_DB_URL": db_url(cfg, control)}))
        collect_static(env)  # the web process serves the admin's assets (WhiteNoise)
        billing_url = start_billing_sandbox(procs, env=env, run_dir=run_dir)
        service_activate(service, env=env, run_dir=run_dir, billing_url=billing_url, say=lambda m: say(f"demo: {m}"))
        web_port = free_local_port()
        base = f"http://127.0.0.1:{web_port}"
        url = ingress_url(service, base)
        if chaos is None:
            procs.start("web", web_server_argv(web_port, workers=2), env, run_dir)
            for index, role in enumerate(WORKER_ROLES):
                procs.start(f"worker-{role}-{index}", [sys.executable, "manage.py", "run_workers", "--role", role],
                            env, run_dir)
            _wait_http(base + "/api/v2/health/")
            say(f"demo: posting {len(deliveries)} deliveries to {url}")
            results = deliver_all(deliveries, url=url, secret=webhook_secret.encode())
            say("demo: waiting until no work is left")
            use_database(main_db, control_db)
            counts = _wait_idle(procs)
        else:
            supervisor, results, counts = _run_chaos(chaos, procs=procs, env=env, run_dir=run_dir, web_port=web_port,
                                                     url=url, deliveries=deliveries, secret=webhook_secret.encode(),
                                                     databases=(main_db, control_db), say=say)
        remote = httpx.get(billing_url + "/_sandbox/state", timeout=5).json()
        summary, failures, dump = _summary(service, results, remote, expected_final_state(deliveries), counts)
        if supervisor is not None:
            from packs.demo.chaos import abandoned_permits, chaos_failures

            summary.update(supervisor.report())
            failures += chaos_failures(summary, supervisor.kills)
            dump["chaos"] = {**supervisor.dump(), "abandoned_permits": abandoned_permits()}
    except DemoError as exc:
        print(f"demo: {exc}\nlogs: {run_dir}", file=sys.stderr)
        return 2
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous_sigterm)
        procs.stop_all()
    ok = not failures
    if dump_path:
        Path(dump_path).write_text(json.dumps(dump, indent=2, ensure_ascii=False), encoding="utf-8")
    if as_json:
        for failure in failures:
            print(f"invariant failed: {failure}", file=sys.stderr)
        print(json.dumps({**summary, "invariants_ok": ok}))
    else:
        _print_table(summary, ok, failures)
    return 0 if ok else 1
