"""``make bench`` with the DBOS Transact peer: the ratios and verdicts with and without its figures, a peer
that cannot run (no virtualenv, no PostgreSQL) reported as such, and its points; the run itself is ``make bench``."""
import json
import math
from pathlib import Path

import pytest

from packs.bench.dbos_peer import DBOS_VENV, billing_sandbox_url, dbos_point, dbos_start, peer_unavailable
from packs.bench.history import FACTOR
from packs.bench.measure import BenchError
from packs.bench.run import SCALED_SERIES, TARGETS, ratio_reasons, ratios, target_verdicts

DBOS_RATIOS = ("effects_confirmed_vs_dbos_push", "flow_runs_vs_dbos_noop", "scaling_2v1_dbos_noop",
               "scaling_2v1_dbos_push", "scaling_4v2_dbos_noop", "scaling_4v2_dbos_push", "dbos_push_commits_per_unit")


def _series(*rates, **per_unit):
    return [{"workers": n, "per_second": r, **per_unit} for n, r in zip((1, 2, 4), rates, strict=False)]


def _report(*, dbos: bool = True, confirmed_latency: bool = True):
    report = {
        "series": {"floor": _series(1000, 2000, 3000), "q2": _series(100, 200, 300),
                   "flow_runs": _series(150, 300, 330), "events_applied": _series(40, 70, 63),
                   "effects_confirmed": _series(5, 10, 8, commits_per_unit=17.5, statements_per_unit=290.0)},
        "latency": {"flow_start_to_succeeded": {"p99_ms": 760.0}, "event_to_applied": {"p99_ms": 400.0}},
        "history": {"1x": {"claim": {"p99_ms": 6.0}, "admission": {"p99_ms": 20.0}},
                    f"{FACTOR}x": {"claim": {"p99_ms": 6.0}, "admission": {"p99_ms": 21.0}}},
        "peers": {"dbos": {"available": True, "dbos_version": "3.4.0"}},
    }
    if dbos:
        report["series"]["dbos_noop"] = _series(120, 150, 180, commits_per_unit=6.5)
        report["series"]["dbos_push"] = _series(40, 50, 40, commits_per_unit=24.0)
    else:
        report["peers"]["dbos"] = peer_unavailable("PostgreSQL at postgresql://postgres@127.0.0.1:5432 could not "
                                                   "be reached: connection refused")
    if confirmed_latency:
        report["latency"]["admission_to_confirmed_effect"] = {"p99_ms": 1200.0}
    return report


def test_the_dbos_ratios_set_nexusflow_beside_the_peer_at_two_workers_and_scaling_four_against_two():
    values = ratios(_report())
    assert values["effects_confirmed_vs_dbos_push"] == pytest.approx(10 / 50)
    assert values["flow_runs_vs_dbos_noop"] == pytest.approx(2.0)
    assert values["scaling_2v1_dbos_noop"] == pytest.approx(1.25)
    assert {s: values[f"scaling_4v2_{s}"] for s in SCALED_SERIES} == pytest.approx({
        "floor": 1.5, "q2": 1.5, "flow_runs": 1.1, "events_applied": 0.9, "effects_confirmed": 0.8,
        "dbos_noop": 1.2, "dbos_push": 0.8})
    assert values["effects_confirmed_commits_per_unit"] == 17.5
    assert values["effects_confirmed_statements_per_unit"] == 290.0
    assert values["dbos_push_commits_per_unit"] == 24.0
    assert values["flow_start_to_succeeded_p99_ms"] == 760.0
    assert values["admission_to_confirmed_effect_p99_ms"] == 1200.0
    assert ratio_reasons(_report()) == {}


def test_with_every_figure_each_target_is_met_or_missed_with_its_gap():
    verdicts = target_verdicts(ratios(_report()))
    assert set(verdicts) == set(TARGETS)
    assert {v["verdict"] for v in verdicts.values()} == {"met", "missed"}
    assert verdicts["flow_runs_vs_dbos_noop"] == {"at_least": 1.5, "verdict": "met", "met": True, "gap": 0.0}
    assert verdicts["effects_confirmed_vs_dbos_push"]["gap"] == pytest.approx(0.8)
    assert verdicts["scaling_4v2_events_applied"]["met"] is True  # 0.9 is the bound itself
    assert verdicts["effects_confirmed_statements_per_unit"] == {
        "at_most": 60.0, "verdict": "missed", "met": False, "gap": pytest.approx(230.0)}
    assert verdicts["admission_to_confirmed_effect_p99_ms"]["gap"] == pytest.approx(200.0)


def test_the_issue_targets_bound_dbos_ratios_scaling_per_unit_costs_and_latency():
    assert TARGETS["effects_confirmed_vs_dbos_push"] == (">=", 1.0)
    assert TARGETS["flow_runs_vs_dbos_noop"] == (">=", 1.5)
    assert TARGETS["events_applied_vs_q2"] == (">=", 1.5)
    assert {TARGETS[f"scaling_4v2_{s}"] for s in SCALED_SERIES} == {(">=", 0.9)}
    assert {TARGETS[f"scaling_2v1_{s}"] for s in ("flow_runs", "events_applied", "effects_confirmed")} == {(">=", 1.6)}
    assert TARGETS["effects_confirmed_commits_per_unit"] == ("<=", 6.0)
    assert TARGETS["effects_confirmed_statements_per_unit"] == ("<=", 60.0)
    assert [TARGETS[f"{n}_p99_ms"] for n in ("flow_start_to_succeeded", "event_to_applied",
                                             "admission_to_confirmed_effect")] == [("<=", 250.0), ("<=", 500.0),
                                                                                   ("<=", 1000.0)]
    assert "flow_runs_vs_q2" not in TARGETS and "claim_p99_10x_vs_1x" not in TARGETS


def test_without_the_dbos_peer_its_ratios_are_null_with_the_peers_reason_and_not_measured():
    report = _report(dbos=False)
    values, reasons = ratios(report), ratio_reasons(report)
    assert {name: values[name] for name in DBOS_RATIOS} == dict.fromkeys(DBOS_RATIOS)
    assert set(reasons) == set(DBOS_RATIOS)
    assert all(reason.startswith("the DBOS peer did not run: PostgreSQL at") for reason in reasons.values())
    verdicts = target_verdicts(values, reasons)
    assert verdicts["effects_confirmed_vs_dbos_push"] == {
        "at_least": 1.0, "verdict": "not measured", "met": None, "gap": None,
        "reason": reasons["effects_confirmed_vs_dbos_push"]}
    assert verdicts["scaling_4v2_dbos_noop"]["verdict"] == "not measured"
    # the rest is judged as before, and the report still writes as JSON
    assert verdicts["flow_start_to_succeeded_p99_ms"]["verdict"] == "missed"
    assert values["flow_runs_vs_q2"] == pytest.approx(1.5)
    assert json.loads(json.dumps({"ratios": values, "targets": verdicts}))["ratios"]["flow_runs_vs_dbos_noop"] is None


def test_a_dbos_series_that_failed_is_named_as_the_reason_and_the_other_is_still_judged():
    report = _report()
    del report["series"]["dbos_push"]
    report["peers"]["dbos"]["failed"] = {"dbos_push": "worker 0 exited with 1"}
    reasons = ratio_reasons(report)
    assert reasons["effects_confirmed_vs_dbos_push"] == "dbos_push failed: worker 0 exited with 1"
    assert "flow_runs_vs_dbos_noop" not in reasons
    assert target_verdicts(ratios(report), reasons)["flow_runs_vs_dbos_noop"]["verdict"] == "met"


def test_a_latency_not_in_the_report_is_not_measured_rather_than_an_error():
    report = _report(confirmed_latency=False)
    values, reasons = ratios(report), ratio_reasons(report)
    assert values["admission_to_confirmed_effect_p99_ms"] is None
    assert reasons == {"admission_to_confirmed_effect_p99_ms":
                       "latency admission_to_confirmed_effect was not measured in this run"}
    verdict = target_verdicts(values, reasons)["admission_to_confirmed_effect_p99_ms"]
    assert verdict["verdict"] == "not measured" and verdict["at_most"] == 1000.0


def test_a_figure_absent_from_the_values_is_not_measured_without_a_key_error():
    verdicts = target_verdicts({})
    assert {v["verdict"] for v in verdicts.values()} == {"not measured"}
    assert verdicts["event_to_applied_p99_ms"]["reason"] == "event_to_applied_p99_ms is not among this run's figures"


def test_a_zero_dbos_rate_gives_infinity_not_an_error():
    report = _report()
    report["series"]["dbos_noop"] = _series(0, 0, 0)
    assert ratios(report)["flow_runs_vs_dbos_noop"] == math.inf
    assert target_verdicts(ratios(report))["flow_runs_vs_dbos_noop"]["verdict"] == "met"


def test_a_dbos_point_divides_the_postgresql_commit_delta_by_its_workflows():
    figures = {"workers": 2, "enqueued": 60, "units": 50, "failed": 10, "seconds": 2.5, "xact_commit": 1200,
               "xact_rollback": 25, "first_started_ms": 1, "last_finished_ms": 2501}
    assert dbos_point(figures) == {"workers": 2, "units": 50, "seconds": 2.5, "per_second": 20.0,
                                   "commits_per_unit": 24.0, "rollbacks_per_unit": 0.5, "enqueued": 60, "failed": 10}
    empty = dbos_point({**figures, "units": 0, "seconds": 0.0})
    assert (empty["per_second"], empty["commits_per_unit"]) == (0.0, 0.0)


def test_a_missing_dbos_virtualenv_is_reported_and_nothing_is_started(tmp_path):
    peer, status = dbos_start("nexus_test_dbos", print, python=tmp_path / "no-venv" / "bin" / "python")
    assert peer is None
    assert status["available"] is False and "the DBOS virtualenv is not installed" in status["reason"]
    assert status["system_database"] == "nexus_test_dbos_sys"


@pytest.mark.skipif(not (DBOS_VENV / "bin" / "python").exists(), reason="no DBOS virtualenv (make bench installs it)")
def test_an_unreachable_postgresql_is_reported_with_its_address_and_the_bench_goes_on():
    said = []
    peer, status = dbos_start("nexus_test_dbos", said.append, pg_url="postgresql://postgres@127.0.0.1:1")
    assert peer is None and said == []
    assert status["available"] is False
    assert status["reason"].startswith("PostgreSQL at postgresql://postgres@127.0.0.1:1 could not be reached")
    report = _report(dbos=False)
    report["peers"]["dbos"] = status
    assert all(ratio_reasons(report)[name].endswith(status["reason"]) for name in DBOS_RATIOS)


def test_the_billing_sandbox_url_comes_from_its_port_file(tmp_path: Path):
    with pytest.raises(BenchError, match="port file"):
        billing_sandbox_url(tmp_path)
    (tmp_path / "billing.port").write_text("43121", encoding="utf-8")
    assert billing_sandbox_url(tmp_path) == "http://127.0.0.1:43121"
