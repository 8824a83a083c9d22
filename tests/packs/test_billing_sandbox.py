"""The loopback billing sandbox behaves like the provider's customers API."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from packs.billing.sandbox import BillingSandbox

API_KEY = "sk_test_sandbox_key"
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def sandbox() -> Iterator[BillingSandbox]:
    with BillingSandbox(API_KEY) as running:
        yield running


@pytest.fixture
def client(sandbox: BillingSandbox) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=sandbox.base_url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=10
    ) as http:
        yield http


def _state(client: httpx.Client) -> dict:
    response = client.get("/_sandbox/state")
    assert response.status_code == 200
    return response.json()


def test_create_returns_a_customer(client: httpx.Client) -> None:
    before = int(time.time())
    response = client.post("/v1/customers", data={"email": "zoe@example.com", "name": "Zoë Müller"})
    assert response.status_code == 200
    customer = response.json()
    assert customer["id"].startswith("cus_") and len(customer["id"]) > 4
    assert customer["object"] == "customer"
    assert customer["email"] == "zoe@example.com"
    assert customer["name"] == "Zoë Müller"
    assert before <= customer["created"] <= int(time.time())
    assert client.get(f"/v1/customers/{customer['id']}").json() == customer


def test_create_accepts_json_and_rejects_unknown_parameters(client: httpx.Client) -> None:
    created = client.post("/v1/customers", json={"email": "j@example.com", "name": None})
    assert created.status_code == 200
    assert created.json()["name"] is None
    refused = client.post("/v1/customers", data={"email": "x@example.com", "phone": "1"})
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "parameter_unknown"
    assert [c["email"] for c in _state(client)["customers"]] == ["j@example.com"]


def test_update_changes_fields_and_counts(client: httpx.Client) -> None:
    customer = client.post("/v1/customers", data={"email": "a@example.com", "name": "Ann Lee"}).json()
    updated = client.post(f"/v1/customers/{customer['id']}", data={"name": "Ann Li"})
    assert updated.status_code == 200
    assert updated.json() == {**customer, "name": "Ann Li"}
    unset = client.post(f"/v1/customers/{customer['id']}", data={"email": ""})
    assert unset.json()["email"] is None
    [row] = _state(client)["customers"]
    assert row == {"id": customer["id"], "email": None, "name": "Ann Li", "create_requests": 1, "update_requests": 2}


def test_update_of_unknown_customer_is_404(client: httpx.Client) -> None:
    response = client.post("/v1/customers/cus_missing", data={"name": "x"})
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "resource_missing"
    assert "cus_missing" in error["message"]
    assert client.get("/v1/customers/cus_missing").status_code == 404


@pytest.mark.parametrize("authorization", [None, "Bearer wrong", f"Basic {API_KEY}", "Bearer"])
def test_bad_or_missing_key_is_401(sandbox: BillingSandbox, authorization: str | None) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    response = httpx.post(f"{sandbox.base_url}/v1/customers", data={"email": "a@b.c"}, headers=headers)
    assert response.status_code == 401
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert httpx.get(f"{sandbox.base_url}/v1/customers", headers=headers).status_code == 401
    assert sandbox.state()["customers"] == []


def test_idempotent_replay_returns_first_result_and_counts(client: httpx.Client) -> None:
    headers = {"Idempotency-Key": "push-1"}
    first = client.post("/v1/customers", data={"email": "r@example.com", "name": "R"}, headers=headers)
    second = client.post("/v1/customers", data={"email": "r@example.com", "name": "R"}, headers=headers)
    third = client.post("/v1/customers", data={"name": "R", "email": "r@example.com"}, headers=headers)
    assert first.status_code == second.status_code == third.status_code == 200
    assert first.json() == second.json() == third.json()
    assert "Idempotent-Replayed" not in first.headers
    assert second.headers["Idempotent-Replayed"] == "true"
    state = _state(client)
    assert len(state["customers"]) == 1
    assert state["customers"][0]["create_requests"] == 3
    assert state["requests"] == 3


def test_idempotent_replay_of_an_error_and_of_updates(client: httpx.Client) -> None:
    missing = [client.post("/v1/customers/cus_gone", data={"name": "x"}, headers={"Idempotency-Key": "u-0"})
               for _ in range(2)]
    assert [r.status_code for r in missing] == [404, 404]
    assert missing[1].headers["Idempotent-Replayed"] == "true"
    customer = client.post("/v1/customers", data={"email": "u@example.com"}).json()
    for _ in range(3):
        response = client.post(f"/v1/customers/{customer['id']}", data={"name": "U"}, headers={"Idempotency-Key": "u-1"})
        assert response.status_code == 200
    [row] = _state(client)["customers"]
    assert row["update_requests"] == 3
    assert row["create_requests"] == 1


def test_idempotency_key_with_other_parameters_is_400(client: httpx.Client) -> None:
    headers = {"Idempotency-Key": "push-2"}
    assert client.post("/v1/customers", data={"email": "a@example.com"}, headers=headers).status_code == 200
    response = client.post("/v1/customers", data={"email": "b@example.com"}, headers=headers)
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "idempotency_error"
    [row] = _state(client)["customers"]
    assert row["email"] == "a@example.com"
    assert row["create_requests"] == 1
    too_long = client.post("/v1/customers", data={"email": "c@example.com"}, headers={"Idempotency-Key": "k" * 256})
    assert too_long.status_code == 400
    assert len(_state(client)["customers"]) == 1


def test_concurrent_request_with_same_key_is_409(sandbox: BillingSandbox, client: httpx.Client) -> None:
    client.post("/_sandbox/faults", json={"delay_seconds": 0.6}).raise_for_status()
    results: dict[str, httpx.Response] = {}

    def send(name: str) -> None:
        with httpx.Client(base_url=sandbox.base_url, headers={"Authorization": f"Bearer {API_KEY}"}) as http:
            results[name] = http.post("/v1/customers", data={"email": "c@example.com"},
                                      headers={"Idempotency-Key": "race"}, timeout=10)

    first = threading.Thread(target=send, args=("first",))
    first.start()
    time.sleep(0.2)
    second = threading.Thread(target=send, args=("second",))
    second.start()
    first.join(timeout=10)
    second.join(timeout=10)
    assert results["first"].status_code == 200
    assert results["second"].status_code == 409
    assert results["second"].json()["error"]["code"] == "idempotency_key_in_use"
    client.post("/_sandbox/faults", json={"delay_seconds": 0}).raise_for_status()
    replay = client.post("/v1/customers", data={"email": "c@example.com"}, headers={"Idempotency-Key": "race"})
    assert replay.json() == results["first"].json()
    [row] = _state(client)["customers"]
    assert row["create_requests"] == 2


def test_dropped_response_after_commit(client: httpx.Client) -> None:
    client.post("/_sandbox/faults", json={"drop_response_after_commit": 1}).raise_for_status()
    with pytest.raises(httpx.TransportError):
        client.post("/v1/customers", data={"email": "d@example.com"}, headers={"Idempotency-Key": "amb-1"})
    [row] = _state(client)["customers"]
    assert row["email"] == "d@example.com"
    assert row["create_requests"] == 1
    retry = client.post("/v1/customers", data={"email": "d@example.com"}, headers={"Idempotency-Key": "amb-1"})
    assert retry.status_code == 200
    assert retry.json()["id"] == row["id"]
    [row] = _state(client)["customers"]
    assert row["create_requests"] == 2


def test_fail_before_commit_performs_nothing(client: httpx.Client) -> None:
    faults = client.post("/_sandbox/faults", json={"fail_before_commit": {"status": 503, "count": 2}}).json()
    assert faults["fail_before_commit"] == {"status": 503, "count": 2}
    statuses = [client.post("/v1/customers", data={"email": "f@example.com"}, headers={"Idempotency-Key": "f-1"})
                .status_code for _ in range(3)]
    assert statuses == [503, 503, 200]
    [row] = _state(client)["customers"]
    assert row["create_requests"] == 1


def test_fault_validation(client: httpx.Client, sandbox: BillingSandbox) -> None:
    for bad in ({"drop_response_after_commit": -1}, {"fail_before_commit": {"status": 200}},
                {"delay_seconds": "1"}, {"surprise": 1}, ["x"]):
        assert client.post("/_sandbox/faults", json=bad).status_code == 400
    with pytest.raises(ValueError):
        sandbox.set_faults(delay_seconds=-1)
    assert sandbox.set_faults(drop_response_after_commit=2)["drop_response_after_commit"] == 2
    assert client.get("/_sandbox/faults").json()["drop_response_after_commit"] == 2


def test_state_list_and_reset(client: httpx.Client) -> None:
    ids = [client.post("/v1/customers", data={"email": f"s{n}@example.com"}).json()["id"] for n in range(3)]
    state = _state(client)
    assert [c["id"] for c in state["customers"]] == ids
    assert all(set(c) == {"id", "email", "name", "create_requests", "update_requests"} for c in state["customers"])
    assert state["requests"] == 3
    listed = client.get("/v1/customers", params={"limit": 2}).json()
    assert listed["object"] == "list"
    assert [c["id"] for c in listed["data"]] == [ids[2], ids[1]]
    assert listed["has_more"] is True
    rest = client.get("/v1/customers", params={"limit": 2, "starting_after": ids[1]}).json()
    assert [c["id"] for c in rest["data"]] == [ids[0]] and rest["has_more"] is False
    assert [c["id"] for c in client.get("/v1/customers", params={"email": "s1@example.com"}).json()["data"]] == [ids[1]]
    assert client.post("/_sandbox/reset").status_code == 200
    assert _state(client) == {"customers": [], "requests": 0}


def test_runs_as_a_process_until_sigterm(tmp_path: Path) -> None:
    port_file = tmp_path / "port"
    process = subprocess.Popen(
        [sys.executable, "-m", "packs.billing.sandbox", "--port", "0", "--api-key", API_KEY,
         "--port-file", str(port_file), "--log-level", "WARNING"],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    try:
        deadline = time.monotonic() + 15
        while not port_file.exists():
            assert process.poll() is None, "sandbox process exited early"
            assert time.monotonic() < deadline, "sandbox never wrote its port file"
            time.sleep(0.05)
        base_url = f"http://127.0.0.1:{int(port_file.read_text())}"
        response = httpx.post(f"{base_url}/v1/customers", data={"email": "p@example.com"},
                              headers={"Authorization": f"Bearer {API_KEY}"})
        assert response.status_code == 200
        assert httpx.get(f"{base_url}/_sandbox/state").json()["customers"][0]["email"] == "p@example.com"
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0


def test_a_process_reads_its_key_from_the_environment_so_the_process_list_never_shows_it(tmp_path: Path) -> None:
    port_file = tmp_path / "port"
    process = subprocess.Popen(
        [sys.executable, "-m", "packs.billing.sandbox", "--port", "0", "--secret-env", "SANDBOX_TEST_KEY",
         "--port-file", str(port_file), "--log-level", "WARNING"],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "SANDBOX_TEST_KEY": API_KEY},
    )
    try:
        deadline = time.monotonic() + 15
        while not port_file.exists():
            assert process.poll() is None, "sandbox process exited early"
            assert time.monotonic() < deadline, "sandbox never wrote its port file"
            time.sleep(0.05)
        assert API_KEY.encode() not in Path(f"/proc/{process.pid}/cmdline").read_bytes()
        base_url = f"http://127.0.0.1:{int(port_file.read_text())}"
        headers = {"Authorization": f"Bearer {API_KEY}"}
        assert httpx.post(f"{base_url}/v1/customers", data={"email": "e@example.com"}, headers=headers).status_code == 200
        wrong = {"Authorization": "Bearer not-the-key"}
        assert httpx.post(f"{base_url}/v1/customers", data={"email": "f@example.com"}, headers=wrong).status_code == 401
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    unset = subprocess.run([sys.executable, "-m", "packs.billing.sandbox", "--port", "0", "--secret-env", "UNSET_KEY_VAR"],
                           cwd=REPO_ROOT, env={k: v for k, v in os.environ.items() if k != "UNSET_KEY_VAR"},
                           capture_output=True, text=True, timeout=30)
    assert unset.returncode == 2 and "UNSET_KEY_VAR is not set" in unset.stderr
