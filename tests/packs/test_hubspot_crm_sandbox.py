"""The loopback CRM objects sandbox behaves like the provider's contacts and companies API (FACTS.md)."""
from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from packs.hubspot.crm_sandbox import COMPANIES_PATH, CONTACTS_PATH, JSON_CONTENT_TYPE, CrmSandbox

TOKEN = "pat-sandbox-token"
REPO_ROOT = Path(__file__).resolve().parents[2]
ISO_MS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


@pytest.fixture
def sandbox() -> Iterator[CrmSandbox]:
    with CrmSandbox(TOKEN) as running:
        yield running


@pytest.fixture
def client(sandbox: CrmSandbox) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=sandbox.base_url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10) as http:
        yield http


def _state(client: httpx.Client) -> dict:
    response = client.get("/_sandbox/state")
    assert response.status_code == 200
    return response.json()


def _create(client: httpx.Client, **properties: str) -> httpx.Response:
    return client.post(CONTACTS_PATH, json={"properties": properties})


def _is_uuid(value: str) -> bool:
    return str(uuid.UUID(value)) == value


def test_create_returns_201_with_the_object_shape(client: httpx.Client) -> None:
    response = _create(client, email="ann@x.io", firstname="Ann")
    assert response.status_code == 201
    assert response.headers["content-type"] == JSON_CONTENT_TYPE
    body = response.json()
    assert set(body) == {"id", "properties", "createdAt", "updatedAt", "archived"}
    assert body["id"].isdigit() and body["archived"] is False
    assert ISO_MS.fullmatch(body["createdAt"]) and body["updatedAt"] == body["createdAt"]
    assert body["properties"] == {"email": "ann@x.io", "firstname": "Ann", "hs_object_id": body["id"],
                                  "createdate": body["createdAt"], "lastmodifieddate": body["updatedAt"]}
    assert client.get(f"{CONTACTS_PATH}/{body['id']}").json() == body


def test_duplicate_email_on_create_is_409_exactly_as_the_provider_answers(client: httpx.Client) -> None:
    first = _create(client, email="dup@x.io").json()
    response = _create(client, email="DUP@x.io", firstname="Other")
    assert response.status_code == 409
    assert response.headers["content-type"] == "application/json;charset=utf-8"
    body = response.json()
    assert list(body) == ["status", "message", "correlationId", "category"]
    assert body["status"] == "error" and body["category"] == "CONFLICT"
    assert body["message"] == f"Contact already exists. Existing ID: {first['id']}"
    assert _is_uuid(body["correlationId"])
    [row] = _state(client)["contacts"]
    assert row["properties"] == {"email": "dup@x.io"}  # nothing created, nothing changed
    assert (row["create_requests"], row["update_requests"], row["conflict_requests"]) == (1, 0, 1)


def test_update_patches_properties_and_answers_200_with_the_same_shape(client: httpx.Client) -> None:
    created = _create(client, email="bo@x.io", firstname="Bo", lastname="Li").json()
    response = client.patch(f"{CONTACTS_PATH}/{created['id']}",
                            json={"properties": {"lastname": "Lee", "firstname": ""}})
    assert response.status_code == 200
    body = response.json()
    assert body["id"] == created["id"] and body["createdAt"] == created["createdAt"]
    assert {k: v for k, v in body["properties"].items() if k in ("email", "firstname", "lastname")} == {
        "email": "bo@x.io", "lastname": "Lee"}
    [row] = _state(client)["contacts"]
    assert row["properties"] == {"email": "bo@x.io", "lastname": "Lee"}
    assert (row["create_requests"], row["update_requests"]) == (1, 1)


def test_id_property_email_addresses_a_contact(client: httpx.Client) -> None:
    created = _create(client, email="cy@x.io").json()
    found = client.get(f"{CONTACTS_PATH}/CY@x.io", params={"idProperty": "email"})
    assert found.status_code == 200 and found.json()["id"] == created["id"]
    patched = client.patch(f"{CONTACTS_PATH}/cy@x.io", params={"idProperty": "email"},
                           json={"properties": {"firstname": "Cy"}})
    assert patched.status_code == 200 and patched.json()["properties"]["firstname"] == "Cy"
    assert client.get(f"{CONTACTS_PATH}/nobody@x.io", params={"idProperty": "email"}).status_code == 404
    assert client.get(f"{CONTACTS_PATH}/cy@x.io", params={"idProperty": "phone"}).status_code == 400


def test_missing_object_is_404_with_the_provider_shape(client: httpx.Client) -> None:
    for response in (client.get(f"{CONTACTS_PATH}/999999"),
                     client.patch(f"{CONTACTS_PATH}/999999", json={"properties": {"firstname": "x"}})):
        assert response.status_code == 404
        body = response.json()
        assert list(body) == ["status", "message", "correlationId"]
        assert (body["status"], body["message"]) == ("error", "resource not found") and _is_uuid(body["correlationId"])


def test_archived_contact_is_gone_and_frees_its_email(client: httpx.Client) -> None:
    created = _create(client, email="di@x.io").json()
    deleted = client.delete(f"{CONTACTS_PATH}/{created['id']}")
    assert deleted.status_code == 204 and deleted.content == b""
    assert client.get(f"{CONTACTS_PATH}/{created['id']}").status_code == 404
    assert client.patch(f"{CONTACTS_PATH}/{created['id']}", json={"properties": {"firstname": "x"}}).status_code == 404
    again = _create(client, email="di@x.io")
    assert again.status_code == 201 and again.json()["id"] != created["id"]


def test_update_to_an_email_another_contact_holds_is_409_and_changes_nothing(client: httpx.Client) -> None:
    ann = _create(client, email="a@x.io").json()
    bob = _create(client, email="b@x.io").json()
    response = client.patch(f"{CONTACTS_PATH}/{bob['id']}", json={"properties": {"email": "a@x.io"}})
    assert response.status_code == 409
    assert response.json()["message"] == f"Contact already exists. Existing ID: {ann['id']}"
    rows = {row["id"]: row for row in _state(client)["contacts"]}
    assert rows[bob["id"]]["properties"]["email"] == "b@x.io" and rows[bob["id"]]["update_requests"] == 0
    assert rows[ann["id"]]["conflict_requests"] == 1
    assert client.patch(f"{CONTACTS_PATH}/{ann['id']}", json={"properties": {"email": "a@x.io"}}).status_code == 200


@pytest.mark.parametrize("body", [{"email": "x@x.io"}, {"properties": {"unknown_prop": "1"}},
                                  {"properties": {"email": 5}}, {"properties": []}, ["x"]])
def test_invalid_bodies_are_400_validation_errors(client: httpx.Client, body) -> None:
    response = client.post(CONTACTS_PATH, json=body)
    assert response.status_code == 400
    assert response.json()["category"] == "VALIDATION_ERROR"
    assert _state(client)["contacts"] == []


def test_non_json_bodies_are_refused(client: httpx.Client) -> None:
    assert client.post(CONTACTS_PATH, content=b"{", headers={"Content-Type": "application/json"}).status_code == 400
    assert client.post(CONTACTS_PATH, data={"email": "f@x.io"}).status_code == 415
    assert _state(client)["contacts"] == []


@pytest.mark.parametrize("authorization", [None, "Bearer wrong", f"Basic {TOKEN}", "Bearer"])
def test_a_bad_or_missing_token_is_401(sandbox: CrmSandbox, authorization: str | None) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    response = httpx.post(f"{sandbox.base_url}{CONTACTS_PATH}", json={"properties": {"email": "a@b.c"}},
                          headers=headers)
    assert response.status_code == 401
    assert response.json()["category"] == "INVALID_AUTHENTICATION"
    assert httpx.get(f"{sandbox.base_url}{CONTACTS_PATH}/501", headers=headers).status_code == 401
    assert sandbox.state()["contacts"] == [] and sandbox.state()["requests"] == 2


def test_no_idempotency_keys_a_repeated_create_is_a_second_request(client: httpx.Client) -> None:
    headers = {"Idempotency-Key": "k-1"}
    first = client.post(CONTACTS_PATH, json={"properties": {"firstname": "Nomail"}}, headers=headers)
    second = client.post(CONTACTS_PATH, json={"properties": {"firstname": "Nomail"}}, headers=headers)
    assert first.status_code == second.status_code == 201 and first.json()["id"] != second.json()["id"]
    assert len(_state(client)["contacts"]) == 2


def test_counters_by_route_and_method(client: httpx.Client) -> None:
    created = _create(client, email="e@x.io").json()
    client.patch(f"{CONTACTS_PATH}/{created['id']}", json={"properties": {"firstname": "E"}})
    client.get(f"{CONTACTS_PATH}/{created['id']}")
    _create(client, email="e@x.io")
    client.get("/crm/v3/objects/companies/1")
    state = _state(client)
    assert state["requests"] == 5
    assert state["requests_by_route"] == {
        f"POST {CONTACTS_PATH}": 2, f"PATCH {CONTACTS_PATH}/{created['id']}": 1,
        f"GET {CONTACTS_PATH}/{created['id']}": 1, "GET /crm/v3/objects/companies/1": 1}
    [row] = state["contacts"]
    assert set(row) == {"id", "properties", "archived", "create_requests", "update_requests", "conflict_requests",
                        "associations"}
    assert (row["create_requests"], row["update_requests"], row["conflict_requests"]) == (1, 1, 1)


def test_the_request_log_keeps_each_api_request_with_the_digest_of_its_exact_body(
        client: httpx.Client, sandbox: CrmSandbox) -> None:
    create_body = b'{"properties": {"email": "log@x.io"}}'
    created = client.post(CONTACTS_PATH, content=create_body, headers={"Content-Type": "application/json"}).json()
    patch_body = b'{"properties":{"firstname":"L"}}'
    client.patch(f"{CONTACTS_PATH}/{created['id']}?archived=false", content=patch_body,
                 headers={"Content-Type": "application/json"})
    client.get(f"{CONTACTS_PATH}/{created['id']}")
    httpx.get(f"{sandbox.base_url}{CONTACTS_PATH}/{created['id']}")  # refused (401): still a request
    _state(client)  # controls are not API requests
    empty = hashlib.sha256(b"").hexdigest()
    expected = [
        {"seq": 1, "method": "POST", "path": CONTACTS_PATH, "body_sha256": hashlib.sha256(create_body).hexdigest()},
        {"seq": 2, "method": "PATCH", "path": f"{CONTACTS_PATH}/{created['id']}",
         "body_sha256": hashlib.sha256(patch_body).hexdigest()},
        {"seq": 3, "method": "GET", "path": f"{CONTACTS_PATH}/{created['id']}", "body_sha256": empty},
        {"seq": 4, "method": "GET", "path": f"{CONTACTS_PATH}/{created['id']}", "body_sha256": empty},
    ]
    response = client.get("/_sandbox/requests")
    assert response.status_code == 200 and response.json() == {"requests": expected}
    assert sandbox.request_log() == expected and _state(client)["requests"] == 4
    client.post("/_sandbox/reset").raise_for_status()
    assert client.get("/_sandbox/requests").json() == {"requests": []}


def test_dropped_response_after_commit_stores_the_create(client: httpx.Client) -> None:
    client.post("/_sandbox/faults", json={"drop_response_after_commit": 1}).raise_for_status()
    with pytest.raises(httpx.TransportError):
        _create(client, email="drop@x.io")
    [row] = _state(client)["contacts"]
    assert row["properties"] == {"email": "drop@x.io"} and row["create_requests"] == 1
    # Without idempotency keys the provider cannot recognise a repeat: it is a conflict now.
    repeat = _create(client, email="drop@x.io")
    assert repeat.status_code == 409 and repeat.json()["message"].endswith(f"Existing ID: {row['id']}")
    assert client.get(f"{CONTACTS_PATH}/drop@x.io", params={"idProperty": "email"}).json()["id"] == row["id"]


def test_dropped_response_after_an_update_stores_the_update(client: httpx.Client) -> None:
    created = _create(client, email="u@x.io").json()
    client.post("/_sandbox/faults", json={"drop_response_after_commit": 1}).raise_for_status()
    with pytest.raises(httpx.TransportError):
        client.patch(f"{CONTACTS_PATH}/{created['id']}", json={"properties": {"firstname": "U"}})
    [row] = _state(client)["contacts"]
    assert row["properties"]["firstname"] == "U" and row["update_requests"] == 1


def test_rate_limit_before_commit_performs_nothing_and_carries_the_provider_headers(client: httpx.Client) -> None:
    faults = client.post("/_sandbox/faults", json={"fail_before_commit": {"status": 429, "count": 2}}).json()
    assert faults["fail_before_commit"] == {"status": 429, "count": 2}
    responses = [_create(client, email="rl@x.io") for _ in range(3)]
    assert [r.status_code for r in responses] == [429, 429, 201]
    limited = responses[0]
    body = limited.json()
    assert (body["status"], body["errorType"], body["policyName"]) == ("error", "RATE_LIMIT", "TEN_SECONDLY_ROLLING")
    assert body["message"] == "You have reached your ten_secondly_rolling limit." and _is_uuid(body["correlationId"])
    assert limited.headers["X-HubSpot-RateLimit-Remaining"] == "0"
    assert limited.headers["X-HubSpot-RateLimit-Max"] == "100"
    assert limited.headers["X-HubSpot-RateLimit-Interval-Milliseconds"] == "10000"
    [row] = _state(client)["contacts"]
    assert row["create_requests"] == 1
    assert _state(client)["requests_by_route"] == {f"POST {CONTACTS_PATH}": 3}


@pytest.mark.parametrize("status", [477, 502, 503, 504, 521])
def test_other_statuses_before_commit_perform_nothing(client: httpx.Client, status: int) -> None:
    client.post("/_sandbox/faults", json={"fail_before_commit": {"status": status, "count": 1}}).raise_for_status()
    response = _create(client, email="s@x.io")
    assert response.status_code == status and response.json()["status"] == "error"
    if status == 477:
        assert response.headers["Retry-After"] == "1"
    assert _state(client)["contacts"] == []


def test_fail_before_commit_spares_reads(client: httpx.Client) -> None:
    created = _create(client, email="r@x.io").json()
    client.post("/_sandbox/faults", json={"fail_before_commit": {"status": 503, "count": 1}}).raise_for_status()
    assert client.get(f"{CONTACTS_PATH}/{created['id']}").status_code == 200
    assert client.patch(f"{CONTACTS_PATH}/{created['id']}", json={"properties": {"firstname": "R"}}).status_code == 503


def test_delay_holds_every_write(client: httpx.Client, sandbox: CrmSandbox) -> None:
    sandbox.set_faults(delay_seconds=0.4)
    started = time.monotonic()
    assert _create(client, email="slow@x.io").status_code == 201
    assert time.monotonic() - started >= 0.4
    sandbox.set_faults(delay_seconds=0)
    started = time.monotonic()
    assert _create(client, email="fast@x.io").status_code == 201
    assert time.monotonic() - started < 0.4


def test_fault_validation(client: httpx.Client, sandbox: CrmSandbox) -> None:
    for bad in ({"drop_response_after_commit": -1}, {"fail_before_commit": {"status": 200}},
                {"fail_before_commit": {"count": 1}}, {"delay_seconds": "1"}, {"delay_seconds": 61},
                {"surprise": 1}, ["x"]):
        assert client.post("/_sandbox/faults", json=bad).status_code == 400
    with pytest.raises(ValueError):
        sandbox.set_faults(delay_seconds=-1)
    assert sandbox.set_faults(drop_response_after_commit=2)["drop_response_after_commit"] == 2
    assert client.get("/_sandbox/faults").json()["drop_response_after_commit"] == 2


def test_reset_forgets_contacts_and_counters_but_never_reuses_ids(client: httpx.Client, sandbox: CrmSandbox) -> None:
    first = _create(client, email="z@x.io").json()["id"]
    sandbox.set_faults(drop_response_after_commit=3)
    assert client.post("/_sandbox/reset").status_code == 200
    assert _state(client) == {"contacts": [], "companies": [], "requests": 0, "requests_by_route": {}}
    assert client.get("/_sandbox/faults").json()["drop_response_after_commit"] == 0
    second = _create(client, email="z@x.io").json()["id"]
    assert int(second) > int(first)
    assert sandbox.contact_by_email("Z@x.io")["id"] == second


def test_runs_as_a_process_until_sigterm(tmp_path: Path) -> None:
    port_file = tmp_path / "port"
    process = subprocess.Popen(
        [sys.executable, "-m", "packs.hubspot.crm_sandbox", "--port", "0", "--token", TOKEN,
         "--port-file", str(port_file), "--log-level", "WARNING"],
        cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    try:
        deadline = time.monotonic() + 15
        while not port_file.exists():
            assert process.poll() is None, "sandbox process exited early"
            assert time.monotonic() < deadline, "sandbox never wrote its port file"
            time.sleep(0.05)
        base_url = f"http://127.0.0.1:{int(port_file.read_text())}"
        response = httpx.post(f"{base_url}{CONTACTS_PATH}", json={"properties": {"email": "p@x.io"}},
                              headers={"Authorization": f"Bearer {TOKEN}"})
        assert response.status_code == 201
        assert httpx.get(f"{base_url}/_sandbox/state").json()["contacts"][0]["properties"] == {"email": "p@x.io"}
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0


# --- companies and inline associations on contact create ---------------------------------------------------
ASSOCIATION = {"associationCategory": "HUBSPOT_DEFINED", "associationTypeId": 279}


def test_companies_are_created_patched_read_and_archived_like_contacts(client: httpx.Client,
                                                                       sandbox: CrmSandbox) -> None:
    created = client.post(COMPANIES_PATH, json={"properties": {"name": "Acme", "domain": "acme.io"}})
    assert created.status_code == 201
    company = created.json()
    assert company["properties"]["name"] == "Acme" and company["properties"]["hs_object_id"] == company["id"]
    contact = _create(client, email="ann@x.io").json()
    assert int(contact["id"]) == int(company["id"]) + 1  # one id sequence for both objects
    assert client.patch(f"{COMPANIES_PATH}/{company['id']}", json={"properties": {"domain": ""}}).status_code == 200
    assert client.get(f"{COMPANIES_PATH}/{company['id']}").json()["properties"].get("domain") is None
    assert client.post(COMPANIES_PATH, json={"properties": {"email": "x@x.io"}}).status_code == 400
    assert client.patch(f"{COMPANIES_PATH}/{company['id']}",
                        json={"properties": {}, "associations": []}).status_code == 400
    assert sandbox.company(company["id"]) == {"id": company["id"], "properties": {"name": "Acme"},
                                              "archived": False, "create_requests": 1, "update_requests": 1}
    assert client.delete(f"{COMPANIES_PATH}/{company['id']}").status_code == 204
    assert client.get(f"{COMPANIES_PATH}/{company['id']}").status_code == 404
    assert client.patch(f"{COMPANIES_PATH}/{company['id']}", json={"properties": {"name": "B"}}).status_code == 404
    assert sandbox.company(company["id"])["archived"] is True


def test_a_contact_create_records_its_inline_company_associations(client: httpx.Client, sandbox: CrmSandbox) -> None:
    company = client.post(COMPANIES_PATH, json={"properties": {"name": "Acme"}}).json()["id"]
    response = client.post(CONTACTS_PATH, json={"properties": {"email": "ann@x.io"},
                                                "associations": [{"to": {"id": company}, "types": [ASSOCIATION]}]})
    assert response.status_code == 201
    assert set(response.json()) == {"id", "properties", "createdAt", "updatedAt", "archived"}
    row = sandbox.contact_by_email("ann@x.io")
    assert row["associations"] == [{"to": company, "types": [ASSOCIATION]}]
    # An update carries properties only.
    assert client.patch(f"{CONTACTS_PATH}/{row['id']}", json={"properties": {"firstname": "A"},
                                                              "associations": []}).status_code == 400


@pytest.mark.parametrize("associations", [
    {"to": {"id": "1"}},
    [{"to": {"id": 7}, "types": [ASSOCIATION]}],
    [{"to": {"id": "7"}, "types": []}],
    [{"to": {"id": "7"}, "types": [{"associationCategory": "HUBSPOT_DEFINED", "associationTypeId": 4}]}],
    [{"to": {"id": "7"}, "types": [{"associationCategory": "SOMEONE", "associationTypeId": 279}]}],
])
def test_a_malformed_association_is_400_and_creates_nothing(client: httpx.Client, associations) -> None:
    response = client.post(CONTACTS_PATH, json={"properties": {"email": "ann@x.io"}, "associations": associations})
    assert response.status_code == 400 and response.json()["category"] == "VALIDATION_ERROR"
    assert _state(client)["contacts"] == []


def test_an_association_to_an_unknown_or_archived_company_is_400_and_creates_nothing(client: httpx.Client) -> None:
    archived = client.post(COMPANIES_PATH, json={"properties": {"name": "Gone"}}).json()["id"]
    client.delete(f"{COMPANIES_PATH}/{archived}").raise_for_status()
    for company in ("999999", archived):
        response = client.post(CONTACTS_PATH, json={"properties": {"email": "ann@x.io"},
                                                    "associations": [{"to": {"id": company}, "types": [ASSOCIATION]}]})
        assert response.status_code == 400
        body = response.json()
        assert body["category"] == "VALIDATION_ERROR" and company in body["message"] and _is_uuid(body["correlationId"])
    assert _state(client)["contacts"] == []
