"""Build guardrails over the code base (ARCHITECTURE.md sections 2 and 6), each with a self-test.

* no ORM read selects a tenant row by id without ``org_id`` ("Trusted scope");
* raw SQL lives only in ``store.py`` / ``selectors.py`` (and migrations);
* only the egress adapter (and L1 provider sandboxes, and tests) imports an HTTP client.

The self-tests feed each checker a deliberately broken snippet and its
corrected form, and assert the exact violation reported.
"""
from __future__ import annotations

import pytest
from django.apps import apps

from tests.guardrails import (
    ROOT,
    check_http_imports,
    check_raw_sql,
    check_store_discipline,
    check_unscoped_reads,
    l0_files,
    model_facts,
    project_python_files,
    relative,
)

#: L0 modules the unscoped-read rule covers: everything but the read-only admin (scoped by
#: ``ReadOnlyAdmin.get_queryset`` to the operator's orgs) and migrations.
SCOPED_READ_FILES = [p for p in l0_files() if p.name != "admin.py"]
#: ``(path, line number)`` pairs allowed an id read without ``org_id``. Empty: every read is scoped.
UNSCOPED_READ_EXEMPT: frozenset[tuple[str, int]] = frozenset()

#: Files that may import an HTTP client, each with its reason.
HTTP_CLIENT_ALLOWED = {
    "connectors/egress.py": "the sole egress adapter (ARCHITECTURE.md section 2)",
    "connectors/stream_transport.py": "the one read-only fetch of pulled routes; no transaction, no write",
    "packs/hubspot/sender.py": "L1 provider sandbox: sends provider-shaped webhooks to the ingress",
    "packs/demo/run.py": "L1 demo driver: plays the provider against a running web process",
    "packs/journeys.py": "L1 journey harness: waits for the running web process and posts webhooks to it",
    "packs/hubspot/journeys.py": "L1 journeys: seed and read the provider sandbox through its own API",
    "packs/hubspot/conversion_journeys.py": "L1 journeys: act as an operator against the running web process",
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
            "connectors/api.py", "cutover/management/commands/cutover.py", "connectors/egress.py"} <= names
    assert not [n for n in names if n.endswith("admin.py") or "/migrations/" in n]


def _unscoped(source: str) -> list[tuple[int, str]]:
    return [(v.line, v.detail) for v in check_unscoped_reads(source, "connectors/x.py", _facts())]


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
    found = [(v.line, v.detail) for v in check_raw_sql(broken, "connectors/executions.py")]
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
    assert check_http_imports(text, "connectors/signatures.py") == []


# --- 6. locks and state writes go through stores --------------------------------------


@pytest.mark.parametrize("path", list(l0_files()), ids=lambda p: relative(p))
def test_locks_and_state_writes_go_through_stores(path):
    violations = check_store_discipline(path.read_text(encoding="utf-8"), relative(path))
    assert not violations, "\n".join(map(str, violations))


@pytest.mark.parametrize("source,detail", [
    ("def f(o):\n    return Execution.objects.select_for_update().filter(org_id=o)\n",
     "select_for_update outside a store"),
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
