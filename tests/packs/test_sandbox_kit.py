"""The sandbox kit: scripted faults, the request log, the control routes, and no provider knowledge."""
from __future__ import annotations

import hashlib
from typing import Any

import httpx
import pytest

from packs import sandbox_kit
from packs.sandbox_kit import (
    Count,
    FaultError,
    FaultScript,
    LoopbackSandbox,
    Rejected,
    SandboxHandler,
    SandboxState,
    Seconds,
    StatusCount,
    write_faults,
)
from tests.guardrails import ROOT, check_neutrality, relative
from tests.test_l0_neutrality import forbidden


def test_the_kit_names_no_provider_object_or_tenant():
    path = ROOT / "packs" / "sandbox_kit.py"
    violations = check_neutrality(path.read_text(encoding="utf-8"), relative(path), forbidden(), ())
    assert not violations, "\n".join(map(str, violations))


def test_a_faults_document_is_applied_all_or_nothing():
    script = FaultScript(Count("drop"), StatusCount("fail"), Seconds("delay", maximum=5))
    assert script.as_dict() == {"drop": 0, "fail": {"status": 503, "count": 0}, "delay": 0.0}
    with pytest.raises(FaultError, match=r"^delay must be 0-5$"):
        script.apply({"drop": 2, "delay": 6})
    with pytest.raises(FaultError, match=r"^unknown fault\(s\): a, b$"):
        script.apply({"b": 1, "drop": 1, "a": 1})
    assert script.as_dict()["drop"] == 0  # neither refused document changed anything
    assert script.apply({"drop": 2, "fail": {"status": 429}}) == {
        "drop": 2, "fail": {"status": 429, "count": 1}, "delay": 0.0}


@pytest.mark.parametrize("document, message", [
    (["x"], "faults must be a JSON object"),
    ({"drop": -1}, "drop must be a non-negative integer"),
    ({"drop": True}, "drop must be a non-negative integer"),
    ({"fail": {"count": 1}}, 'fail must be {"status": S, "count": N}'),
    ({"fail": {"status": 503, "extra": 1}}, 'fail must be {"status": S, "count": N}'),
    ({"fail": {"status": 200}}, "fail.status must be an HTTP status 400-599"),
    ({"fail": {"status": True}}, "fail.status must be an HTTP status 400-599"),
    ({"fail": {"status": 503, "count": -1}}, "fail.count must be a non-negative integer"),
    ({"delay": "1"}, "delay must be 0-60"),
    ({"delay": float("inf")}, "delay must be 0-60"),
])
def test_a_bad_faults_document_is_refused_with_its_reason(document, message):
    script = FaultScript(Count("drop"), StatusCount("fail"), Seconds("delay"))
    with pytest.raises(FaultError) as refused:
        script.apply(document)
    assert str(refused.value) == message
    assert isinstance(refused.value, ValueError)


def test_each_fault_fires_as_often_as_it_was_armed():
    script = FaultScript(Count("drop"), Count("rewind"), StatusCount("fail", default_status=502))
    script.apply({"drop": 2, "rewind": 3, "fail": {"count": 2}})
    assert [script.take("drop") for _ in range(3)] == [True, True, False]
    assert [script.take_status("fail") for _ in range(3)] == [502, 502, None]
    assert (script.take_all("rewind"), script.take_all("rewind")) == (3, 0)
    script.apply({"drop": 1})
    script.reset()
    assert script.as_dict() == {"drop": 0, "rewind": 0, "fail": {"status": 503, "count": 0}}


def test_the_write_faults_are_the_documented_three():
    assert write_faults().as_dict() == {"drop_response_after_commit": 0,
                                        "fail_before_commit": {"status": 503, "count": 0}, "delay_seconds": 0.0}


# --- a minimal sandbox built from the kit alone -------------------------------------------------------------
class _EchoState(SandboxState):
    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {"requests": self.requests.count, "by_route": self.requests.by_route()}

    def forget(self) -> None:
        pass


class _EchoHandler(SandboxHandler):
    request_log_control = True

    def serve(self, method, url, body):
        if url.path != "/echo":
            raise Rejected(404, {"error": "nowhere"})
        with self.server.state.lock:
            if self.server.state.faults.take("drop"):
                self.drop_response()
                return
        self.send_json(200, {"method": method, "size": len(body)})

    def invalid(self, message):
        return {"error": message}

    def unknown_control(self, method, path):
        return Rejected(404, {"error": f"no control {method} {path}"})

    def internal_error(self):
        return {"error": "boom"}


class _EchoSandbox(LoopbackSandbox):
    handler_class = _EchoHandler
    thread_name = "echo-sandbox"

    def __init__(self):
        super().__init__(_EchoState(secret="s", faults=FaultScript(Count("drop"))))


def test_a_kit_sandbox_counts_logs_drops_and_answers_its_controls():
    with _EchoSandbox() as sandbox:
        base = sandbox.base_url
        assert httpx.post(f"{base}/echo?x=1", content=b"abc").json() == {"method": "POST", "size": 3}
        assert httpx.get(f"{base}/nowhere").status_code == 404
        assert httpx.post(f"{base}/_sandbox/faults", json={"drop": 1}).json() == {"drop": 1}
        with pytest.raises(httpx.RemoteProtocolError):
            httpx.post(f"{base}/echo", content=b"")
        assert httpx.post(f"{base}/_sandbox/faults", json={"nope": 1}).json() == {"error": "unknown fault(s): nope"}
        assert httpx.post(f"{base}/_sandbox/faults", content=b"{").status_code == 400
        assert httpx.get(f"{base}/_sandbox/else").json() == {"error": "no control GET /_sandbox/else"}
        assert httpx.post(f"{base}/echo", content=iter([b"x"])).status_code == 411  # chunked
        assert sandbox.state() == {"requests": 3, "by_route": {"POST /echo": 2, "GET /nowhere": 1}}
        log = httpx.get(f"{base}/_sandbox/requests").json()["requests"]
        assert log == [
            {"seq": 1, "method": "POST", "path": "/echo", "body_sha256": hashlib.sha256(b"abc").hexdigest()},
            {"seq": 2, "method": "GET", "path": "/nowhere", "body_sha256": hashlib.sha256(b"").hexdigest()},
            {"seq": 3, "method": "POST", "path": "/echo", "body_sha256": hashlib.sha256(b"").hexdigest()},
        ]
        assert httpx.post(f"{base}/_sandbox/reset").json() == {"reset": True}
        assert sandbox.state() == {"requests": 0, "by_route": {}}
        with pytest.raises(ValueError):
            sandbox.set_faults(drop=-1)


def test_an_unexpected_error_is_a_500_and_closes_the_connection(monkeypatch):
    def explode(self, method, url, body):
        raise RuntimeError("bug")

    monkeypatch.setattr(_EchoHandler, "serve", explode)
    with _EchoSandbox() as sandbox:
        response = httpx.get(f"{sandbox.base_url}/echo")
    assert (response.status_code, response.json(), response.headers["connection"]) == (500, {"error": "boom"},
                                                                                      "close")


def test_the_kit_reason_phrase_falls_back_for_provider_codes():
    assert (sandbox_kit.reason_phrase(429), sandbox_kit.reason_phrase(477)) == ("Too Many Requests", "Error")
