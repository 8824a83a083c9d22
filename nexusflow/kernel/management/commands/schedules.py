"""``manage.py schedules <subcommand>``: the periodic reconcilers as django-q2 schedules.

Seed 004 section 16 (maintenance/reconciliation class); see nexusflow/kernel/schedules.py.

- ``install``: write one schedule per registered reconciler (idempotent: a second run creates nothing;
  an existing schedule keeps its next run);
- ``list [--json]``: each reconciler with its schedule's interval, next run and last run
  (``{"unit", "role", "schedule", "minutes", "installed", "next_run", "last_run", "last_success"}``);
- ``run UNIT [--batch N]``: run one reconciler now, as its schedule does, and print the items done.

Exit codes: 0 done, 1 refused (``unknown_reconciler``), 2 bad usage (``invalid_batch``).
"""
from __future__ import annotations

import json

from django.core.management.base import CommandError

from nexusflow.kernel import schedules
from nexusflow.kernel.clock import db_now
from nexusflow.kernel.commands import OperatorCommand


class Command(OperatorCommand):
    help = "Periodic reconcilers as django-q2 schedules: install, list, run."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="subcommand", required=True, metavar="{install,list,run}")
        sub.add_parser("install", help="Write one schedule per reconciler (idempotent).")
        ls = sub.add_parser("list", help="Reconcilers, their schedules and last runs.")
        ls.add_argument("--json", action="store_true")
        run = sub.add_parser("run", help="Run one reconciler now, as its schedule does.")
        run.add_argument("unit")
        run.add_argument("--batch", type=int, default=None)

    def handle(self, *args, subcommand: str, **options):
        return getattr(self, "_" + subcommand)(**options)

    def _install(self, **_):
        created, updated = schedules.install(now=db_now())
        for name in created:
            self.stdout.write(f"created {name}")
        for name in updated:
            self.stdout.write(f"updated {name}")
        self.stdout.write(f"{len(created)} created, {len(updated)} updated, "
                          f"{len(schedules.reconcilers()) - len(created) - len(updated)} unchanged")

    def _list(self, *, json: bool = False, **_):
        from django_q.models import Schedule, Task

        rows = []
        for reconciler in schedules.reconcilers():
            schedule = Schedule.objects.filter(name=reconciler.schedule_name).first()
            last = (Task.objects.filter(group=reconciler.schedule_name).order_by("-stopped").first()
                    if schedule is not None else None)
            rows.append({"unit": reconciler.unit, "role": reconciler.role, "schedule": reconciler.schedule_name,
                         "minutes": reconciler.minutes, "installed": schedule is not None,
                         "next_run": schedule.next_run.isoformat() if schedule and schedule.next_run else None,
                         "last_run": last.stopped.isoformat() if last else None,
                         "last_success": last.success if last else None})
        if json:
            self.stdout.write(_dumps(rows))
            return
        for r in rows:
            state = "not installed" if not r["installed"] else (
                f"next {r['next_run']}  last {r['last_run'] or '-'}"
                + ("" if r["last_success"] is None else ("  ok" if r["last_success"] else "  FAILED")))
            self.stdout.write(f"{r['unit']:<22} {r['role']:<10} every {r['minutes']} min  {state}")

    def _run(self, *, unit: str, batch: int | None, **_):
        if batch is not None and batch < 1:
            raise CommandError("invalid_batch: --batch must be at least 1", returncode=2)
        try:
            done = schedules.run_reconciler(unit, batch)
        except schedules.UnknownReconciler as exc:
            raise CommandError(f"{exc.code}: {exc}") from exc
        self.stdout.write(f"{unit}: {done} item(s)")


def _dumps(value) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)
