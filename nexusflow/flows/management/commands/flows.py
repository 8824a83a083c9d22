"""``manage.py flows <subcommand>``: Flow operator commands (seed 004 section 20.4).

Subcommands:

- ``inventory DIR [--json] [--detail] [--schema open|strict]``: compile every
  ``*.flow-meta.xml`` file in ``DIR`` without executing anything and print,
  per flow, the selected profile or the rejection reasons, unknown
  capabilities, loop/fan-out proof, step count, migration cohort, and whether
  this engine would activate and run it (``runs``, else its ``blockers``). Writes
  nothing. Exit 0 when every file was inventoried (rejections are results),
  2 when ``DIR`` is not a folder.
- ``start FLOW --org ORG [--input NAME=VALUE ...] [--input-json FILE]
  [--request-id ID]``: admit one run of the active autolaunched plan of
  ``FLOW`` with input variables (``--input-json`` holds one JSON object;
  ``--input`` values are text and override it; repeating ``--input`` for a
  collection input builds the list). Record inputs are local record keys.
  The same ``--request-id`` returns the run it already started. Prints
  ``{"run_id", "created", "state"}``; exit 2 on bad input
  (``flow_input_*``, ``flow_start_conflict``, a malformed org or request id),
  3 when the Flow has no active autolaunched plan (``flow_not_startable``).
- ``run RUN_ID --org ORG [--worker-id W] [--max-steps N]``: claim and execute
  the run's due steps in this process (normal claim/fence protocol) until it
  waits, is not yet due, or ends; prints the final state.
- ``cancel RUN_ID --org ORG``: the authorized public delete (seed 004
  section 10.1): cancellation plus ``IsDeleted`` soft delete; idempotent.
- ``show RUN_ID --org ORG [--include-deleted]``: the section 19 support read
  as JSON.
- ``waits --org ORG [--state S] [--limit N]``: the org's waits as a JSON
  array, oldest deadline first (seed 004 sections 10.5 and 14): each
  dependency with its run and step, producer kind and key, state, deadline,
  condition (a time wait's events and resume times), expiry policy,
  resolution and the wake signals accepted for its key. Exit 2 on a
  malformed org, an unknown state or a limit out of range.
- ``signal RUN_ID --org ORG --producer KIND --actor A --reason R``: an
  operator's resume of one waiting run: its waiting dependency of producer
  ``KIND`` resolves now through the producer's own transition (for
  ``runtime.clock``: along the earliest event, as if its time had come; for
  ``record.condition``: along the record event, as if the record met it), the
  actor and reason recorded with the resolution. Prints
  ``{"run_id", "dependency_id", "producer_kind", "event", "state"}``. Exit 2
  for a producer that takes no operator signal (a Runtime intent receipt
  comes only from its owner), a run not waiting on it, or bad input; 3 when
  the run is not in that org.

``run``/``cancel``/``show`` exit 0 on success, 2 on bad input (a malformed
id or org), 3 when the run is not in that org (``flow_run_not_found``).
"""
from __future__ import annotations

import json

from django.core.management.base import CommandError

from nexusflow.flows.errors import (
    FlowInputRejected,
    FlowNotStartable,
    FlowRunNotFound,
    FlowStartConflict,
    WaitSignalRefused,
)
from nexusflow.flows.inventory import flow_inventory
from nexusflow.flows.models import FlowRun
from nexusflow.flows.producers import PRODUCERS
from nexusflow.flows.services.support import WAITS_PAGE_MAX
from nexusflow.flows.transitions import FLOW_DEPENDENCY
from nexusflow.kernel.commands import OperatorCommand
from nexusflow.kernel.errors import InvalidIdentity
from nexusflow.kernel.identity import validate_key
from nexusflow.kernel.ids import id_from_text
from nexusflow.kernel.scope import OrgScope


class Command(OperatorCommand):
    help = ("Flow operator commands: inventory (compile-only report of a folder of Flow metadata files); "
            "start an autolaunched flow; run, cancel and show one run of an org; list an org's waits and "
            "schedules; read the "
            "database pressure that pauses new durable mutation work.")

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="subcommand", required=True,
                                    metavar="{inventory,start,run,cancel,show,waits,signal,pressure,schedules}")
        inv = sub.add_parser("inventory", help="Compile every *.flow-meta.xml in DIR; execute nothing.")
        inv.add_argument("directory", metavar="DIR")
        inv.add_argument("--json", action="store_true", help="One JSON array, one object per file.")
        inv.add_argument("--detail", action="store_true",
                         help="With --json: add loops, fan_out, warnings and plan_digest to each object.")
        inv.add_argument("--schema", choices=("open", "strict"), default="open",
                         help="strict: check objects and fields against this deployment's metadata view.")
        start = sub.add_parser("start", help="Start one run of an autolaunched flow with input variables.")
        start.add_argument("flow", metavar="FLOW")
        start.add_argument("--org", required=True, help="The trusted org to run in.")
        start.add_argument("--input", action="append", default=[], metavar="NAME=VALUE",
                           help="One input value (text); repeat for more inputs or collection items.")
        start.add_argument("--input-json", metavar="FILE", help="A JSON object of input values.")
        start.add_argument("--request-id", help="Operator request id: a retried start returns the same run.")
        waits = sub.add_parser("waits", help="List an org's waits (JSON): dependency, producer, deadline, "
                                             "condition, expiry policy, resolution and wake signals.")
        waits.add_argument("--org", required=True, help="The trusted org whose waits to list.")
        waits.add_argument("--state", choices=sorted(FLOW_DEPENDENCY.states),
                           help="Only waits in this state (default: every state).")
        waits.add_argument("--limit", type=int, default=100,
                           help=f"At most N rows, oldest deadline first (1..{WAITS_PAGE_MAX}, default 100).")
        signalable = ", ".join(sorted(k for k, c in PRODUCERS.items() if c.operator_signal))
        signal = sub.add_parser("signal", help="An operator's resume: deliver a producer's signal to one waiting run "
                                               f"by hand (producers that take one: {signalable}).")
        signal.add_argument("run_id", metavar="RUN_ID")
        signal.add_argument("--org", required=True, help="The trusted org the run belongs to.")
        signal.add_argument("--producer", required=True, help="The producer kind the run waits on.")
        signal.add_argument("--actor", required=True, help="Who resumes it (recorded with the resolution).")
        signal.add_argument("--reason", required=True, help="Why (recorded with the resolution).")
        schedules = sub.add_parser("schedules", help="List an org's active schedule-triggered flows (JSON): "
                                                     "schedule, next occurrence, latest occurrences and their runs.")
        schedules.add_argument("--org", required=True, help="The trusted org whose schedules to list.")
        pressure = sub.add_parser("pressure", help="Read the database pressure signals now: whether workers admit new "
                                                   "durable mutation work (Flow steps), and the bounds in force.")
        pressure.add_argument("--json", action="store_true", help="One JSON object.")
        for name, text in (("run", "Execute one run's due steps in this process."),
                           ("cancel", "Cancel and soft-delete one run (idempotent)."),
                           ("show", "Print the support read of one run as JSON.")):
            p = sub.add_parser(name, help=text)
            p.add_argument("run_id", metavar="RUN_ID")
            p.add_argument("--org", required=True, help="The trusted org the run belongs to.")
            if name == "run":
                p.add_argument("--worker-id", default="operator", help="Lease owner name (default: operator).")
                p.add_argument("--max-steps", type=int, default=100, help="Stop after N steps (default 100).")
            if name == "show":
                p.add_argument("--include-deleted", action="store_true",
                               help="Authorized include-deleted read of a soft-deleted run.")

    def handle(self, *args, subcommand: str, **options):
        if subcommand == "inventory":
            return self._inventory(**options)
        if subcommand == "start":
            return self._start(**options)
        if subcommand in ("run", "cancel", "show"):
            return self._one_run(subcommand, **options)
        if subcommand == "waits":
            return self._waits(**options)
        if subcommand == "schedules":
            return self._schedules(**options)
        if subcommand == "signal":
            return self._signal(**options)
        if subcommand == "pressure":
            return self._pressure(**options)
        raise CommandError(f"unknown subcommand {subcommand!r}", returncode=2)

    def _inventory(self, *, directory: str, json: bool, detail: bool, schema: str, **_options):
        if detail and not json:
            raise CommandError("--detail adds fields to the --json objects; use it with --json", returncode=2)
        try:
            rows = flow_inventory(directory, schema=schema)
        except NotADirectoryError:
            raise CommandError(f"{directory}: not a directory", returncode=2) from None
        if json:
            self.stdout.write(_dumps([r.as_json(detail=detail) for r in rows]))
            return
        for r in rows:
            status = r.profile if r.profile else "REJECTED"
            loops = ", ".join(f"{lp['element']}={lp['bound']}" for lp in r.loops) or "none"
            self.stdout.write(f"{r.flow}: {status}  cohort={r.cohort}  steps={r.steps}  fan-out={r.fan_out}  "
                              f"loops: {loops}  runs: {'yes' if r.runs else 'no (' + ', '.join(r.refused_for) + ')'}")
            if r.unknown_capabilities:
                self.stdout.write(f"  unknown capabilities: {', '.join(r.unknown_capabilities)}")
            for reason in r.reasons if r.rejected else r.blockers:
                where = f" [{reason['element']}]" if reason["element"] else ""
                self.stdout.write(f"  {reason['code']}{where}: {reason['detail']}")
        rejected = sum(1 for r in rows if r.rejected)
        runs = sum(1 for r in rows if r.runs)
        self.stdout.write(f"{len(rows)} flow file(s): {len(rows) - rejected} compiled, {runs} run, {rejected} rejected")


    def _start(self, *, flow: str, org: str, input: list[str], input_json: str | None, request_id: str | None,
               **_options):
        from nexusflow.flows import services

        try:
            validate_key(org, field="org", max_length=64)
            inputs, given = _start_inputs(input, input_json)
            started = services.flow_run_start(org=OrgScope(org), flow_api_name=flow, inputs=inputs,
                                              request_id=request_id, text_inputs=given)
        except (InvalidIdentity, FlowInputRejected, FlowStartConflict) as exc:
            raise CommandError(f"{exc.code}: {exc}", returncode=2) from None
        except FlowNotStartable as exc:
            raise CommandError(f"{exc.code}: {exc}", returncode=3) from None
        self.stdout.write(_dumps({"run_id": int(started.run.pk), "created": started.created,
                                  "state": started.run.state}))

    def _pressure(self, *, json: bool, **_options):
        from nexusflow.kernel.pressure import read_pressure
        from runtime_outbox.policy import runtime_policy

        try:
            policy = runtime_policy()
        except ValueError as exc:
            raise CommandError(f"invalid_setting: {exc}", returncode=2) from None
        from nexusflow.flows.services.claim import flow_lease_reading

        bounds = policy.pressure
        reading = read_pressure(bounds)
        expired, lease_reason = flow_lease_reading(bounds)
        reason = reading.reason or lease_reason
        body = {**reading.as_json(), "expired_leases": expired, "reason": reason, "admitted": not reason,
                "policy_version": policy.version,
                "bounds": {"active_statements": bounds.active_statements,
                           "connection_share": bounds.connection_share, "read_seconds": bounds.read_seconds,
                           "lock_waits": bounds.lock_waits, "expired_leases": bounds.expired_leases}}
        if json:
            self.stdout.write(_dumps(body))
            return
        verdict = f"paused ({reason})" if reason else "admitted"
        self.stdout.write(f"new durable mutation work: {verdict}; running statements {reading.active_statements} "
                          f"(bound {bounds.active_statements}); connections {reading.connections} of "
                          f"{reading.max_connections or 'unbounded'} (bound {bounds.connection_share:.0%}); "
                          f"row lock waits {reading.lock_waits} (bound {bounds.lock_waits}); expired step leases "
                          f"{expired} (bound {bounds.expired_leases}; runtime policy {policy.version})")

    def _waits(self, *, org: str, state: str | None, limit: int, **_options):
        from nexusflow.flows import services

        try:
            validate_key(org, field="org", max_length=64)
            rows = services.flow_waits_list(org=OrgScope(org), state=state, limit=limit)
        except InvalidIdentity as exc:
            raise CommandError(f"{exc.code}: {exc}", returncode=2) from None
        except ValueError as exc:
            raise CommandError(f"invalid_argument: {exc}", returncode=2) from None
        self.stdout.write(_dumps(rows))

    def _schedules(self, *, org: str, **_options):
        from nexusflow.flows import services

        try:
            validate_key(org, field="org", max_length=64)
        except InvalidIdentity as exc:
            raise CommandError(f"{exc.code}: {exc}", returncode=2) from None
        self.stdout.write(_dumps(services.flow_schedules_list(org=OrgScope(org))))

    def _signal(self, *, run_id: str, org: str, producer: str, actor: str, reason: str, **_options):
        from nexusflow.flows import services

        try:
            validate_key(org, field="org", max_length=64)
            run_id = id_from_text(run_id, FlowRun, field="run id")
            result = services.flow_wait_signal(org=OrgScope(org), run_id=run_id, producer_kind=producer,
                                               actor=actor, reason=reason)
        except (InvalidIdentity, WaitSignalRefused) as exc:
            raise CommandError(f"{exc.code}: {exc}", returncode=2) from None
        except FlowRunNotFound as exc:
            raise CommandError(f"{exc.code}: {exc}", returncode=3) from None
        self.stdout.write(_dumps(result))

    def _one_run(self, subcommand: str, *, run_id: str, org: str, **options):
        from nexusflow.flows import services

        try:
            validate_key(org, field="org", max_length=64)
            run_id = id_from_text(run_id, FlowRun, field="run id")
            scope = OrgScope(org)
            if subcommand == "run":
                if options["max_steps"] < 1:
                    raise CommandError("invalid_argument: --max-steps must be at least 1", returncode=2)
                state = services.flow_run_drive(org=scope, run_id=run_id, worker_id=options["worker_id"],
                                                max_steps=options["max_steps"])
                self.stdout.write(_dumps({"run_id": run_id, "state": state}))
            elif subcommand == "cancel":
                self.stdout.write(_dumps(services.flow_run_delete(org=scope, run_id=run_id).as_dict()))
            else:
                self.stdout.write(_dumps(services.flow_run_support_read(
                    org=scope, run_id=run_id, include_deleted=options["include_deleted"])))
        except InvalidIdentity as exc:
            raise CommandError(f"{exc.code}: {exc}", returncode=2) from None
        except FlowRunNotFound as exc:
            raise CommandError(f"{exc.code}: {exc}", returncode=3) from None


def _start_inputs(pairs: list[str], json_file: str | None) -> tuple[dict, dict[str, list[str]]]:
    """The ``--input-json`` object and the ``--input NAME=VALUE`` texts grouped by name."""
    inputs: dict = {}
    if json_file is not None:
        try:
            with open(json_file, encoding="utf-8") as fh:
                inputs = json.load(fh)
        except (OSError, ValueError) as exc:
            raise FlowInputRejected(f"--input-json {json_file}: {exc}", code="flow_input_type") from None
        if not isinstance(inputs, dict):
            raise FlowInputRejected("--input-json must hold one JSON object", code="flow_input_type")
    given: dict[str, list[str]] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise FlowInputRejected(f"--input {pair!r}: expected NAME=VALUE", code="flow_input_type")
        given.setdefault(name, []).append(value)
    return inputs, given


def _dumps(value) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False)
