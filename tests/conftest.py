"""Shared fixtures: a serving org with both demo packs on a real MariaDB.

``serving_org`` applies an L2 configuration (webhook account + billing
account pointing at an in-process billing sandbox), runs the greenfield
cutover and deploys the demo Flow, exactly as an operator would.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from nexusflow.kernel.scope import OrgScope

ROOT = Path(settings.BASE_DIR)
WEBHOOK_SECRET = "test-webhook-secret"
BILLING_KEY = "sk_test_nexus"
HUBSPOT_TOKEN = "pat-test-nexus"
HUBSPOT_ACCOUNT = "hubspot-crm"
ORG = "test-org"
DEMO_FLOW = ROOT / "metadata" / "flows" / "Contact_Push_Customer_To_Billing.flow-meta.xml"

#: Modules of shared fixtures every test module may ask for by name.
pytest_plugins = ["tests.stream_support", "tests.api_fuzz_support"]


def pytest_configure(config):
    # A lock-order reversal is a programming error: tests raise it (production logs it).
    settings.NEXUS_LOCK_ORDER = "raise"
    from django.test import TransactionTestCase

    TransactionTestCase._fixture_teardown = _empty_the_written_tables


def _empty_the_written_tables(test_case) -> None:
    """End a transactional test with every table of its databases empty, as Django's flush does, but faster.

    Django's ``flush`` deletes from every table and then replays ``post_migrate``, which re-creates the content
    types and permissions (about 0.1 s a test, most of the teardown). NexusFlow's code and tests read neither
    (the admin support views are for superusers), so this deletes only from the tables that hold a row, found by
    one query, and replays nothing.
    """
    from django.core.management.color import no_style
    from django.db import connections

    for alias in test_case._databases_names(include_mirrors=False):
        conn = connections[alias]
        tables = conn.introspection.django_table_names(only_existing=True, include_views=False)
        if not tables:
            continue
        quote = conn.ops.quote_name
        with conn.cursor() as cursor:
            cursor.execute("SELECT " + ", ".join(f"EXISTS(SELECT 1 FROM {quote(t)})" for t in tables))
            written = [table for table, has_rows in zip(tables, cursor.fetchone(), strict=True) if has_rows]
        if written:
            conn.ops.execute_sql_flush(conn.ops.sql_flush(no_style(), written, reset_sequences=False))


def pytest_addoption(parser):
    parser.addoption("--run-chaos", action="store_true", help="run chaos soaks")
    parser.addoption("--run-bench", action="store_true", help="run benchmarks")


#: The longest test files, longest first (seconds each took in a run of three workers on two cores; ``make test``
#: prints the ten slowest tests): they start first, longest first, so that the suite does not end with one worker
#: running one of them alone while the others wait. Every other file follows in collection order.
SLOW_FIRST = (
    "tests/adversarial/test_inbound_chain_attacks.py",  # 155
    "tests/adversarial/test_crash_workers.py",  # 150
    "tests/cutover/test_restore.py",  # 105
    "tests/e2e/test_cutover_journey_v1_to_v2.py",  # 85
    "tests/e2e/test_conversion_journeys.py",  # 80
    "tests/cutover/test_activate.py",  # 75
    "tests/e2e/test_wait_journeys.py",  # 70
    "tests/kernel/test_machine_walks.py",  # 70
    "tests/test_api_schema_fuzz_cross_org.py",  # 65
    "tests/e2e/test_journeys.py",  # 60
    "tests/adversarial/test_push_attacks.py",  # 60
    "tests/cutover/test_v1_shutdown.py",  # 55
    "tests/cutover/test_restore_point.py",  # 55
    "tests/e2e/test_cutover_journey_restore.py",  # 50
    "tests/adversarial/test_outbound_attacks.py",  # 50
    "tests/e2e/test_main_job.py",  # 45
    "tests/test_api_schema_fuzz.py",  # 45
    "tests/test_reason_code_migrations.py",  # 45
    "tests/connectors/serving/test_generation_commands.py",  # 45
    "tests/connectors/inbound/test_stream_ingress.py",  # 40
    "tests/connectors/outbound/test_deferred_association.py",  # 30
    "tests/e2e/test_after_the_demo.py",  # 25
    "tests/e2e/test_cutover_journey_abort.py",  # 25
)


def _start_rank(item) -> int:
    path = item.nodeid.split("::", 1)[0]
    return SLOW_FIRST.index(path) if path in SLOW_FIRST else len(SLOW_FIRST)


def pytest_collection_modifyitems(config, items):
    items.sort(key=_start_rank)  # stable: each file keeps its order
    skip_chaos = pytest.mark.skip(reason="chaos soak: run with make chaos")
    skip_bench = pytest.mark.skip(reason="benchmark: run with make bench")
    for item in items:
        if "chaos" in item.keywords and not config.getoption("--run-chaos"):
            item.add_marker(skip_chaos)
        if "bench" in item.keywords and not config.getoption("--run-bench"):
            item.add_marker(skip_bench)


_PAIR_COUNTS = pytest.StashKey[dict]()


@pytest.fixture
def pair_counts(request) -> dict:
    """``{machine name: {"accepted": n, "rejected": m}}`` for the end-of-run summary."""
    from collections import defaultdict

    return request.config.stash.setdefault(_PAIR_COUNTS, defaultdict(dict))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    counts = config.stash.get(_PAIR_COUNTS, None)
    if not counts:
        return
    terminalreporter.section("state machine transition pairs checked")
    total = 0
    for name in sorted(counts):
        accepted = counts[name].get("accepted", 0)
        rejected = counts[name].get("rejected", 0)
        table_only = counts[name].get("table_only", 0)
        total += accepted + rejected + table_only
        listed = f"accepted by store {accepted:4}" if not table_only else f"listed (no store) {table_only:4}"
        terminalreporter.write_line(f"{name:45} {listed}  rejected before SQL {rejected:4}")
    terminalreporter.write_line(f"total pairs checked: {total}")


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix):
    """Create this worker's test databases as copies of the schema template (:mod:`packs.demo.schema`).

    The template (``<main>_t<digest>``) is migrated once per set of migrations, by whichever worker or run gets
    there first; every worker then copies its tables in about 2 s instead of migrating for about 15 s, and
    Django finds its databases in place (``django_db_keepdb``) with every migration applied.
    """
    from packs.demo.run import db_url, migrate_databases
    from packs.demo.schema import create_migrated_databases

    main = settings.DATABASES["default"]
    names = [alias_settings.get("TEST", {}).get("NAME") or f"test_{alias_settings['NAME']}"
             for alias_settings in (main, settings.DATABASES["control"])]
    create_migrated_databases(main, *names, migrate=lambda template, control: migrate_databases(
        {**os.environ, "NEXUS_DB_URL": db_url(main, template), "NEXUS_CONTROL_DB_URL": db_url(main, control)}))


@pytest.fixture(scope="session")
def django_db_keepdb() -> bool:
    """The test databases exist before Django sets them up (:func:`django_db_modify_db_settings`): keep them."""
    return True


@pytest.fixture(scope="session", autouse=True)
def _secrets_dir(tmp_path_factory):
    """One versioned secrets directory per test run, shared with child processes."""
    path = tmp_path_factory.mktemp("secrets")
    previous = os.environ.get("NEXUS_SECRETS_DIR")
    settings.NEXUS_SECRETS_DIR = path
    os.environ["NEXUS_SECRETS_DIR"] = str(path)
    yield path
    if previous is None:
        os.environ.pop("NEXUS_SECRETS_DIR", None)
    else:
        os.environ["NEXUS_SECRETS_DIR"] = previous


@pytest.fixture(autouse=True)
def _secrets(monkeypatch):
    monkeypatch.setenv("NEXUS_TEST_WEBHOOK_SECRET", WEBHOOK_SECRET)
    monkeypatch.setenv("NEXUS_TEST_BILLING_KEY", BILLING_KEY)
    monkeypatch.setenv("NEXUS_TEST_HUBSPOT_TOKEN", HUBSPOT_TOKEN)


@pytest.fixture(autouse=True)
def _runtime_policy_cache():
    """Each test reads the runtime policy its own database holds (a flushed database drops the generations
    an earlier test published; the process cache must not keep them)."""
    from nexusflow.flows.policy import _plan_flow_name
    from runtime_outbox.policy import policy_cache_clear

    policy_cache_clear()
    _plan_flow_name.cache_clear()  # plan ids of a flushed database come again
    yield
    policy_cache_clear()


@pytest.fixture
def billing_sandbox():
    from packs.billing.sandbox import BillingSandbox

    sandbox = BillingSandbox(BILLING_KEY)
    sandbox.start()
    yield sandbox
    sandbox.stop()


@pytest.fixture
def hubspot_crm_sandbox():
    """A running CRM objects sandbox accepting ``Bearer HUBSPOT_TOKEN``."""
    from packs.hubspot.crm_sandbox import CrmSandbox

    sandbox = CrmSandbox(HUBSPOT_TOKEN)
    sandbox.start()
    yield sandbox
    sandbox.stop()


SECRET_VERSION = "test-1"
CREDENTIAL_DOCUMENTS = [
    {"account_key": "crm-webhooks", "credential_ref": "webhook_secret", "version": SECRET_VERSION,
     "secret": {"from_env": "NEXUS_TEST_WEBHOOK_SECRET"}},
    {"account_key": "billing-main", "credential_ref": "api_key", "version": SECRET_VERSION,
     "secret": {"from_env": "NEXUS_TEST_BILLING_KEY"}, "transport": {"scheme": "bearer"}},
]
#: Published only for orgs configured with the CRM objects push account (``hubspot_url``).
HUBSPOT_CREDENTIAL_DOCUMENT = {
    "account_key": HUBSPOT_ACCOUNT, "credential_ref": "private_app_token", "version": SECRET_VERSION,
    "secret": {"from_env": "NEXUS_TEST_HUBSPOT_TOKEN"}, "transport": {"scheme": "bearer"}}


def service_document(billing_url: str, hubspot_url: str | None = None) -> dict:
    """The L2 document: webhook + billing accounts, plus the CRM objects push account when ``hubspot_url`` is given."""
    accounts = [
        {"account_key": "crm-webhooks", "pack": "hubspot", "routes": ["contacts.webhook"],
         "credentials": {"webhook_secret": SECRET_VERSION}},
        {"account_key": "billing-main", "pack": "billing", "push_contracts": ["billing.customer"],
         "base_url": billing_url, "credentials": {"api_key": SECRET_VERSION}},
    ]
    if hubspot_url is not None:
        accounts.append({"account_key": HUBSPOT_ACCOUNT, "pack": "hubspot",
                         "push_contracts": ["hubspot.contact", "hubspot.company"],
                         "base_url": hubspot_url, "credentials": {"private_app_token": SECRET_VERSION}})
    return {"accounts": accounts}


def publish_owner_generations(org: OrgScope, *, hubspot_push: bool = False) -> None:
    """Publish both bundled packs and the org's two credential versions, as an operator would.

    ``hubspot_push`` also publishes the CRM objects push account's private app token.
    """
    from connectors.serving.generations import credential_publish, pack_publish_file

    for pack in ("hubspot", "billing"):
        pack_publish_file(Path(settings.NEXUS_PACKS_DIR) / pack / "pack.json")
    for document in CREDENTIAL_DOCUMENTS + ([HUBSPOT_CREDENTIAL_DOCUMENT] if hubspot_push else []):
        credential_publish(org=org, document=document)


def apply_service_configuration(org: OrgScope, billing_url: str, hubspot_url: str | None = None):
    """Publish the owner generations, then author the L2 configuration generation."""
    from connectors.serving.gates import service_configuration_apply

    publish_owner_generations(org, hubspot_push=hubspot_url is not None)
    return service_configuration_apply(org=org, document=service_document(billing_url, hubspot_url))


@dataclass
class ServingOrg:
    org: OrgScope
    sandbox: object


def make_serving_org(billing_url: str, *, deploy_flow: bool = True, hubspot_url: str | None = None) -> OrgScope:
    """Configure, cut over and (optionally) deploy the demo Flow for ``ORG``.

    ``hubspot_url``: also serve the CRM objects push account ``HUBSPOT_ACCOUNT``
    (push contracts ``hubspot.contact`` and ``hubspot.company``) against that base URL.
    """
    from cutover.services import cutover_greenfield

    org = OrgScope(ORG)
    apply_service_configuration(org, billing_url, hubspot_url)
    cutover_greenfield(org=org)
    if deploy_flow:
        from django.core.management import call_command

        call_command("flow_deploy", "--org", ORG, str(DEMO_FLOW), stdout=open(os.devnull, "w"))
    return org


@pytest.fixture
def serving_org(billing_sandbox, django_db_blocker) -> ServingOrg:
    return ServingOrg(make_serving_org(billing_sandbox.base_url), billing_sandbox)


def hubspot_event(event_id: int, object_id: int, occurred_at: int, prop: str | None = None,
                  value: str | None = None, attempt: int = 0, subscription_id: int | None = None) -> dict:
    """A provider-shaped webhook event (creation when ``prop`` is None)."""
    event = {"eventId": event_id, "subscriptionId": subscription_id or (101 if prop is None else 202),
             "portalId": 62515, "appId": 54321, "occurredAt": occurred_at, "attemptNumber": attempt,
             "objectId": object_id, "changeSource": "CRM_UI"}
    if prop is None:
        event.update({"subscriptionType": "contact.creation", "changeFlag": "NEW"})
    else:
        event.update({"subscriptionType": "contact.propertyChange", "propertyName": prop, "propertyValue": value})
    return event


def post_signed(client, events_or_body, *, sign: str = "valid", account="crm-webhooks", channel="webhooks",
                extra_headers: dict | None = None):
    """POST a webhook body through the real ingress view, signed like the provider (with ``extra_headers``,
    e.g. a ``traceparent``)."""
    from packs.hubspot.sender import Delivery, signed_headers, webhook_route

    delivery = Delivery(events_or_body, sign)
    url = f"http://testserver/api/v2/ingress/{account}/{channel}/"
    headers = signed_headers(delivery, auth=webhook_route()["auth"], url=url, secret=WEBHOOK_SECRET.encode(),
                             now_epoch_seconds=time.time())
    return client.post(url, data=delivery.body_bytes(), content_type="application/json",
                       headers={**headers, **(extra_headers or {})})


def drain(*, worker_id: str = "test-worker", max_rounds: int = 2000, client=None) -> int:
    """Run every worker unit in-process until none has work; return units done."""
    from connectors.inbound.admission import receipt_try_reconcile_one
    from connectors.inbound.executions import dependency_try_expire_one, execution_try_run_one
    from connectors.inbound.windows import window_try_close_one
    from connectors.outbound.egress import (
        effect_try_dispatch_one,
        effect_try_finalize_one,
        effect_try_reconcile_one,
        permit_try_abandon_one,
    )
    from nexusflow.flows.services import flow_try_run_step_one, flow_try_wake_one
    from runtime_outbox.services import outbox_try_deliver_one

    units = [receipt_try_reconcile_one, window_try_close_one, dependency_try_expire_one,
             lambda: execution_try_run_one(worker_id=worker_id), outbox_try_deliver_one, flow_try_wake_one,
             lambda: flow_try_run_step_one(worker_id=worker_id), permit_try_abandon_one, effect_try_finalize_one,
             effect_try_reconcile_one, lambda: effect_try_dispatch_one(worker_id=worker_id, client=client)]
    done = 0
    for _ in range(max_rounds):
        worked = [unit() for unit in units]
        done += sum(worked)
        if not any(worked):
            return done
    raise AssertionError("work did not drain")


def subprocess_env(**extra: str) -> dict:
    """Environment for a child process that must use this test database (and its moved clock, if any)."""
    main = connection.settings_dict
    url = f"mysql://{main['USER']}:{main['PASSWORD']}@{main['HOST'] or '127.0.0.1'}:{main['PORT'] or 3306}/{main['NAME']}"
    from django.db import connections

    ctl = connections["control"].settings_dict
    ctl_url = f"mysql://{ctl['USER']}:{ctl['PASSWORD']}@{ctl['HOST'] or '127.0.0.1'}:{ctl['PORT'] or 3306}/{ctl['NAME']}"
    moved = _MOVED_CLOCKS[-1].child_env() if _MOVED_CLOCKS else {}
    return {**os.environ, "NEXUS_DB_URL": url, "NEXUS_CONTROL_DB_URL": ctl_url, "PYTHONUNBUFFERED": "1",
            "NEXUS_LOCK_ORDER": "raise", **moved, **extra}


def run_manage(args: list[str], env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def load_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


#: The moved database clock of the running test (tests/db_clock.py), read by :func:`subprocess_env`.
_MOVED_CLOCKS: list = []


@pytest.fixture
def db_clock_advance(monkeypatch):
    """Move the database clock forward instead of waiting: ``db_clock_advance(seconds)``.

    Every later ``db_now()`` of this process (every thread) reads the
    database clock plus the seconds moved so far, so a lease, deadline,
    window or backoff due within them is due at once; real time is never
    spent. A child process reads the same clock when its environment is a
    ``subprocess_env()`` built after the move. Values stamped without
    ``db_now()`` (SQL ``UTC_TIMESTAMP(6)``, ``auto_now_add``) keep the real
    clock: they only look older.

    Raises:
        ValueError: ``seconds`` not positive (the clock never moves back).
    """
    from nexusflow.kernel import clock
    from tests.db_clock import ShiftedClock

    shifted = ShiftedClock(clock.database_utc_timestamp)
    monkeypatch.setattr(clock, "database_utc_timestamp", shifted)
    _MOVED_CLOCKS.append(shifted)

    def advance(seconds: float) -> None:
        if not seconds > 0:
            raise ValueError(f"the database clock only moves forward, got {seconds!r} s")
        shifted.offset += seconds

    yield advance
    _MOVED_CLOCKS.remove(shifted)


@pytest.fixture
def holds(tmp_path, monkeypatch):
    """Arm one ``hold`` failpoint at a time, wait until a transaction is held there, release it.

    See :mod:`nexusflow.kernel.failpoints`: the held process writes a marker
    under ``NEXUS_FAILPOINT_DIR`` and waits for ``<marker>.go``.
    """
    monkeypatch.setenv("NEXUS_FAILPOINT_DIR", str(tmp_path))

    class Holds:
        def arm(self, name: str) -> None:
            monkeypatch.setenv("NEXUS_FAILPOINTS", f"{name}=hold")

        def wait_held(self, name: str, timeout: float = 60) -> Path:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                held = [p for p in tmp_path.glob(f"{name}.*") if not p.name.endswith(".go")]
                if held:
                    monkeypatch.delenv("NEXUS_FAILPOINTS")  # disarm at once: only the transaction already held waits
                    return held[0]
                time.sleep(0.02)
            raise AssertionError(f"failpoint {name} was never reached")

        def release(self, marker: Path) -> None:
            marker.with_name(marker.name + ".go").write_text("go")

    return Holds()
