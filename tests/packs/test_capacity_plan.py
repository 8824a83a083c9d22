"""The hot-account capacity plan: loading (a bad plan refused with every reason), the schedule, the figures of a
class and the budget verdicts; no database, no run (the run is ``make bench``, tests/bench/test_hot_account.py)."""
import datetime as dt
import json
from pathlib import Path

import pytest
from django.conf import settings

from packs.bench.hot_account import class_figures, gate_lock_figures, schedule
from packs.bench.plan import (
    OPERATION_CLASSES,
    PlanError,
    budget_verdicts,
    load_plan,
    offered_per_second,
    offered_units,
    parse_plan,
)
from tests.conftest import run_manage, subprocess_env

ROOT = Path(settings.BASE_DIR)
SHIPPED = ROOT / "packs" / "bench" / "plans" / "hot_account.json"


def _plan() -> dict:
    return json.loads(SHIPPED.read_text(encoding="utf-8"))


def _refusal(document) -> list[str]:
    with pytest.raises(PlanError) as caught:
        parse_plan(document, path="plan.json", base=ROOT)
    return caught.value.problems


def test_the_shipped_plan_offers_every_operation_class_with_a_budget_for_each():
    plan = load_plan(SHIPPED, base=ROOT)
    assert set(plan["workload"]["classes"]) == set(OPERATION_CLASSES) == set(plan["budgets"]["classes"])
    for name in OPERATION_CLASSES:
        assert offered_per_second(plan, name) > 0 and offered_units(plan, name) > 0
        assert "starvation_ms_at_most" in plan["budgets"]["classes"][name]
    # Derived classes follow their drivers: every admitted or customer event is materialized and claimed.
    assert offered_units(plan, "execution_claim") == (offered_units(plan, "admission")
                                                      + offered_units(plan, "outbound_authoring"))
    forecast = plan["forecast"]
    for name, peak in forecast["peak_per_second"].items():
        assert offered_per_second(plan, name) >= peak * forecast["headroom"]


def _set(document: dict, path: str, value) -> dict:
    *parents, last = path.split("/")
    target = document
    for part in parents:
        target = target[part]
    if value is _DELETE:
        del target[last]
    else:
        target[last] = value
    return document


_DELETE = object()


@pytest.mark.parametrize("path,value,expected", [
    ("format", "capacity.v0", "format: 'nexusflow.capacity-plan.v1' was expected"),
    ("workload/classes/halt", _DELETE, "workload/classes: 'halt' is a required property"),
    ("workload/classes/bogus", {"count": 1}, "Additional properties are not allowed ('bogus' was unexpected)"),
    ("workload/classes/admission", {"rate_per_second": -1},
     "workload/classes/admission/rate_per_second: -1 is less than or equal to the minimum of 0"),
    ("workload/classes/admission", {"rate_per_second": 6, "count": 3},
     "workload/classes/admission: give exactly one of rate_per_second or count (found ['rate_per_second', 'count'])"),
    ("workload/classes/admission", {}, "workload/classes/admission: give exactly one of rate_per_second or count "
                                       "(found neither)"),
    ("workload/classes/permit_acquisition", {"follows": ["admission"]},
     "workload/classes/permit_acquisition/follows: ['admission'] cannot drive permit_acquisition"),
    ("workload/workers_per_role", 9, "workload/workers_per_role: 9 is greater than the maximum of 4"),
    ("budgets/classes/halt/starvation_ms_at_most", _DELETE,
     "budgets/classes/halt: 'starvation_ms_at_most' is a required property"),
    ("budgets/classes/admission/p95_ms_at_most", 900, "budgets/classes/admission: p95_ms_at_most 900 exceeds "
                                                      "p99_ms_at_most 500"),
    ("budgets/classes/settlement/completed_at_least", 3, "budgets/classes/settlement: give exactly one of "
                                                         "throughput_per_second_at_least or completed_at_least"),
    ("budgets/gate_lock_wait/p99_ms_at_most", 10, "budgets/gate_lock_wait: p95_ms_at_most 50 exceeds p99_ms_at_most 10"),
    ("budgets/retries_at_most", 1.5, "budgets/retries_at_most: 1.5 is not of type 'integer'"),
    ("workload/classes/admission", {"rate_per_second": 5}, "workload/classes/admission: offers 5/s, below the "
                                                           "forecast peak 4/s x headroom 1.5 = 6/s"),
    ("workload/warm_contacts", 3, "workload/warm_contacts: 3 contacts cannot carry 45 outbound_authoring units"),
    ("service", "packs/demo/missing.json", "service: packs/demo/missing.json is not a file"),
    ("accounts/outbound", "crm-webhooks", "accounts: inbound and outbound name the same account"),
])
def test_a_bad_plan_is_refused_with_a_message_naming_where(path, value, expected):
    problems = _refusal(_set(_plan(), path, value))
    assert any(expected in problem for problem in problems), problems


def test_every_problem_of_a_bad_plan_is_listed_at_once():
    document = _set(_set(_plan(), "format", "x"), "workload/senders", 0)
    problems = _refusal(document)
    assert len(problems) == 2
    assert problems[0].startswith("format:") and problems[1].startswith("workload/senders:")


def test_a_file_that_is_not_json_or_not_there_is_refused(tmp_path):
    broken = tmp_path / "plan.json"
    broken.write_text('{"format": ', encoding="utf-8")
    with pytest.raises(PlanError, match=r"not JSON: Expecting value at line 1 column 12"):
        load_plan(broken, base=ROOT)
    with pytest.raises(PlanError, match=r"cannot read it: .*No such file"):
        load_plan(tmp_path / "absent.json", base=ROOT)


def test_the_command_exits_2_with_the_plans_problems_and_no_traceback(tmp_path):
    bad = tmp_path / "plan.json"
    bad.write_text(json.dumps(_set(_plan(), "workload/classes/halt", _DELETE)), encoding="utf-8")
    result = run_manage(["capacity_plan", "--plan", str(bad)], subprocess_env(), timeout=60)
    assert result.returncode == 2
    assert f"capacity plan {bad} is not usable" in result.stderr
    assert "workload/classes: 'halt' is a required property" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_schedule_spreads_counts_over_the_window_and_keeps_rates_on_their_period():
    plan = parse_plan(_plan(), base=ROOT)
    arrivals = schedule(plan)
    by_class = {name: [at for at, n, _ in arrivals if n == name] for name in plan["workload"]["classes"]}
    assert len(by_class["admission"]) == 180 and by_class["admission"][:3] == pytest.approx([0, 1 / 6, 2 / 6])
    assert by_class["halt"] == pytest.approx([7.5, 22.5])  # the after-drain halt is not in the window
    assert by_class["credential_revocation"] == pytest.approx([7.5, 22.5])
    assert [at for at, _, _ in arrivals] == sorted(at for at, _, _ in arrivals)
    assert not by_class["materialization"]  # derived classes are done by the workers, never offered directly


def test_a_class_figures_come_from_its_served_and_still_pending_units():
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    at = [t0 + dt.timedelta(seconds=s) for s in range(5)]
    units = [(at[0], at[1], 100.0, None), (at[1], at[2], 300.0, None), (at[2], at[4], 200.0, None),
             (at[3], None, None, 900.0)]
    figures = class_figures(units, offered=4, offered_per_second=1.0)
    assert figures["completed"] == 3 and figures["pending"] == 1
    assert figures["per_second"] == pytest.approx(3 / 4.0)  # served units over first offered -> last served
    assert (figures["p50_ms"], figures["p95_ms"], figures["p99_ms"]) == (200.0, 300.0, 300.0)
    assert figures["starvation_ms"] == 900.0  # the oldest unit still pending waited longest


def test_a_class_with_no_served_unit_has_no_rate_and_says_why():
    figures = class_figures([(1.0, None, None, 50.0)], offered=1, offered_per_second=0.5)
    assert figures["per_second"] is None and figures["p99_ms"] is None and figures["starvation_ms"] == 50.0
    assert figures["reason"] == "no unit of this class was served in the window"


def test_gate_lock_figures_give_sampled_percentiles_beside_the_servers_totals():
    figures = gate_lock_figures([10.0] * 90 + [40.0] * 9 + [200.0], samples=500, interval=0.01,
                                by_table={"connectors_accountservinggate": {"waits": 100, "ms": 2000.0}},
                                status_delta={"Innodb_row_lock_waits": 120, "Innodb_row_lock_time": 2400})
    assert (figures["p95_ms"], figures["p99_ms"], figures["max_ms"]) == (40.0, 40.0, 200.0)
    assert figures["server_row_lock_avg_ms"] == 20.0 and figures["waits_observed"] == 100
    assert gate_lock_figures([], samples=1, interval=0.01, by_table={}, status_delta={})["p99_ms"] == 0.0


def _figures(**overrides):
    classes = {name: {"completed": 10, "per_second": 100.0, "p95_ms": 1.0, "p99_ms": 2.0, "starvation_ms": 3.0}
               for name in OPERATION_CLASSES}
    return {"classes": classes, "gate_lock_wait": {"p95_ms": 1.0, "p99_ms": 2.0}, "deadlocks": 0,
            "retries": {"total": 0}, **overrides}


def test_budgets_are_met_when_every_figure_is_on_its_side():
    plan = parse_plan(_plan(), base=ROOT)
    verdicts = budget_verdicts(plan, _figures())
    assert verdicts and all(v["verdict"] == "met" and v["gap"] == 0.0 for v in verdicts.values())
    assert len(verdicts) == sum(len(b) for b in plan["budgets"]["classes"].values()) + 4


def test_a_missed_budget_carries_its_gap_on_the_wrong_side():
    plan = parse_plan(_plan(), base=ROOT)
    figures = _figures(deadlocks=3, retries={"total": 12}, gate_lock_wait={"p95_ms": 80.0, "p99_ms": 100.0})
    figures["classes"]["admission"].update(per_second=4.0, p99_ms=650.0)
    figures["classes"]["halt"].update(completed=1)
    verdicts = budget_verdicts(plan, figures)
    assert verdicts["admission.throughput_per_second_at_least"] == {
        "at_least": 5.4, "value": 4.0, "verdict": "missed", "met": False, "gap": pytest.approx(1.4)}
    assert verdicts["admission.p99_ms_at_most"]["gap"] == 150.0
    assert verdicts["halt.completed_at_least"]["gap"] == 2
    assert verdicts["gate_lock_wait.p95_ms_at_most"]["gap"] == 30.0
    assert verdicts["gate_lock_wait.p99_ms_at_most"]["verdict"] == "met"
    assert (verdicts["deadlocks_at_most"]["gap"], verdicts["retries_at_most"]["gap"]) == (3, 2)


def test_a_figure_not_measured_is_never_met():
    plan = parse_plan(_plan(), base=ROOT)
    figures = _figures()
    figures["classes"]["settlement"] = {"completed": 0, "per_second": None, "p95_ms": None, "p99_ms": None,
                                        "starvation_ms": None, "reason": "no unit of this class was served"}
    verdicts = budget_verdicts(plan, figures)
    assert verdicts["settlement.p99_ms_at_most"] == {"at_most": 2000, "value": None, "verdict": "not measured",
                                                     "met": None, "gap": None,
                                                     "reason": "no unit of this class was served"}
    assert budget_verdicts(plan, {})["deadlocks_at_most"]["verdict"] == "not measured"


def test_the_gate_budget_judges_the_larger_of_the_probes_and_the_proven_sampled_waits():
    probe = [1.0] * 95 + [30.0] * 5
    figures = gate_lock_figures([0.0, 0.0, 300.0], samples=100, interval=0.15, by_table={}, status_delta={},
                                probe_ms=probe)
    assert figures["probe"]["p95_ms"] == 1.0 and figures["probe"]["p99_ms"] == 30.0
    assert figures["sampled"]["p99_ms"] == 300.0  # a wait seen in three samples lasted at least 300 ms
    assert (figures["p95_ms"], figures["p99_ms"]) == (300.0, 300.0)
    quiet = gate_lock_figures([0.0], samples=100, interval=0.15, by_table={}, status_delta={}, probe_ms=probe)
    assert (quiet["p95_ms"], quiet["p99_ms"]) == (1.0, 30.0)  # a wait seen once proves nothing of its length
