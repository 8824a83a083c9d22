"""The DBOS Transact peer end to end (run with ``make bench``; needs ``var/bench/dbos-venv`` and PostgreSQL).

Small counts: this proves the peer does the work it is credited with (every contact pushed once, its
remote id stored), not how fast.
"""
import subprocess

import pytest

from packs.bench.dbos_peer import DBOS_VENV, PG_URL, dbos_noop_series, dbos_push_series, dbos_start
from packs.bench.measure import WORKER_COUNTS
from packs.billing.sandbox import BillingSandbox

pytestmark = [pytest.mark.bench,
              pytest.mark.skipif(not (DBOS_VENV / "bin" / "python").exists(),
                                 reason="no DBOS virtualenv (make bench installs it)")]

APP_DB = "nexus_test_bench_dbos"


@pytest.fixture
def peer():
    peer, status = dbos_start(APP_DB, print)
    if peer is None:
        pytest.skip(f"the DBOS peer cannot run here: {status['reason']}")
    yield peer
    for name in (peer.app_db, peer.sys_db):
        subprocess.run(["psql", f"{PG_URL}/postgres", "-qc", f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'],
                       capture_output=True, check=False)


def _psql(peer, database: str, sql: str) -> str:
    return subprocess.run(["psql", f"{peer.pg_url}/{database}", "-Atc", sql], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_every_noop_workflow_of_each_point_succeeds_once(peer):
    points = dbos_noop_series(peer, 20, print)
    assert [(p["workers"], p["units"], p["failed"]) for p in points] == [(n, 20, 0) for n in WORKER_COUNTS]
    assert all(p["per_second"] > 0 and p["commits_per_unit"] > 0 for p in points)
    assert _psql(peer, peer.sys_db, "SELECT status, count(*) FROM dbos.workflow_status "
                 "WHERE queue_name LIKE 'noop-%' GROUP BY status") == "SUCCESS|60"


def test_every_push_creates_one_customer_and_stores_its_id_on_the_contact(peer):
    with BillingSandbox("sk_bench_dbos") as sandbox:
        points = dbos_push_series(peer, 8, sandbox.base_url, {"NEXUS_DEMO_BILLING_API_KEY": "sk_bench_dbos"}, print)
        customers = sandbox.state()["customers"]
    assert [(p["workers"], p["units"]) for p in points] == [(n, 8) for n in WORKER_COUNTS]
    assert len(customers) == 24 and {c["create_requests"] for c in customers} == {1}
    stored = dict(line.split("|") for line in _psql(peer, peer.app_db,
                                                     "SELECT email, billing_id FROM bench_contact").splitlines())
    assert stored == {c["email"]: c["id"] for c in customers}
