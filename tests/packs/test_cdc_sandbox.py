"""The loopback change-stream sandbox behaves like the provider's stream (FACTS.md "Change Data Capture")."""
from __future__ import annotations

from itertools import pairwise

import httpx
import pytest

from packs.salesforce_cdc import change_event, replay_id
from packs.salesforce_cdc.sandbox import StreamSandbox

TOKEN = "tok"
TOPIC = "/data/ContactChangeEvent"


@pytest.fixture
def sandbox():
    with StreamSandbox(TOKEN) as running:
        yield running


def _fetch(sandbox, after=None, limit=50, token=TOKEN, topic=TOPIC):
    params = {"topic": topic, "limit": str(limit)}
    if after is not None:
        params["after"] = str(after)
    return httpx.get(f"{sandbox.base_url}/stream/events", params=params,
                     headers={"Authorization": f"Bearer {token}"}, timeout=5)


def test_replay_ids_are_opaque_increasing_and_not_contiguous(sandbox):
    ids = sandbox.publish([change_event(record_ids=[f"003{i}"], sequence=i + 1) for i in range(30)])
    assert ids == sorted(ids) and len(set(ids)) == 30
    assert any(b - a > 1 for a, b in pairwise(ids)), "gaps make replayIds impossible to compute"


def test_fetch_serves_events_after_an_exact_replay_id_at_most_limit(sandbox):
    ids = sandbox.publish([change_event(record_ids=[f"003{i}"], sequence=i + 1) for i in range(5)])
    sandbox.publish({**change_event(entity="Lead", record_ids=["00Q1"]), "channel": "/data/LeadChangeEvent"})
    first = _fetch(sandbox, limit=2).json()
    assert [replay_id(e) for e in first["events"]] == ids[:2] and first["latestReplayId"] == ids[1]
    rest = _fetch(sandbox, after=first["latestReplayId"]).json()
    assert [replay_id(e) for e in rest["events"]] == ids[2:]  # the other topic is not served
    assert rest["events"][0]["data"]["payload"]["ChangeEventHeader"]["recordIds"] == ["0032"]
    empty = _fetch(sandbox, after=ids[-1]).json()
    assert empty == {"events": [], "latestReplayId": ids[-1]}


@pytest.mark.parametrize("kwargs,status,code", [
    ({"after": 1}, 400, "INVALID_REPLAY_ID"),
    ({"token": "wrong"}, 401, "INVALID_SESSION_ID"),
    ({"limit": 0}, 400, "INVALID_FIELD"),
    ({"topic": ""}, 400, "INVALID_FIELD"),
])
def test_bad_fetches_get_a_provider_shaped_error(sandbox, kwargs, status, code):
    response = _fetch(sandbox, **kwargs)
    assert response.status_code == status and response.json()[0]["errorCode"] == code


def test_faults_drop_duplicate_rewind_and_fail(sandbox):
    ids = sandbox.publish([change_event(record_ids=[f"003{i}"], sequence=i + 1) for i in range(3)])
    faults = httpx.post(f"{sandbox.base_url}/_sandbox/faults", json={"drop_connection": 1}, timeout=5).json()
    assert faults["drop_connection"] == 1
    with pytest.raises(httpx.HTTPError):
        _fetch(sandbox)
    sandbox.set_faults(duplicate_delivery=1)
    assert [replay_id(e) for e in _fetch(sandbox, limit=2).json()["events"]] == [ids[0], ids[0], ids[1], ids[1]]
    sandbox.set_faults(rewind=2)
    assert [replay_id(e) for e in _fetch(sandbox, after=ids[2]).json()["events"]] == ids[1:]
    sandbox.set_faults(fail_status={"status": 503, "count": 1})
    assert _fetch(sandbox).status_code == 503 and _fetch(sandbox).status_code == 200
    with pytest.raises(ValueError):
        sandbox.set_faults(no_such_fault=1)
    assert sandbox.state()["events"] == 3
