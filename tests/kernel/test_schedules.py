"""The periodic reconcilers as django-q2 schedules (nexusflow/kernel/schedules.py; issue 22 item 4).

Each scheduled run here is made through the installed schedule's own function path and argument
(what ``qcluster`` calls), on the real database.
"""
from __future__ import annotations

import ast
import io
import json
import pydoc

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings
from django_q.models import Schedule

from connectors.models import RemoteEffect
from connectors.outbound import egress
from nexusflow.kernel import schedules
from nexusflow.kernel.clock import db_now
from nexusflow.kernel.workers import units_for
from tests.conftest import drain, make_serving_org
from tests.kits.outbound import zero_backoff

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

#: The reconcilers the apps register (worker units that repair or close left-behind work).
EXPECTED = {"receipt.reconcile", "window.close", "dependency.expire", "execution.recover", "permit.abandon",
            "effect.reconcile", "outbox.reconcile", "flow.recover", "flow.expire", "flow.repair",
            "flow.cancel_cleanup"}


def _run(*args) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def _run_scheduled(unit: str):
    """Run the installed schedule of ``unit`` as qcluster does: its function path with its arguments."""
    schedule = Schedule.objects.get(name=schedules.SCHEDULE_PREFIX + unit)
    return pydoc.locate(schedule.func)(*ast.literal_eval(f"({schedule.args},)"))


def test_the_schedule_set_is_installed_once():
    assert {r.unit for r in schedules.reconcilers()} == EXPECTED
    before = db_now()
    assert _run("schedules", "install").endswith(f"{len(EXPECTED)} created, 0 updated, 0 unchanged\n")
    installed = {s.name: s for s in Schedule.objects.filter(name__startswith=schedules.SCHEDULE_PREFIX)}
    assert set(installed) == {schedules.SCHEDULE_PREFIX + unit for unit in EXPECTED}
    for schedule in installed.values():
        assert (schedule.func, schedule.schedule_type, schedule.minutes, schedule.repeats) == (
            schedules.FUNC, Schedule.MINUTES, 1, -1)
        assert before <= schedule.next_run <= db_now() + schedules.dt.timedelta(minutes=1)  # jittered in one interval
    assert len({s.next_run for s in installed.values()}) > 1

    assert _run("schedules", "install").endswith(f"0 created, 0 updated, {len(EXPECTED)} unchanged\n")
    assert Schedule.objects.filter(name__startswith=schedules.SCHEDULE_PREFIX).count() == len(EXPECTED)
    again = {s.name: s.next_run for s in Schedule.objects.filter(name__startswith=schedules.SCHEDULE_PREFIX)}
    assert again == {name: s.next_run for name, s in installed.items()}  # a reinstall keeps each next run

    Schedule.objects.filter(name=schedules.SCHEDULE_PREFIX + "window.close").update(minutes=7)
    assert "updated nexusflow.reconcile.window.close" in _run("schedules", "install")
    assert Schedule.objects.get(name=schedules.SCHEDULE_PREFIX + "window.close").minutes == 1

    rows = json.loads(_run("schedules", "list", "--json"))
    assert {r["unit"] for r in rows if r["installed"]} == EXPECTED


def test_the_effect_reconcile_schedule_resolves_uncertain_pushes_in_bounded_batches(billing_sandbox):
    make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    from tests.connectors.outbound.test_outbound_effects import _push

    commands = [_push("a@x.io", slot="push-a"), _push("b@x.io", slot="push-b")]
    billing_sandbox.set_faults(drop_response_after_commit=2)
    assert egress.effect_try_dispatch_one(worker_id="w1") and egress.effect_try_dispatch_one(worker_id="w1")
    assert set(RemoteEffect.objects.values_list("state", flat=True)) == {"uncertain"}
    zero_backoff()
    _run("schedules", "install")

    with override_settings(NEXUS_SCHEDULE_BATCH=1):
        assert _run_scheduled("effect.reconcile") == 1  # bounded: one item per run at batch 1
    assert sorted(RemoteEffect.objects.values_list("state", flat=True)) != ["uncertain", "uncertain"]
    assert _run_scheduled("effect.reconcile") >= 1
    assert "uncertain" not in set(RemoteEffect.objects.values_list("state", flat=True))
    assert _run_scheduled("effect.reconcile") == 0  # idempotent: nothing left, nothing done
    drain()
    assert {RemoteEffect.objects.get(command=c).state for c in commands} == {"finalized"}
    # One customer each: the lost-response create and its exact repeat (same key, replayed by the provider).
    assert sorted(c["create_requests"] for c in billing_sandbox.state()["customers"]) == [2, 2]


def test_with_schedules_authoritative_the_worker_loops_leave_the_reconcilers_out():
    with override_settings(NEXUS_RECONCILERS="schedules"):
        names = {name for role in ("connector", "egress", "egress-deferred", "runtime", "flow")
                 for name, _unit in units_for(role, "w1")}
    assert not names & EXPECTED
    assert {"execution.run", "effect.dispatch", "outbox.deliver", "flow.step"} <= names
    with override_settings(NEXUS_RECONCILERS="workers"):
        names = {name for role in ("connector", "egress", "runtime", "flow") for name, _unit in units_for(role, "w1")}
    assert EXPECTED <= names


def test_an_unknown_reconciler_or_batch_is_refused():
    with pytest.raises(CommandError, match="^unknown_reconciler"):
        _run("schedules", "run", "effect.dispatch")
    with pytest.raises(CommandError, match="^invalid_batch"):
        _run("schedules", "run", "effect.reconcile", "--batch", "0")
    assert _run("schedules", "run", "window.close") == "window.close: 0 item(s)\n"
    assert not Schedule.objects.filter(name__startswith=schedules.SCHEDULE_PREFIX).exists()


def test_the_dependency_expire_schedule_expires_a_gap_past_its_frozen_deadline(client, billing_sandbox, settings,
                                                                              monkeypatch, tmp_path, db_clock_advance):
    from connectors.inbound.executions import execution_try_run_one
    from connectors.models import ExecutionDependency
    from tests.conftest import hubspot_event, post_signed
    from tests.connectors import variant_pack

    variant_pack.use_variant(settings, monkeypatch, tmp_path,
                             variant_pack.strict(deadline_seconds=1, disposition="skip"))
    make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    post_signed(client, [hubspot_event(1, 802, 1000), hubspot_event(3, 802, 3000, "email", "three@x.io")])
    while execution_try_run_one(worker_id="t"):
        pass
    _run("schedules", "install")
    assert _run_scheduled("dependency.expire") == 0  # the deadline has not passed
    assert ExecutionDependency.objects.get().state == "waiting"
    db_clock_advance(1.2)
    assert _run_scheduled("dependency.expire") == 1
    assert ExecutionDependency.objects.get().state == "expired"
    assert _run_scheduled("dependency.expire") == 0  # a second run finds nothing more
