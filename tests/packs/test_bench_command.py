"""``manage.py bench``: the pure parts (a bad size refused before any database, ratios, targets, percentiles,
points, the provider events and the history copy statement); the run itself is ``make bench``."""
import pytest

from packs.bench.history import FACTOR, copy_statement
from packs.bench.inbound import Inbound
from packs.bench.measure import latency_ms, point
from packs.bench.run import TARGETS, percentiles, ratios, target_verdicts
from packs.demo.run import Processes
from packs.hubspot import item_conforms, webhook_route
from tests.conftest import run_manage, subprocess_env


@pytest.mark.parametrize("scale", ["0", "-1", "21"])
def test_a_scale_out_of_range_exits_2_with_its_reason(scale):
    result = run_manage(["bench", "--scale", scale], subprocess_env(), timeout=60)
    assert result.returncode == 2 and "--scale must be within (0, 20]" in result.stderr
    assert "Traceback" not in result.stderr


def _series(*rates):
    return [{"workers": n, "per_second": r} for n, r in zip((1, 2, 4), rates, strict=False)]


def _report():
    def sizes(claim_1x, claim_10x, admission_1x, admission_10x):
        return {"1x": {"claim": {"p99_ms": claim_1x}, "admission": {"p99_ms": admission_1x}},
                f"{FACTOR}x": {"claim": {"p99_ms": claim_10x}, "admission": {"p99_ms": admission_10x}}}

    return {"series": {"floor": _series(1000, 2000, 3000), "q2": _series(100, 200, 300),
                       "flow_runs": _series(150, 300, 500), "events_applied": _series(40, 70, 90),
                       "effects_confirmed": _series(5, 10, 8)},
            "history": sizes(20.0, 23.0, 100.0, 150.0)}


def test_the_ratios_are_computed_from_the_series_and_the_history_of_the_run():
    expected = {
        "flow_runs_vs_q2": 1.5, "events_applied_vs_q2": 0.35, "effects_confirmed_vs_q2": 0.05,
        "scaling_2v1_flow_runs": 2.0, "scaling_2v1_events_applied": 1.75, "scaling_2v1_effects_confirmed": 2.0,
        "scaling_2v1_q2": 2.0, "flow_runs_vs_floor": 0.15, "claim_p99_10x_vs_1x": 1.15,
        "admission_p99_10x_vs_1x": 1.5}
    computed = ratios(_report())
    assert {name: computed[name] for name in expected} == pytest.approx(expected)


def test_a_zero_denominator_gives_infinity_not_an_error():
    report = _report()
    report["series"]["q2"] = _series(0, 0, 0)
    assert ratios(report)["flow_runs_vs_q2"] == float("inf")


def test_every_target_is_a_ratio_of_the_report():
    assert set(TARGETS) <= set(ratios(_report()))


def test_an_at_least_target_is_met_at_its_bound_and_missed_below_it_by_the_gap():
    values = {**ratios(_report()), "events_applied_vs_q2": 1.5, "scaling_2v1_flow_runs": 1.2}
    verdicts = target_verdicts(values)
    assert verdicts["events_applied_vs_q2"] == {"at_least": 1.5, "verdict": "met", "met": True, "gap": 0.0}
    assert verdicts["scaling_2v1_flow_runs"] == {"at_least": 1.6, "verdict": "missed", "met": False,
                                                 "gap": pytest.approx(0.4)}


def test_an_at_most_target_is_met_at_and_below_its_bound_and_missed_above_it_by_the_gap():
    name = "effects_confirmed_commits_per_unit"
    for value, met, gap in ((4.0, True, 0.0), (6.0, True, 0.0), (7.5, False, 1.5)):
        verdict = target_verdicts({**ratios(_report()), name: value})[name]
        assert verdict == {"at_most": 6.0, "verdict": "met" if met else "missed", "met": met,
                           "gap": pytest.approx(gap)}


def test_a_nan_ratio_meets_no_target():
    assert target_verdicts({**ratios(_report()), "scaling_2v1_flow_runs": float("nan")}
                           )["scaling_2v1_flow_runs"]["met"] is False


def test_latency_percentiles_are_nearest_rank():
    values = [float(v) for v in range(1, 101)]  # 1..100 ms
    assert percentiles(values) == {"p50": 50.0, "p95": 95.0, "p99": 99.0}
    assert percentiles([7.0]) == {"p50": 7.0, "p95": 7.0, "p99": 7.0}
    assert percentiles([]) == {"p50": 0.0, "p95": 0.0, "p99": 0.0}
    assert latency_ms([3.0, 1.0, 2.0]) == {"p50_ms": 2.0, "p95_ms": 3.0, "p99_ms": 3.0}


def test_a_point_divides_the_servers_counter_deltas_by_its_units():
    before, after = {"Com_commit": 100, "Questions": 1000}, {"Com_commit": 160, "Questions": 2200}
    assert point(2, 20, 4.0, before, after, events=25) == {
        "workers": 2, "units": 20, "seconds": 4.0, "per_second": 5.0, "commits_per_unit": 3.0,
        "statements_per_unit": 60.0, "events": 25}
    assert point(4, 0, 0.0, before, after)["per_second"] == 0.0
    assert point(4, 0, 0.0, before, after)["commits_per_unit"] == 0.0


def test_the_bench_posts_events_the_route_admits_each_a_new_event_of_a_new_contact():
    inbound = Inbound(service={"org_id": "o"}, url="http://127.0.0.1:1/", secret=b"s", procs=Processes())
    first, second = inbound.new_contacts(2), inbound.new_contacts(1)
    events = [inbound.event(o, "email", f"{o}@example.com") for o in first + second]
    assert len({*first, *second}) == 3
    assert all(item_conforms(webhook_route(), e) for e in events)
    assert len({e["eventId"] for e in events}) == 3
    assert [e["occurredAt"] for e in events] == sorted(e["occurredAt"] for e in events)


def test_the_history_copy_moves_ids_and_references_and_rewrites_unique_keys():
    from nexusflow.flows.models import FlowCheckpoint

    sql = copy_statement(FlowCheckpoint, where="t.run_id IN (SELECT id FROM r WHERE id <= {run_snapshot})",
                         rekey={"context_digest": "SHA2(t.context_digest, 256)"},
                         snapshot={"flows.FlowCheckpoint": 40, "flows.FlowRun": 7},
                         offsets={"flows.FlowCheckpoint": 50, "flows.FlowRun": 9, "flows.FlowStepExecution": 30},
                         copies=2)
    assert sql.startswith("INSERT INTO `flows_flowcheckpoint` (`id`, `org_id`, `run_id`, `step_id`")
    assert "SELECT t.`id` + ks.k * 50, t.`org_id`, t.`run_id` + ks.k * 9, t.`step_id` + ks.k * 30" in sql
    # a reference to a table that is not copied (the attempt) keeps its value; a rekeyed column is rewritten
    assert "t.`created_by_attempt_id`," in sql and "SHA2(t.context_digest, 256)" in sql
    assert "CROSS JOIN (SELECT 1 AS k UNION ALL SELECT 2 AS k) ks" in sql
    assert sql.endswith("WHERE t.id <= 40 AND (t.run_id IN (SELECT id FROM r WHERE id <= 7))")


def test_waiting_returns_true_when_done_and_false_when_progress_stalls():
    from packs.bench.measure import wait_for

    assert wait_for("nothing", lambda: True, Processes()) is True
    assert wait_for("never", lambda: False, Processes(), progress=lambda: 7, stall_seconds=0.0) is False


@pytest.mark.django_db
def test_worker_profiles_are_summarised_per_role_with_database_waits_and_sleep_apart(tmp_path):
    import cProfile
    import time

    from django.db import connection

    from nexusflow.kernel.clock import db_now
    from packs.bench.profiles import summarise

    connection.ensure_connection()
    for role in ("flow", "flow", "egress"):
        profiler = cProfile.Profile()
        profiler.enable()
        db_now()
        with connection.cursor() as cursor:  # a round trip long enough to outlast the 3-decimal rounding
            cursor.execute("SELECT SLEEP(0.005)")
        time.sleep(0.01)
        profiler.disable()
        profiler.dump_stats(tmp_path / f"{role}-{len(list(tmp_path.iterdir()))}.prof")
    summary = summarise(tmp_path)
    assert {role: figures["processes"] for role, figures in summary.items()} == {"flow": 2, "egress": 1}
    flow = summary["flow"]
    assert flow["seconds"]["idle_sleep"] >= 0.02 and flow["seconds"]["database"] >= 0.01
    assert any(row["function"].startswith("clock.py") for row in flow["top_cumulative"])
    assert summarise(tmp_path / "none") == {}
