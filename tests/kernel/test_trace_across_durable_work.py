"""A webhook's trace id crosses every durable boundary of the work it causes (seed 004 section 19; issue
"Admission lanes, fairness and backpressure", item 7).

The request's W3C trace id is recorded on the Receipt and the inbound Execution it admits; the worker that
applies the execution logs under it and the Flow run its record write starts records it; the step worker
logs under it, the intent and the remote effect that run authors record it, and the provider call sends it
on in its own ``traceparent``. Work admitted by another request keeps its own trace.
"""
from __future__ import annotations

import logging

import httpx
import pytest

from connectors.models import Execution, Receipt, RemoteEffect
from nexusflow.flows.models import FlowRun
from nexusflow.flows.services import execute
from nexusflow.kernel.logs import current_trace_id
from runtime_outbox import services as runtime_services
from runtime_outbox.models import OutboundCommand
from tests.conftest import ORG, drain, hubspot_event, post_signed

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
OTHER = "00f067aa0ba902b7a3ce929d0e0e4736"


def _traceparent(trace: str) -> dict:
    return {"traceparent": f"00-{trace}-00f067aa0ba902b7-01"}


def test_a_webhooks_trace_reaches_its_execution_run_intent_effect_and_provider_call(client, serving_org, caplog,
                                                                                    monkeypatch):
    first = [hubspot_event(1, 501, 1000), hubspot_event(2, 501, 2000, "email", "ada@x.io"),
             hubspot_event(3, 501, 3000, "lifecyclestage", "customer")]
    second = [hubspot_event(11, 502, 1000), hubspot_event(12, 502, 2000, "email", "bob@x.io"),
              hubspot_event(13, 502, 3000, "lifecyclestage", "customer")]
    answer = post_signed(client, first, extra_headers=_traceparent(TRACE))
    assert answer.status_code == 202 and answer["X-Trace-Id"] == TRACE
    assert post_signed(client, second, extra_headers=_traceparent(OTHER)).status_code == 202
    applied: list[str] = []
    steps: list[tuple[int, str]] = []
    real_submit = runtime_services.application_command_submit

    def submit(**kwargs):
        applied.append(current_trace_id())
        return real_submit(**kwargs)

    monkeypatch.setattr(runtime_services, "application_command_submit", submit)
    for kind, real in list(execute.EXECUTORS.items()):
        def traced(claim, plan, step_def, _real=real):
            steps.append((int(claim.run_id), current_trace_id()))
            return _real(claim, plan, step_def)

        monkeypatch.setitem(execute.EXECUTORS, kind, traced)
    sent: list[str] = []
    provider = httpx.Client(event_hooks={"request": [lambda request: sent.append(request.headers.get("traceparent"))]})
    caplog.set_level(logging.INFO)
    drain(client=provider)
    assert set(Receipt.objects.filter(org_id=ORG).values_list("trace_id", flat=True)) == {TRACE, OTHER}
    assert set(Execution.objects.filter(org_id=ORG).values_list("trace_id", flat=True)) == {TRACE, OTHER}
    runs = FlowRun.objects.filter(org_id=ORG)
    assert runs.count() >= 2 and set(runs.values_list("trace_id", flat=True)) == {TRACE, OTHER}
    for model in (OutboundCommand, RemoteEffect):
        traces = list(model.objects.filter(org_id=ORG).values_list("trace_id", flat=True))
        assert sorted(traces) == sorted([TRACE, OTHER]), model.__name__  # one push per contact, each its own trace
    # The provider calls continue the traces (a new span each), one per effect.
    assert sorted(header.split("-")[1] for header in sent if header) == sorted([TRACE, OTHER])
    # Every worker unit's lines for the first contact's work carry its trace, never the other's.
    units = {getattr(r, "unit", None) for r in caplog.records if getattr(r, "trace_id", None) == TRACE}
    effect = RemoteEffect.objects.get(org_id=ORG, trace_id=TRACE)
    assert not [r for r in caplog.records if getattr(r, "effect_id", None) == int(effect.pk)
                and getattr(r, "trace_id", None) != TRACE]
    run = runs.get(trace_id=TRACE)
    assert not [r for r in caplog.records if getattr(r, "run_id", None) == int(run.pk)
                and getattr(r, "trace_id", None) != TRACE]
    assert units, "no line logged under the webhook's trace"
    # Each worker unit ran its contact's work inside that contact's trace.
    assert sorted(set(applied)) == sorted([TRACE, OTHER])
    assert steps and {trace for run_id, trace in steps if run_id == int(run.pk)} == {TRACE}
