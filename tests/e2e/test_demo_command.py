"""``manage.py demo`` keeps its contract: JSON summary keys, dump shape, exit codes."""
import json

import pytest

from tests.conftest import hubspot_event, run_manage, subprocess_env

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

INT_KEYS = ["deliveries", "accepted", "redeliveries", "rejected", "events_admitted", "executions_completed",
            "superseded", "quarantined", "remote_creates", "remote_updates", "duplicate_remote_creates",
            "uncertain_effects", "nonterminal"]


def _write(path, deliveries):
    path.write_text("\n".join(json.dumps(d) for d in deliveries) + "\n")


def test_demo_runs_a_small_file_end_to_end(tmp_path):
    batch = [hubspot_event(1, 7001, 1000), hubspot_event(2, 7001, 2000, "email", "lee@example.com"),
             hubspot_event(3, 7001, 3000, "firstname", "Lee"), hubspot_event(4, 7001, 4000, "lifecyclestage", "customer"),
             hubspot_event(5, 7002, 1000, "email", "max@example.com")]
    redelivery = [{**e, "attemptNumber": 1} for e in batch]
    events = tmp_path / "events.jsonl"
    _write(events, [{"body": batch}, {"body": redelivery}, {"body": batch[:1], "sign": "invalid"},
                    {"body": "not json"}])
    dump = tmp_path / "dump.json"
    result = run_manage(["demo", "--events", str(events), "--json", "--dump", str(dump)], subprocess_env(), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert all(isinstance(summary[k], int) and not isinstance(summary[k], bool) for k in INT_KEYS)
    assert summary["invariants_ok"] is True
    assert (summary["deliveries"], summary["accepted"], summary["redeliveries"], summary["rejected"]) == (4, 1, 1, 2)
    assert summary["events_admitted"] == 5 and summary["remote_creates"] == 1
    assert summary["duplicate_remote_creates"] == 0 and summary["nonterminal"] == 0
    state = json.loads(dump.read_text())
    assert state["local"]["7001"] == {"email": "lee@example.com", "firstname": "Lee", "lastname": None,
                                      "lifecyclestage": "customer", "billing_id": state["remote"][0]["id"]}
    assert state["local"]["7002"]["billing_id"] is None
    assert state["remote"] == [{"id": state["remote"][0]["id"], "email": "lee@example.com", "name": "Lee",
                                "create_requests": 1}]


def test_demo_refuses_an_unreadable_events_file(tmp_path):
    events = tmp_path / "events.jsonl"
    events.write_text("{not json\n")
    result = run_manage(["demo", "--events", str(events), "--json"], subprocess_env(), timeout=60)
    assert result.returncode == 2
    assert "line 1" in result.stderr and "Traceback" not in result.stderr
