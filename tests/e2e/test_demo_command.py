"""``manage.py demo`` keeps its contract: JSON summary keys, dump shape, exit codes."""
import json

import pytest
from django.db import connection

from tests.conftest import run_manage, subprocess_env

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

def _write(path, deliveries):
    path.write_text("\n".join(json.dumps(d) for d in deliveries) + "\n")


# A whole run of the demo (its summary, its dump, its metrics, no secret left): tests/e2e/test_after_the_demo.py.


def test_demo_refuses_an_unreadable_events_file(tmp_path):
    events = tmp_path / "events.jsonl"
    events.write_text("{not json\n")
    result = run_manage(["demo", "--events", str(events), "--json"], subprocess_env(), timeout=60)
    assert result.returncode == 2
    assert "line 1" in result.stderr and "Traceback" not in result.stderr


def _halted_rows(org_id: str) -> dict:
    """One row per kind the demo reports: benign superseded effect (with an Attempt), parked effect, runs."""
    from connectors.models import Execution, RemoteEffect, RemoteEffectAttempt
    from connectors.reasons import OPERATOR_QUARANTINE, SUPERSEDED_BY_NEWER_POSITION, SUPERSEDED_BY_NEWER_VERSION
    from nexusflow.flows.reasons import STEP_EXPECTED_REFUSAL, STEP_RETRY_EXHAUSTED, TRIGGER_RECORD_DELETED
    from nexusflow.kernel.scope import OrgScope
    from tests.flows.rows import Rows
    from tests.kernel import rows

    superseded = rows.make(RemoteEffect, org_id=org_id, state="quarantined", version=1,
                           reason_code=SUPERSEDED_BY_NEWER_VERSION)
    rows.make(RemoteEffectAttempt, org_id=org_id, effect=superseded, attempt_number=1)
    flow_rows = Rows(OrgScope(org_id))
    runs = {}
    for code in (STEP_EXPECTED_REFUSAL, TRIGGER_RECORD_DELETED, STEP_RETRY_EXHAUSTED):
        run = flow_rows.run("TerminalFailed")
        with connection.cursor() as cursor:
            cursor.execute("UPDATE flows_flowrun SET reason_code = %s WHERE id = %s", [code, run.pk])
        runs[code] = run.pk
    return {
        "superseded": superseded.pk,
        "parked": rows.make(RemoteEffect, org_id=org_id, state="quarantined", version=1,
                            reason_code=OPERATOR_QUARANTINE).pk,
        "finalized": rows.make(RemoteEffect, org_id=org_id, state="finalized", version=1).pk,
        "older_position": rows.make(Execution, org_id=org_id, state="superseded", version=1,
                                    reason_code=SUPERSEDED_BY_NEWER_POSITION).pk,
        "runs": runs,
    }


def test_the_demo_counts_only_attention_reason_codes_as_trouble():
    """A superseded older version is quarantined (raw count) yet benign; only the parked effect is trouble."""
    from connectors.models import RemoteEffect
    from packs.demo.run import attention_effects, attention_flow_runs, reason_class_counts

    made = _halted_rows("demo-org")
    assert RemoteEffect.objects.filter(state="quarantined").count() == 2
    assert attention_effects() == [(made["parked"], "quarantined", "operator_quarantine")]
    # Of the three ended runs only the retry-exhausted one needs an operator.
    assert attention_flow_runs() == [(made["runs"]["flow_step_retry_exhausted"], "TerminalFailed",
                                      "flow_step_retry_exhausted")]
    assert reason_class_counts() == {"attention": 2, "benign": 4, "attention_codes": {
        "flow_step_retry_exhausted": 1, "operator_quarantine": 1}}


def test_the_chaos_invariants_count_only_attention_reason_codes():
    """Benign outcomes (superseded version, declared refusal, deleted trigger) never fail the chaos demo."""
    from packs.demo.chaos import chaos_failures, coverage_failures

    made = _halted_rows("demo-org")
    problems = [p for p in chaos_failures({"uncertain_effects": 0}, []) if p not in coverage_failures([])]
    assert problems == [f'1 flow runs failed by the crashes: [[{made["runs"]["flow_step_retry_exhausted"]}, '
                        f'"TerminalFailed", "flow_step_retry_exhausted"]]']
