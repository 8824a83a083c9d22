"""``manage.py bench`` refuses a bad size before touching any database (the run itself is ``make bench``)."""
import pytest

from packs.bench.run import TARGETS, _ratios, percentiles
from tests.conftest import run_manage, subprocess_env


@pytest.mark.parametrize("scale", ["0", "-1", "21"])
def test_a_scale_out_of_range_exits_2_with_its_reason(scale):
    result = run_manage(["bench", "--scale", scale], subprocess_env(), timeout=60)
    assert result.returncode == 2 and "--scale must be within (0, 20]" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_ratios_are_computed_from_the_series_of_the_run():
    def series(*rates):
        return [{"workers": n, "per_second": r} for n, r in zip((1, 2, 4), rates)]

    report = {"series": {"floor": series(1000, 2000, 3000), "q2": series(100, 200, 300),
                         "flow_runs": series(150, 300, 500)}}
    assert _ratios(report) == {"flow_runs_vs_q2": 1.5, "scaling_2v1_flow_runs": 2.0, "scaling_2v1_q2": 2.0,
                               "flow_runs_vs_floor": 0.15}
    assert set(TARGETS) <= set(_ratios(report))


def test_latency_percentiles_are_nearest_rank():
    values = [float(v) for v in range(1, 101)]  # 1..100 ms
    assert percentiles(values) == {"p50": 50.0, "p95": 95.0, "p99": 99.0}
    assert percentiles([7.0]) == {"p50": 7.0, "p95": 7.0, "p99": 7.0}
    assert percentiles([]) == {"p50": 0.0, "p95": 0.0, "p99": 0.0}
