"""Build guardrails over the code base (ARCHITECTURE.md sections 2 and 6), each with a self-test.

* no ORM read selects a tenant row by id without ``org_id`` ("Trusted scope");
* raw SQL lives only in ``store.py`` / ``selectors.py`` (and migrations);
* only the egress adapter (and L1 provider sandboxes, and tests) imports an HTTP client;
* imports point down the app layers ("Which way imports point"), and no modules import each other in a cycle.

The self-tests feed each checker a deliberately broken snippet and its
corrected form, and assert the exact violation reported.
"""
from __future__ import annotations

import pytest
from django.apps import apps

from tests.guardrails import (
    ROOT,
    app_of,
    check_http_imports,
    check_import_cycles,
    check_import_direction,
    check_raw_sql,
    check_store_discipline,
    check_unscoped_reads,
    l0_files,
    model_facts,
    module_name,
    project_python_files,
    relative,
    shortest_cycle,
    strongly_connected,
)

#: L0 modules the unscoped-read rule covers: everything but the read-only admin (scoped by
#: ``ReadOnlyAdmin.get_queryset`` to the operator's orgs) and migrations.
SCOPED_READ_FILES = [p for p in l0_files() if p.name != "admin.py"]
#: ``(path, line number)`` pairs allowed an id read without ``org_id``. Empty: every read is scoped.
UNSCOPED_READ_EXEMPT: frozenset[tuple[str, int]] = frozenset()

#: Files that may import an HTTP client, each with its reason.
HTTP_CLIENT_ALLOWED = {
    "connectors/outbound/egress.py": "the sole egress adapter (ARCHITECTURE.md section 2): composes its steps",
    "connectors/outbound/permit_send.py": "the egress adapter's one provider call per DispatchPermit",
    "connectors/outbound/recovery.py": "the egress adapter's verify read of a provider's create conflict",
    "connectors/inbound/stream_transport.py": "the one read-only fetch of pulled routes; no transaction, no write",
    "connectors/v1/egress.py": "the V1 runtime's one provider call behind its pre-I/O row (connectors/v1/egress_manifest.json)",
    "connectors/v1/push.py": "V1 push: passes an optional httpx client through to connectors/v1/egress.py",
    "connectors/v1/poller.py": "V1 poller: passes an optional httpx client through to connectors/v1/egress.py",
    "packs/hubspot/sender.py": "L1 provider sandbox: sends provider-shaped webhooks to the ingress",
    "packs/demo/run.py": "L1 demo driver: plays the provider against a running web process",
    "packs/journeys.py": "L1 journey harness: waits for the running web process and posts webhooks to it",
    "packs/hubspot/journeys.py": "L1 journeys: seed and read the provider sandbox through its own API",
    "packs/hubspot/conversion_journeys.py": "L1 journeys: act as an operator against the running web process",
    "packs/demo/cutover_journeys.py": "L1 journeys: seed and read the billing sandbox through its own API",
    "packs/bench/dbos_app.py": "make bench's DBOS peer (its own virtualenv): POSTs contacts to the billing sandbox",
}


def _facts():
    return model_facts(apps.get_models())


# --- 2. no unscoped read by id ---------------------------------------------------
@pytest.mark.parametrize("path", SCOPED_READ_FILES, ids=lambda p: relative(p))
def test_l0_reads_by_id_are_org_scoped(path):
    violations = [v for v in check_unscoped_reads(path.read_text(encoding="utf-8"), relative(path), _facts())
                  if (v.path, v.line) not in UNSCOPED_READ_EXEMPT]
    assert not violations, "\n".join(map(str, violations))


def test_the_unscoped_read_scan_covers_stores_selectors_services_apis_and_commands():
    names = {relative(p) for p in SCOPED_READ_FILES}
    assert {"nexusflow/kernel/store.py", "nexusflow/flows/selectors.py", "nexusflow/flows/services/execute.py",
            "connectors/inbound/ingress_api.py", "cutover/management/commands/cutover.py", "connectors/outbound/egress.py"} <= names
    assert not [n for n in names if n.endswith("admin.py") or "/migrations/" in n]


def _unscoped(source: str) -> list[tuple[int, str]]:
    return [(v.line, v.detail) for v in check_unscoped_reads(source, "connectors/x.py", _facts())]


def test_an_unscoped_row_reader_is_caught():
    assert _unscoped("first_row(RemoteEffect, pk=e)") == [(1, "RemoteEffect.first_row(pk) without org_id")]
    assert _unscoped("first_row(RemoteEffect, org_id=o, pk=e)") == []


def test_an_unscoped_read_by_id_is_caught():
    broken = "def load(effect_id):\n    return RemoteEffect.objects.select_related('command').get(pk=effect_id)\n"
    assert _unscoped(broken) == [(2, "RemoteEffect.get(pk) without org_id")]
    fixed = broken.replace("get(pk=", "get(org_id=org_id, pk=")
    assert _unscoped(fixed) == []


@pytest.mark.parametrize("line,detail", [
    ("RemoteEffectAttempt.objects.filter(effect_id=e.pk)", "RemoteEffectAttempt.filter(effect_id) without org_id"),
    ("RemoteEffectAttempt.objects.exclude(pk__in=ids)", "RemoteEffectAttempt.exclude(pk__in) without org_id"),
    ("DispatchPermit.objects.select_for_update(nowait=True).get(id=1)", "DispatchPermit.get(id) without org_id"),
    ("Execution.objects.get_or_create(lane_id=3, defaults={})", "Execution.get_or_create(lane_id) without org_id"),
    ("FlowRun.objects.in_bulk(ids)", "FlowRun.in_bulk(in_bulk) without org_id"),
    ("FlowRun.objects.filter(org_name=o).get(pk=1)", "FlowRun.get(pk) without org_id"),
])
def test_every_id_selecting_form_is_caught(line, detail):
    assert _unscoped(f"def f(o, e, ids):\n    return {line}\n") == [(2, detail)]


@pytest.mark.parametrize("source", [
    "RemoteEffect.objects.get(org_id=o, pk=1)",
    "RemoteEffect.objects.filter(org_id=o).select_for_update().get(pk=1)",
    "RemoteEffect.objects.filter(org_id__in=orgs).exclude(pk=1)",
    "RemoteEffect.objects.filter(Q(org_id=o) | Q(org_id=p), pk=1)",
    "qs = RemoteEffect.objects.filter(org_id=o)\nqs.get(pk=1)",
    "scope = dict(org_id=o, app_installation_id=a)\nFlowRun.objects.filter(pk=1, **scope)",
    "FlowRun.objects.filter(app_installation_id=a, runtime_capability_id=c)",
    "PackGeneration.objects.get(pk=1)",
    "WorkerProcess.objects.filter(worker_id=w).first()",
    "Record.objects.filter(org_id=o, object_name=n)",
    "mapping.get('pk')",
])
def test_scoped_or_non_tenant_reads_pass(source):
    assert _unscoped(source) == []


def test_a_queryset_variable_is_followed_to_its_definition():
    broken = "def f(o):\n    qs = RemoteEffect.objects.all()\n    return qs.get(pk=1)\n"
    assert _unscoped(broken) == [(3, "RemoteEffect.get(pk) without org_id")]
    assert _unscoped(broken.replace(".all()", ".filter(org_id=o)")) == []


def test_a_refined_queryset_inherits_the_scope_of_its_definition():
    refined = ("def f(o, e):\n    qs = RemoteEffectAttempt.objects.filter(org_id=o)\n"
               "    if e:\n        qs = qs.filter(effect_id=e)\n    return qs\n")
    assert _unscoped(refined) == []
    assert _unscoped(refined.replace("filter(org_id=o)", "all()")) == [
        (4, "RemoteEffectAttempt.filter(effect_id) without org_id")]


def test_excluding_an_org_is_not_a_scope():
    assert _unscoped("RemoteEffect.objects.exclude(org_id='x').get(pk=1)") == [
        (1, "RemoteEffect.get(pk) without org_id")]


# --- 3. raw SQL only in stores and selectors ---------------------------------------
@pytest.mark.parametrize("path", list(l0_files()), ids=lambda p: relative(p))
def test_raw_sql_lives_only_in_stores_and_selectors(path):
    violations = check_raw_sql(path.read_text(encoding="utf-8"), relative(path))
    assert not violations, "\n".join(map(str, violations))


def test_raw_sql_outside_a_store_is_caught():
    broken = (
        "from django.db import connection\n"
        "def lanes():\n"
        "    with connection.cursor() as c:\n"
        "        c.execute('SELECT id FROM connectors_orderinglane')\n"
        "        return c.fetchall()\n"
    )
    found = [(v.line, v.detail) for v in check_raw_sql(broken, "connectors/inbound/executions.py")]
    assert found == [(4, "cursor.execute()"), (4, "SQL literal 'SELECT id FROM connectors_orderinglane'")]
    assert check_raw_sql(broken, "connectors/selectors.py") == []
    assert check_raw_sql(broken, "nexusflow/flows/store.py") == []
    assert check_raw_sql(broken, "connectors/migrations/0002_backfill.py") == []


@pytest.mark.parametrize("line,detail", [
    ("Record.objects.raw('x')", ".raw()"),
    ("Record.objects.extra(where=['1'])", ".extra()"),
    ("Record.objects.annotate(n=RawSQL('1', []))", "RawSQL()"),
    ("connections['control'].cursor().execute(sql)", "cursor.execute()"),
    ("my_cursor.executemany(sql, rows)", "cursor.executemany()"),
    ('sql = "UPDATE records_record SET version = 1"', "SQL literal 'UPDATE records_record SET version = 1'"),
    ('sql = f"DELETE FROM {table} WHERE id = %s"', "SQL literal 'DELETE FROM  ?  WHERE id = %s'"),
    ('sql = "INSERT INTO t (a) VALUES (%s)"', "SQL literal 'INSERT INTO t (a) VALUES (%s)'"),
])
def test_every_raw_sql_form_is_caught(line, detail):
    assert [(v.line, v.detail) for v in check_raw_sql(f"def f():\n    {line}\n", "runtime_outbox/services.py")] \
        == [(2, detail)]


def test_prose_and_orm_calls_are_not_raw_sql():
    text = (
        'def f(plan):\n'
        '    """Run ``SELECT ... FROM`` in the selector; UPDATE the row SET by the store."""\n'
        '    label = "select one step from the plan"\n'
        '    return plan.execute(), Record.objects.filter(org_id="o").only("id")\n'
    )
    assert check_raw_sql(text, "nexusflow/flows/services.py") == []


# --- 4. one egress adapter --------------------------------------------------------
def test_only_the_egress_adapter_imports_an_http_client():
    found = []
    for path in project_python_files():
        name = relative(path)
        if name in HTTP_CLIENT_ALLOWED or name.startswith("tests/"):
            continue
        found += check_http_imports(path.read_text(encoding="utf-8"), name)
    assert not found, "\n".join(map(str, found))


def test_the_allowed_http_clients_are_still_there():
    for name in HTTP_CLIENT_ALLOWED:
        path = ROOT / name
        assert check_http_imports(path.read_text(encoding="utf-8"), name), f"{name} no longer needs its exemption"


@pytest.mark.parametrize("line,module", [
    ("import requests", "requests"),
    ("import httpx as h", "httpx"),
    ("import urllib.request", "urllib.request"),
    ("from urllib import request", "urllib.request"),
    ("from http import client", "http.client"),
    ("from http.client import HTTPSConnection", "http.client"),
    ("mod = importlib.import_module('httpx')", "httpx"),
])
def test_an_http_client_import_is_caught(line, module):
    assert [(v.line, v.detail) for v in check_http_imports(f"x = 1\n{line}\n", "runtime_outbox/services.py")] \
        == [(2, f"imports {module}")]


def test_parsing_and_serving_modules_are_not_http_clients():
    text = "import urllib.parse\nfrom http import HTTPStatus\nfrom http.server import ThreadingHTTPServer\n"
    assert check_http_imports(text, "connectors/contracts/signatures.py") == []


# --- 6. locks and state writes go through stores --------------------------------------


@pytest.mark.parametrize("path", list(l0_files()), ids=lambda p: relative(p))
def test_locks_and_state_writes_go_through_stores(path):
    violations = check_store_discipline(path.read_text(encoding="utf-8"), relative(path))
    assert not violations, "\n".join(map(str, violations))


@pytest.mark.parametrize("source,detail", [
    ("def f(o):\n    return Execution.objects.select_for_update().filter(org_id=o)\n",
     "select_for_update outside a store"),
    ("def f(o):\n    return get_row(Record, {'org_id': o}, lock='update')\n", "locking row read outside a store"),
    ("def f(o):\n    return fetch_where(Execution, {'org_id': o}, suffix=' FOR UPDATE')\n",
     "locking row read outside a store"),
    ("def f(o, s):\n    return fetch_joined(Execution, ('lane',), {'org_id': o}, suffix=s)\n",
     "locking row read outside a store"),
    ("def f():\n    return insert(RemoteEffect, allow_any_state=True, state='uncertain')\n",
     "insert(allow_any_state=...) outside tests"),
    ("from django.db import transaction\n@transaction.atomic\ndef f():\n    pass\n", "@atomic decorator on f()"),
    ("from django.db.transaction import atomic\n@atomic(durable=True)\ndef f():\n    pass\n",
     "@atomic decorator on f()"),
    ("from django.db import models\ndef f(qs):\n    return models.QuerySet.update(qs, state='x')\n",
     "unbound QuerySet.update bypasses the guarded classes"),
    ("from django.db.models import Model\ndef f(o):\n    Model.delete(o)\n",
     "unbound Model.delete bypasses the guarded classes"),
    ("from django.db.models.sql import UpdateQuery\n", "Django SQL write query class"),
    ("def f(o):\n    o._nexus_store_insert = True\n", "store-insert flag outside kernel.models"),
])
def test_store_discipline_breaches_are_caught(source, detail):
    assert [v.detail for v in check_store_discipline(source, "connectors/services.py")] == [detail]
    assert check_store_discipline(source, "connectors/store.py") == []


def test_explicit_transactions_and_store_locks_pass():
    fine = ("from django.db import transaction\ndef f(o, pk):\n    with transaction.atomic(durable=True):\n"
            "        return ExecutionStore.lock(o, pk)\n")
    assert check_store_discipline(fine, "connectors/services.py") == []


# --- 7. imports point down the app layers, and no module cycles --------------------------
#: Imports that point the wrong way today, ``(importing file, imported module) -> the port replacing it``.
#: The list only shrinks: a new violation fails the test, and so does an entry whose import is gone.
IMPORT_DIRECTION_TODO: dict[tuple[str, str], str] = {
}
#: Import cycles allowed for now, keyed by the modules of their strongly connected component.
IMPORT_CYCLE_TODO: dict[frozenset[str], str] = {
}


def _project_sources() -> dict[str, str]:
    """Repository-relative path -> text of every project module outside ``tests/``."""
    return {relative(p): p.read_text(encoding="utf-8") for p in project_python_files()
            if not relative(p).startswith("tests/")}


def _direction_violations() -> list:
    sources = _project_sources()
    modules = frozenset(module_name(p)[0] for p in sources)
    return [v for path, text in sources.items() for v in check_import_direction(text, path, modules)]


def test_imports_point_down_the_app_layers():
    found = [v for v in _direction_violations() if (v.path, v.target) not in IMPORT_DIRECTION_TODO]
    assert not found, "\n".join(map(str, found))


def test_the_import_direction_todo_only_shrinks():
    still = {(v.path, v.target) for v in _direction_violations()}
    stale = sorted(set(IMPORT_DIRECTION_TODO) - still)
    assert not stale, f"these imports are gone: remove them from IMPORT_DIRECTION_TODO: {stale}"
    assert all(why.startswith("being replaced by a port: ") for why in IMPORT_DIRECTION_TODO.values())


def test_every_project_module_has_a_layer():
    """A new top-level package must be placed in APP_LAYERS (or the composition root) before it is checked."""
    unplaced = sorted(p for p in _project_sources() if app_of(module_name(p)[0]) is None)
    assert not unplaced, unplaced


def test_no_import_cycles():
    found = [v for members, v in check_import_cycles(_project_sources()) if members not in IMPORT_CYCLE_TODO]
    assert not found, "\n".join(map(str, found))


def test_the_import_cycle_todo_only_shrinks():
    still = {members for members, _ in check_import_cycles(_project_sources())}
    stale = [sorted(members) for members in IMPORT_CYCLE_TODO if members not in still]
    assert not stale, f"these cycles are gone: remove them from IMPORT_CYCLE_TODO: {stale}"


def _direction(source: str, path: str) -> list[tuple[int, str]]:
    return [(v.line, v.detail) for v in check_import_direction(source, path)]


@pytest.mark.parametrize("path,source,line,detail", [
    ("nexusflow/records/edits.py", "import os\nfrom runtime_outbox.owner import OwnerContended\n", 2,
     "imports runtime_outbox.owner.OwnerContended: nexusflow.records (layer 1) imports upward "
     "from runtime_outbox (layer 2)"),
    ("runtime_outbox/services.py", "def deliver():\n    from connectors.outbound.intents import remote_effect_accept\n", 2,
     "imports connectors.outbound.intents.remote_effect_accept: runtime_outbox (layer 2) imports upward "
     "from connectors (layer 3)"),
    ("nexusflow/flows/services.py", "import connectors.workers\n", 1,
     "imports connectors.workers: nexusflow.flows and connectors never import each other"),
    ("connectors/outbound/egress.py", "def f():\n    from nexusflow.flows import services\n", 2,
     "imports nexusflow.flows.services: connectors and nexusflow.flows never import each other"),
    ("nexusflow/records/transfer.py", "from ..flows.models import FlowRun\n", 1,
     "imports nexusflow.flows.models.FlowRun: nexusflow.records (layer 1) imports upward "
     "from nexusflow.flows (layer 3)"),
    ("nexusflow/kernel/__init__.py", "from .. import records\n", 1,
     "imports nexusflow.records: nexusflow.kernel (layer 0) imports upward from nexusflow.records (layer 1)"),
    ("nexusflow/kernel/store.py", "import importlib\nmod = importlib.import_module('cutover.services')\n", 2,
     "imports cutover.services: nexusflow.kernel (layer 0) imports upward from cutover (layer 4)"),
    ("nexusflow/records/store.py", "from importlib import import_module\n"
                                   "import_module('..flows.store', package='nexusflow.records')\n", 2,
     "imports nexusflow.flows.store: nexusflow.records (layer 1) imports upward from nexusflow.flows (layer 3)"),
    ("nexusflow/api_errors.py", "from connectors.inbound.ingress_api import x\n", 1,
     "imports connectors.inbound.ingress_api.x: nexusflow.kernel (layer 0) imports upward from connectors (layer 3)"),
    ("packs/loopback.py", "from nexusflow import urls\n", 1,
     "imports nexusflow.urls: packs (layer 5) imports upward from composition root (layer 6)"),
    ("cutover/services.py", "from tests.concurrency import holds\n", 1,
     "imports tests.concurrency.holds: cutover (layer 4) imports upward from tests (layer 7)"),
    ("connectors/migrations/0099_x.py", "def forwards(apps, schema):\n    from nexusflow.records.models import R\n", 2,
     "imports nexusflow.records.models.R: a migration imports only its own app and the kernel, "
     "not nexusflow.records"),
    ("nexusflow/flows/x.py", "from .... import y\n", 1, "relative import beyond the top package"),
])
def test_a_wrong_way_import_is_caught(path, source, line, detail):
    assert _direction(source, path) == [(line, detail)]


def test_the_imported_module_is_named_when_the_tree_knows_it():
    found = check_import_direction("from connectors import workers\n", "nexusflow/flows/services.py",
                                   frozenset({"connectors", "connectors.workers"}))
    assert [(v.line, v.target) for v in found] == [(1, "connectors.workers")]


@pytest.mark.parametrize("path,source", [
    ("connectors/outbound/egress.py", "import json\nfrom django.db import transaction\nfrom .intents import policy_digest\n"
                             "from nexusflow.kernel.models import insert\nfrom nexusflow.records.models import R\n"
                             "from runtime_outbox.services import intent_result_record\n"),
    ("cutover/services.py", "def f():\n    from connectors.models import AccountServingGate\n"
                            "    from nexusflow.flows.models import FlowRun\n"),
    ("packs/demo/run.py", "from cutover.models import X\nfrom .common import DemoError\n"),
    ("nexusflow/records/edits.py", "from . import metadata\nfrom ..kernel import errors\nfrom nexusflow import api_errors\n"),
    ("nexusflow/urls.py", "from connectors.inbound.ingress_api import x\nfrom packs.journeys import y\n"),
    ("connectors/migrations/0013_push.py", "import nexusflow.kernel.models\ndef f(apps, schema):\n"
                                           "    from connectors.links.push_rules import body_fingerprint\n"),
    ("tests/records/test_x.py", "from packs.demo.run import run_demo\n"),
    ("scripts/create_databases.py", "from packs.demo.run import demo_database_names\n"),
])
def test_downward_and_own_app_imports_pass(path, source):
    assert _direction(source, path) == []


def _cycles(files: dict[str, str]) -> list[tuple[list[str], int, str]]:
    return [(sorted(members), v.line, v.detail) for members, v in check_import_cycles(files)]


def test_an_import_cycle_is_caught_with_its_chain():
    files = {
        "connectors/serving/epoch.py": "from .generations import read\n",
        "connectors/serving/generations.py": "import json\nfrom ..contracts.pack_document import validate\n",
        "connectors/contracts/pack_document.py": "def validate():\n    from connectors.serving import gates\n",
        "connectors/serving/gates.py": "from connectors.serving.epoch import prepare\nfrom ..store import S\n",
        "connectors/store.py": "from nexusflow.kernel.store import CasStore\n",
    }
    assert _cycles(files) == [(
        ["connectors.contracts.pack_document", "connectors.serving.epoch", "connectors.serving.gates",
         "connectors.serving.generations"], 2,
        "connectors.contracts.pack_document -> connectors.serving.gates -> connectors.serving.epoch -> "
        "connectors.serving.generations -> connectors.contracts.pack_document")]
    files["connectors/contracts/pack_document.py"] = "def validate():\n    pass\n"
    assert _cycles(files) == []


def test_cycles_across_apps_and_through_relative_imports_are_caught():
    files = {
        "nexusflow/kernel/models.py": "def insert():\n    from .store import load\n",
        "nexusflow/kernel/store.py": "from .models import insert\n",
        "nexusflow/flows/services.py": "from runtime_outbox.services import deliver\n",
        "runtime_outbox/services.py": "import importlib\nimportlib.import_module('nexusflow.flows.services')\n",
        "packs/demo/run.py": "from packs.demo.chaos import Supervisor\n",
        "packs/demo/chaos.py": "from .run import DemoError\nfrom .common import x\n",
        "packs/demo/common.py": "import sys\n",
    }
    assert _cycles(files) == [
        (["nexusflow.flows.services", "runtime_outbox.services"], 1,
         "nexusflow.flows.services -> runtime_outbox.services -> nexusflow.flows.services"),
        (["nexusflow.kernel.models", "nexusflow.kernel.store"], 2,
         "nexusflow.kernel.models -> nexusflow.kernel.store -> nexusflow.kernel.models"),
        (["packs.demo.chaos", "packs.demo.run"], 1, "packs.demo.chaos -> packs.demo.run -> packs.demo.chaos"),
    ]


def test_strongly_connected_components_are_found_whole():
    graph = {"a": {"b": 1}, "b": {"c": 1, "d": 1}, "c": {"a": 1}, "d": {"e": 1}, "e": {"d": 1, "f": 1}, "f": {},
             "g": {"g2": 1}, "g2": {}}
    assert strongly_connected(graph) == [["a", "b", "c"], ["d", "e"]]
    assert shortest_cycle({"a": {"b": 1, "c": 1}, "b": {"c": 1}, "c": {"a": 1}}, ["a", "b", "c"]) == ["a", "c", "a"]
