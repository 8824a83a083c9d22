"""``GET /metrics`` after ``manage.py demo``: each required family equals what the database holds (issue 22).

The demo runs as a real child process on this test's databases; the scrape
then reads the same rows, and every family is compared with an independent
count of the authoritative tables (seed 004 section 19: metrics come from
state, never from logs or in-process counters).
"""
from __future__ import annotations

import json
from collections import Counter
from contextlib import contextmanager

import pytest
from django.db import connections

from connectors.models import (
    AccountServingGate,
    CredentialGenerationDispatchGate,
    DispatchPermit,
    RemoteEffect,
    RemoteEffectAttempt,
)
from nexusflow.flows.models import FlowCheckpoint, FlowRun, FlowStepAttempt, FlowWakeSignal
from nexusflow.kernel.metrics import reason_machines
from packs.demo.run import demo_database_names
from tests.conftest import hubspot_event, run_manage, subprocess_env
from tests.kernel.test_metrics import scrape_metrics

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])


def _family(samples: dict, name: str, *label_names: str) -> dict:
    """``{label values: value}`` of one sample name (every sample of it)."""
    out = {}
    for (sample, labels), value in samples.items():
        if sample == name:
            by_name = dict(labels)
            out[tuple(by_name[n] for n in label_names)] = value
    return out


def _nonzero(family: dict) -> dict:
    return {key: value for key, value in family.items() if value}


def test_metrics_after_the_demo_match_the_database(tmp_path):
    batch = [hubspot_event(1, 7101, 1000), hubspot_event(2, 7101, 2000, "email", "ada@example.com"),
             hubspot_event(3, 7101, 3000, "firstname", "Ada"), hubspot_event(4, 7101, 4000, "lifecyclestage", "customer"),
             hubspot_event(5, 7102, 1000, "email", "bo@example.com")]
    events = tmp_path / "events.jsonl"
    events.write_text(json.dumps({"body": batch}) + "\n" + json.dumps({"body": batch[:1], "sign": "invalid"}) + "\n")
    result = run_manage(["demo", "--events", str(events), "--json"], subprocess_env(), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["remote_creates"] == 1 and summary["nonterminal"] == 0

    with demo_databases():
        check_metrics_against_database()


@contextmanager
def demo_databases():
    """Point this process's connections at the databases the demo ran in (``packs/demo/run.py``), then back."""
    names = {alias: connections[alias].settings_dict["NAME"] for alias in ("default", "control")}
    demo = dict(zip(("default", "control"), demo_database_names(names["default"]), strict=True))
    for alias in names:
        connections[alias].close()
        connections[alias].settings_dict["NAME"] = demo[alias]
    try:
        yield
    finally:
        for alias, name in names.items():
            connections[alias].close()
            connections[alias].settings_dict["NAME"] = name


def check_metrics_against_database():
    samples = scrape_metrics()

    runs = Counter(FlowRun.objects.values_list("state", flat=True))
    assert _nonzero(_family(samples, "nexusflow_flow_runs", "state")) == {(s,): n for s, n in runs.items()}

    effects = Counter(RemoteEffect.objects.values_list("state", "reason_code"))
    assert sum(effects.values()) >= 1
    assert _family(samples, "nexusflow_effects", "state", "reason_code") == dict(effects)

    assert sum(runs.values()) >= 1
    attempts = FlowStepAttempt.objects.count()
    assert attempts >= 1
    finished = Counter(FlowStepAttempt.objects.filter(finished_at__isnull=False)
                       .values_list("step__step_kind", "step__plan_step_key"))
    assert _family(samples, "nexusflow_flow_step_attempt_duration_seconds_count", "step_kind", "plan_step") == \
        dict(finished)
    wakes = FlowWakeSignal.objects.filter(state="consumed").count()
    assert samples[("nexusflow_flow_wake_latency_seconds_count", ())] == wakes
    assert samples[("nexusflow_flow_step_claims_total", ())] == attempts
    by_outcome = Counter(FlowStepAttempt.objects.values_list("state", "failure_class"))
    assert _family(samples, "nexusflow_flow_step_attempts_total", "state", "failure_class") == dict(by_outcome)
    retries = {("flow",): FlowStepAttempt.objects.filter(attempt_number__gt=1).count(),
               ("egress",): RemoteEffectAttempt.objects.filter(attempt_number__gt=1).count()}
    assert _family(samples, "nexusflow_retries_total", "role") == retries

    assert samples[("nexusflow_flow_checkpoint_bytes_count", ())] == FlowCheckpoint.objects.count() >= 1
    submitted = RemoteEffectAttempt.objects.filter(attempt_number=1).count()
    assert submitted >= 1
    assert samples[("nexusflow_effect_submit_latency_seconds_count", ())] == submitted
    finalized = RemoteEffect.objects.filter(state="finalized").count()
    assert samples[("nexusflow_effect_completion_latency_seconds_count", (("state", "finalized"),))] == finalized

    open_permits = Counter(DispatchPermit.objects.filter(state__in=("granted", "sending")).values_list("state", flat=True))
    assert _family(samples, "nexusflow_dispatch_permits_open", "state") == {(s,): n for s, n in open_permits.items()}

    gates = Counter(("account_serving", s) for s in AccountServingGate.objects.values_list("state", flat=True))
    gates.update(("credential_dispatch", s) for s in CredentialGenerationDispatchGate.objects.values_list("state", flat=True))
    assert sum(gates.values()) >= 1
    assert _family(samples, "nexusflow_gates", "gate", "state") == dict(gates)

    # Nothing is left due after the demo drained its work: every queue reads empty.
    assert not _nonzero(_family(samples, "nexusflow_queue_depth", "role", "lane"))

    reason_rows = {}
    for name, model, states, _since in reason_machines():
        carried = model.objects.filter(state__in=states).exclude(reason_code="").values_list("state", "reason_code")
        reason_rows.update({(name, state, code): n for (state, code), n in Counter(carried).items()})
    assert _family(samples, "nexusflow_reason_rows", "machine", "state", "reason_code") == reason_rows
