"""Structured JSON logs: correlation ids and safe codes only (seed 004 sections 17.3 and 19; issue 22 item 7)."""
from __future__ import annotations

import json
import logging

import pytest

from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.logs import CORRELATION_FIELDS, JsonFormatter
from tests.conftest import run_manage, subprocess_env

SECRET = "sk_live_do_not_log"


class _Refused(NexusError):
    code = "demo_refusal_code"


def _record(msg, args, *, exc=None, **extra) -> logging.LogRecord:
    record = logging.LogRecord("nexusflow.flows", logging.ERROR, __file__, 1, msg, args,
                               (type(exc), exc, None) if exc else None)
    for key, value in extra.items():
        setattr(record, key, value)
    return record


def test_a_json_line_keeps_ids_and_codes_and_drops_arguments_and_exception_text():
    record = _record("flow step fenced: %s", ({"email": "ada@example.com", "token": SECRET},),
                     exc=_Refused(f"payload {SECRET}"), org_id="org-1", run_id=42, step_id=7, attempt_id=3,
                     effect_id=9, trace_id="t-1", body={"token": SECRET}, execution_id="bad id with spaces")
    line = JsonFormatter().format(record)
    assert SECRET not in line and "ada@example.com" not in line
    doc = json.loads(line)
    assert doc["event"] == "flow step fenced: %s" and doc["level"] == "ERROR" and doc["logger"] == "nexusflow.flows"
    assert doc["code"] == "demo_refusal_code" and doc["error"] == "_Refused"
    assert {k: doc[k] for k in ("org_id", "run_id", "step_id", "attempt_id", "effect_id", "trace_id")} == {
        "org_id": "org-1", "run_id": 42, "step_id": 7, "attempt_id": 3, "effect_id": 9, "trace_id": "t-1"}
    assert "execution_id" not in doc and "body" not in doc
    assert set(doc) <= {"ts", "level", "logger", "event", "code", "error", *CORRELATION_FIELDS}


def test_a_code_that_is_not_a_safe_code_is_dropped():
    doc = json.loads(JsonFormatter().format(_record("x", (), code=f"Refused {SECRET}")))
    assert "code" not in doc and SECRET not in json.dumps(doc)


def test_the_json_format_is_chosen_by_the_environment_and_a_bad_value_refuses_to_start():
    script = ("import logging; logging.getLogger('nexusflow.flows').warning("
              f"'claim skipped: %s', {SECRET!r}, extra={{'org_id': 'org-1', 'run_id': 5, 'code': 'flow_claim_skipped'}})")
    result = run_manage(["shell", "-c", script], subprocess_env(NEXUS_LOG_FORMAT="json"))
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    assert [(d["event"], d["org_id"], d["run_id"], d["code"]) for d in lines] == [
        ("claim skipped: %s", "org-1", 5, "flow_claim_skipped")]
    assert SECRET not in result.stderr
    bad = run_manage(["check"], subprocess_env(NEXUS_LOG_FORMAT="xml"))
    assert bad.returncode != 0 and "NEXUS_LOG_FORMAT must be plain or json, got 'xml'" in bad.stderr


def test_a_log_context_puts_its_ids_on_every_line_inside_and_restores_the_outer_one():
    from nexusflow.kernel.logs import ContextFilter, current_log_context, log_context

    context_filter, formatter = ContextFilter(), JsonFormatter()

    def line(**extra) -> dict:
        record = _record("step ran", (), **extra)
        context_filter.filter(record)
        return json.loads(formatter.format(record))

    with log_context(org_id="org-1", run_id=42):
        with log_context(step_id=7, attempt_id=None, unit="flow.step"):
            inner = line()
            assert current_log_context() == {"org_id": "org-1", "run_id": 42, "step_id": 7, "unit": "flow.step"}
        outer = line(run_id=43)  # a value passed in extra wins
    assert {k: inner.get(k) for k in ("org_id", "run_id", "step_id", "unit")} == {
        "org_id": "org-1", "run_id": 42, "step_id": 7, "unit": "flow.step"}
    assert "attempt_id" not in inner and outer["run_id"] == 43 and "step_id" not in outer
    assert "org_id" not in line() and current_log_context() == {}
    try:
        with log_context(payload="x"):
            raise AssertionError("an unknown field is refused")
    except ValueError:
        pass


@pytest.mark.django_db
def test_a_request_carries_its_traceparent_trace_id_into_its_response(client):
    from nexusflow.kernel.logs import trace_id_of

    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    response = client.get("/api/v2/health/", HTTP_TRACEPARENT=f"00-{trace}-00f067aa0ba902b7-01")
    assert response["X-Trace-Id"] == trace
    generated = client.get("/api/v2/health/", HTTP_TRACEPARENT="garbage")["X-Trace-Id"]
    assert len(generated) == 32 and generated != trace and int(generated, 16) >= 0
    assert trace_id_of("00-" + "0" * 32 + "-00f067aa0ba902b7-01") != "0" * 32


@pytest.mark.django_db  # the worker loop closes stale connections between rounds
def test_a_worker_unit_error_logs_its_code_and_unit_never_the_exception_text(caplog):
    """``run_workers`` passes a failing unit's exception text as an argument: a JSON line keeps only the code."""
    from runtime_outbox.management.commands.run_workers import Command

    def failing_unit():
        raise _Refused(f"provider said: Authorization: Bearer {SECRET}")

    with caplog.at_level(logging.WARNING, logger="nexusflow.workers"):
        assert Command()._loop([("egress.dispatch", failing_unit)], {"flag": False}, until_idle=False, idle_rounds=1,
                               once=True, idle_sleep=0) == 0
    (record,) = [r for r in caplog.records if r.name == "nexusflow.workers"]
    line = JsonFormatter().format(record)
    assert SECRET not in line
    doc = json.loads(line)
    assert (doc["event"], doc["unit"], doc["code"]) == ("worker.unit_error %s: %s", "egress.dispatch",
                                                        "demo_refusal_code")
