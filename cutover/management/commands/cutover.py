"""``manage.py cutover <procedure> --org ORG``: the whole-service cutover, one procedure per call.

- ``greenfield``: a fresh install with no V1 activates its first ServingEpoch;
- ``v1-install``: a fresh V1 install (every gate ``v1_serving``, served by ``run_workers --role v1``);
- ``preflight --attempt KEY --plan FILE [--rehearse]``: certify a V1 -> V2 attempt before maintenance
  (one immutable CutoverReadinessCertificate), or refuse it with reason-coded blockers; ``--rehearse`` also
  runs a representative restore rehearsal of the live main database on a separate ``mariadbd``;
- ``halt-v1 --attempt KEY``: close the V1 maintenance barriers, move every gate to ``halting_v1``
  under the attempt's certificate and remeasure; a breach reopens the barriers and aborts to
  ``v1_serving`` (exit 3);
- ``abort-halt --attempt KEY``: the fenced abort ``halting_v1 -> v1_serving`` (a budget breach or an operator's
  decision) before V1 was isolated or terminated: barriers reopened, every gate with a new fence;
- ``drain --attempt KEY``: report the V1 work, leases and unresolved V1 calls still open (exit 3), or
  record the first zero inventory;
- ``stop --attempt KEY [--wait-seconds N]``: deny V1 provider egress, terminate and prove gone every V1
  process generation, move every gate to ``v1_stopped``;
- ``reconcile --attempt KEY (--call ID --outcome remote_finalized|no_effect --evidence TEXT [--remote-id R]
  | --answers FILE)``: terminalize interrupted V1 provider calls from provider-established evidence;
- ``certify --attempt KEY``: the second inventory under the gate locks; tombstones, ordering baselines,
  one V1ShutdownCertificate, every gate ``v1_drained``;
- ``restore-point --attempt KEY [--backup-dir DIR]``: a full ``mariadb-dump`` of every NexusFlow database with
  its manifest, restored and verified on an isolated ``mariadbd``, then one V1RestorePoint (control database);
- ``validate --attempt KEY``: verify the certified V2 candidate (exact generations, conformance), start its
  OrderingLanes from the certified baselines, every gate ``v2_validating`` with every production path disabled,
  the CutoverDecision opened ``rollback_open``;
- ``activate --attempt KEY``: hold the publication barriers, final reread, win ``activating_v2``, one transaction
  to ``v2_serving``, readback, ``v2_committed``, release (exit 3 when a restore won the decision);
- ``restore --attempt KEY``: the full V1 restore (a RestoreAttempt wins ``restoring_v1``, proves V2 served
  nothing, rewrites the main database from the V1RestorePoint, verifies it, records ``v1_restored`` on the
  control database, every gate ``v1_serving``); exit 3 when activation won the decision;
- ``cold-abort --attempt KEY``: after ``certify`` and before ``validate`` mutates anything for V2, return every
  gate ``v1_drained -> v1_serving`` (barriers reopened; a new exact-V1 generation may start);
- ``status [--json]``: phase, gate counts, certificate, budgets, blockers and the next command.

Every procedure but ``status`` is idempotent and resumable; ``--json`` prints the report as JSON.
Exit codes: 0 done; 1 a greenfield/v1-install refusal or an unexpected error; 2 bad input (the
stable code first on the line); 3 refused or blocked (reason-coded blockers, a changed input under the same
attempt, gates in the wrong state); 4 deferred (an owner could not be read now: run it again).
"""
import json
from dataclasses import asdict
from pathlib import Path

from django.core.management.base import CommandError

from connectors.serving.gates import EpochVerificationDeferred
from cutover.activate import cutover_activate
from cutover.certify import cutover_certify
from cutover.drain import cutover_drain
from cutover.halt import HaltAborted, cutover_halt_abort, cutover_halt_v1
from cutover.preflight import CutoverPlanInvalid, ReadinessRefused, cutover_preflight
from cutover.reconcile import ReconciliationInvalid, cutover_reconcile
from cutover.restore import cutover_cold_abort, cutover_restore
from cutover.restore_point import cutover_restore_point, representative_rehearsal
from cutover.services import cutover_greenfield
from cutover.status import cutover_status
from cutover.stop import DEFAULT_WAIT_SECONDS, cutover_stop
from cutover.v1_install import cutover_v1_install
from cutover.v1_shutdown import ShutdownBlocked
from cutover.validate import cutover_validate
from nexusflow.kernel.commands import OperatorCommand
from nexusflow.kernel.errors import InvalidIdentity, NexusError
from nexusflow.kernel.scope import OrgScope

EXIT_BAD_INPUT, EXIT_REFUSED, EXIT_DEFERRED = 2, 3, 4


class Command(OperatorCommand):
    help = ("Run a cutover procedure: 'greenfield' (a fresh install with no V1 activates V2), 'v1-install' "
            "(a fresh V1 install: every gate v1_serving, served by run_workers --role v1), 'preflight' (certify a "
            "V1 -> V2 attempt against an L2 plan before maintenance), 'halt-v1' (close the V1 maintenance barriers "
            "and halt every gate under that certificate), 'abort-halt' (the fenced abort back to v1_serving before "
            "V1 is stopped), 'drain' (check V1 finished its accepted work), 'stop' (deny V1 "
            "egress and terminate the V1 processes), 'reconcile' (resolve interrupted V1 calls from provider "
            "evidence), 'certify' (the V1 shutdown certificate; gates v1_drained), 'restore-point' (the rehearsed "
            "full-database V1 restore point), 'validate' (verify the V2 candidate; gates v2_validating), "
            "'activate' (the atomic V2 activation), 'restore' (the full V1 restore from the restore point), "
            "'cold-abort' (back to V1 after certify, before any V2 mutation) or "
            "'status' (where the cutover stands).")
    SHUTDOWN = ("drain", "stop", "reconcile", "certify", "restore-point", "validate", "activate", "restore",
                "cold-abort")

    def add_arguments(self, parser):
        parser.add_argument("procedure", choices=["greenfield", "v1-install", "preflight", "halt-v1", "abort-halt", "drain",
                                                  "stop", "reconcile", "certify", "restore-point", "validate", "activate",
                                                  "restore", "cold-abort", "status"])
        parser.add_argument("--org", required=True, help="Org id whose accounts to activate, install or certify.")
        parser.add_argument("--attempt", help="preflight: the service cutover attempt key (a new key per input change).")
        parser.add_argument("--plan", help="preflight: the L2 cutover plan JSON file (docs/operations.md).")
        parser.add_argument("--json", dest="as_json", action="store_true",
                            help="status, drain, stop, reconcile, certify, restore-point, validate, activate, restore, "
                                 "cold-abort: print "
                                 "the report as JSON.")
        parser.add_argument("--rehearse", action="store_true",
                            help="preflight: also run a representative restore rehearsal of the live main database "
                                 "on a separate mariadbd (its time is checked against the plan's restore_rehearsal "
                                 "budget).")
        parser.add_argument("--backup-dir", help="restore-point: where the dump files and manifest go "
                                                 "(default settings.NEXUS_BACKUP_DIR, var/restore_points/).")
        parser.add_argument("--wait-seconds", type=float, default=DEFAULT_WAIT_SECONDS,
                            help="stop: how long to wait for signalled V1 processes to be proven gone.")
        parser.add_argument("--call", type=int, help="reconcile: the V1 provider call id.")
        parser.add_argument("--outcome", choices=["remote_finalized", "no_effect"],
                            help="reconcile: what the provider shows for the call.")
        parser.add_argument("--evidence", help="reconcile: how the answer was established (lookup, ticket).")
        parser.add_argument("--remote-id", default="", help="reconcile: the provider's id of a finalized object.")
        parser.add_argument("--answers", help='reconcile: a JSON file [{"call_id", "outcome", "evidence", '
                                              '"remote_id"?}].')

    def handle(self, *args, procedure, org, attempt=None, plan=None, as_json=False, **options):
        scope = OrgScope(org)
        try:
            if procedure in self.SHUTDOWN:
                self._shutdown(scope, procedure, attempt, as_json, options)
                return
            if procedure == "v1-install":
                report = cutover_v1_install(org=scope)
                self.stdout.write(f"V1 installed for {org}: configuration generation {report.configuration_generation}, "
                                  f"release {report.release[:16]}; accounts: {', '.join(report.accounts)}; "
                                  f"stream cursors: {', '.join(report.cursors) or 'none'}; new rows: {report.created}")
                return
            if procedure == "preflight":
                self._preflight(scope, attempt, plan, options.get("rehearse", False))
                return
            if procedure == "halt-v1":
                self._halt(scope, attempt)
                return
            if procedure == "abort-halt":
                if not attempt:
                    raise CommandError("missing_argument: abort-halt needs --attempt KEY", returncode=EXIT_BAD_INPUT)
                aborted = cutover_halt_abort(org=scope, attempt_key=attempt)
                used = aborted.budget.get("used_seconds")
                self.stdout.write(f"attempt {attempt} {'already ' if aborted.already else ''}aborted: gates "
                                  f"v1_serving: {', '.join(aborted.gates)}; barriers open"
                                  + (f"; halted {used}s of {aborted.budget['budget_seconds']}s" if used is not None
                                     else ""))
                return
            if procedure == "status":
                self._status(scope, as_json)
                return
            report = cutover_greenfield(org=scope)
        except (InvalidIdentity, CutoverPlanInvalid, ReconciliationInvalid) as exc:
            raise CommandError(f"{exc.code}: {exc}", returncode=EXIT_BAD_INPUT) from exc
        except EpochVerificationDeferred as exc:
            raise CommandError(f"{exc.code}: {exc}", returncode=EXIT_DEFERRED) from exc
        except ShutdownBlocked as exc:
            if as_json:
                self.stdout.write(json.dumps({"phase": exc.phase, "blocked": True, "blockers": exc.blockers},
                                             indent=2, sort_keys=True))
            lines = [f"  {b['reason_code']}: {b['subject']}: {b['detail']}" for b in exc.blockers]
            raise CommandError(f"{exc.code}: {exc}; run it again once the blockers are resolved\n"
                               + "\n".join(lines), returncode=EXIT_REFUSED) from exc
        except (ReadinessRefused, HaltAborted) as exc:
            lines = [f"  {b['reason_code']}: {b['subject']}: {b['detail']}" for b in exc.blockers]
            tail = "; nothing entered maintenance" if isinstance(exc, ReadinessRefused) else ""
            raise CommandError(f"{exc.code}: {exc}{tail}\n" + "\n".join(lines),
                               returncode=EXIT_REFUSED) from exc
        except NexusError as exc:
            # greenfield and v1-install keep their original exit 1 for a refusal.
            code = EXIT_REFUSED if procedure in ("preflight", "halt-v1", "abort-halt", *self.SHUTDOWN) else 1
            raise CommandError(f"{exc.code}: {exc}", returncode=code) from exc
        state = "already active" if report.already_active else "activated"
        self.stdout.write(f"epoch {report.epoch_id} {state} ({report.epoch_digest[:16]}); "
                          f"accounts: {', '.join(report.accounts)}; decision: {report.decision}")

    def _preflight(self, org: OrgScope, attempt: str | None, plan_path: str | None, rehearse: bool = False) -> None:
        if not attempt or not plan_path:
            raise CommandError("missing_argument: preflight needs --attempt KEY and --plan FILE",
                               returncode=EXIT_BAD_INPUT)
        try:
            plan = json.loads(Path(plan_path).read_bytes())
        except OSError as exc:
            raise CommandError(f"plan_unreadable: {plan_path}: {exc.strerror}", returncode=EXIT_BAD_INPUT) from exc
        except ValueError as exc:
            raise CommandError(f"cutover_plan_invalid: {plan_path} is not JSON: {exc}",
                               returncode=EXIT_BAD_INPUT) from exc
        report = cutover_preflight(org=org, attempt_key=attempt, plan=plan,
                                   rehearse=representative_rehearsal if rehearse else None)
        verb = "certified" if report.created else "already certified (identical inputs)"
        self.stdout.write(f"attempt {report.attempt_key} {verb}: certificate {report.certificate_id} "
                          f"digest {report.digest}; epoch {report.epoch_id}")
        for route in report.routes:
            self.stdout.write(f"  route {route['account_key']}/{route['route_key']}: {route['disposition']}")
        for phase, p in report.projections.items():
            self.stdout.write(f"  {phase}: projected {p['projected_seconds']}s of {p['budget_seconds']}s")

    def _halt(self, org: OrgScope, attempt: str | None) -> None:
        if not attempt:
            raise CommandError("missing_argument: halt-v1 needs --attempt KEY", returncode=EXIT_BAD_INPUT)
        report = cutover_halt_v1(org=org, attempt_key=attempt)
        verb = "already halted" if report.already else "halted"
        fences = ", ".join(f"{kind}@{fence}" for kind, fence in sorted(report.barriers.items()))
        self.stdout.write(f"attempt {attempt} {verb}: gates halting_v1: {', '.join(report.gates)}; "
                          f"barriers closed: {fences}; certificate {report.certificate_digest[:16]}")
        for phase, p in report.remeasured.items():
            self.stdout.write(f"  remeasured {phase}: {p['projected_seconds']}s of {p['budget_seconds']}s")

    def _shutdown(self, org: OrgScope, procedure: str, attempt: str | None, as_json: bool, options: dict) -> None:
        if not attempt:
            raise CommandError(f"missing_argument: {procedure} needs --attempt KEY", returncode=EXIT_BAD_INPUT)
        if procedure == "drain":
            report = cutover_drain(org=org, attempt_key=attempt)
            text = (f"attempt {attempt} {'already ' if report.already else ''}drained: V1 has no open work, live "
                    f"lease or unresolved call (inventory {report.inventory_digest[:16]})")
        elif procedure == "stop":
            report = cutover_stop(org=org, attempt_key=attempt, wait_seconds=options["wait_seconds"])
            text = (f"attempt {attempt} {'already ' if report.already else ''}stopped: gates v1_stopped: "
                    f"{', '.join(report.gates)}; V1 generations terminated: "
                    f"{', '.join(map(str, report.generations)) or 'none'}; egress denial {report.denial_id}")
        elif procedure == "reconcile":
            report = cutover_reconcile(org=org, attempt_key=attempt, answers=self._answers(options))
            done = "; ".join(f"call {r['call_id']}: {r['from_state']} -> {r['to_state']}" for r in report.reconciled)
            text = (f"attempt {attempt} reconciled: {done or 'nothing new'}"
                    + (f"; already: {', '.join(map(str, report.already))}" if report.already else ""))
        elif procedure == "validate":
            report = cutover_validate(org=org, attempt_key=attempt)
            text = (f"attempt {attempt} {'already ' if report.already else ''}validated: candidate epoch "
                    f"{report.epoch_id} {report.epoch_digest[:16]} verified; gates v2_validating: "
                    f"{', '.join(report.gates)}; ordering lanes {report.lanes}; decision {report.decision}")
        elif procedure == "activate":
            report = cutover_activate(org=org, attempt_key=attempt)
            text = (f"attempt {attempt} {'already ' if report.already else ''}activated: epoch {report.epoch_id} "
                    f"{report.epoch_digest[:16]} active; gates v2_serving: {', '.join(report.gates)}; decision "
                    f"{report.decision}; publication barriers released; V2 serves through the running V2 workers "
                    "(start them with run_workers --role all if none runs; cutover status says)")
        elif procedure == "cold-abort":
            report = cutover_cold_abort(org=org, attempt_key=attempt)
            text = (f"attempt {attempt} {'already ' if report.already else ''}cold-aborted: gates v1_serving: "
                    f"{', '.join(report.gates)}; barriers open; start V1 with run_workers --role v1")
        elif procedure == "restore":
            report = cutover_restore(org=org, attempt_key=attempt)
            seconds = ", ".join(f"{phase} {s}s" for phase, s in report.seconds.items())
            text = (f"attempt {attempt} {'already ' if report.already else ''}restored: V1 restore point "
                    f"{report.restore_point_id} loaded and verified (restore attempt {report.restore_attempt_id}, "
                    f"fence {report.holder_fence}); decision {report.decision}; gates v1_serving: "
                    f"{', '.join(report.gates)}; start V1 with run_workers --role v1"
                    + (f" ({seconds})" if seconds else ""))
        elif procedure == "restore-point":
            report = cutover_restore_point(org=org, attempt_key=attempt, backup_dir=options.get("backup_dir"))
            seconds = report.rehearsal.get("seconds", {})
            text = (f"attempt {attempt} {'already has a' if report.already else 'captured a'} V1 restore point "
                    f"{report.restore_point_id} (manifest {report.manifest_digest[:16]}, certificate "
                    f"{report.certificate_digest[:16]}) in {report.backup_path}; rehearsal restored and verified it "
                    f"in {seconds.get('total', '?')}s")
        else:
            report = cutover_certify(org=org, attempt_key=attempt)
            text = (f"attempt {attempt} {'already ' if report.already else ''}certified: V1 shutdown certificate "
                    f"{report.certificate_id} {report.digest[:16]}; gates v1_drained: {', '.join(report.gates)}; "
                    f"tombstones {report.tombstones}, ordering baselines {report.baselines}")
        self.stdout.write(json.dumps(asdict(report), indent=2, sort_keys=True) if as_json else text)

    @staticmethod
    def _answers(options: dict) -> list:
        if options.get("answers"):
            if options.get("call") is not None:
                raise CommandError("bad_arguments: give --answers FILE or --call ID, not both",
                                   returncode=EXIT_BAD_INPUT)
            try:
                return json.loads(Path(options["answers"]).read_bytes())
            except OSError as exc:
                raise CommandError(f"answers_unreadable: {options['answers']}: {exc.strerror}",
                                   returncode=EXIT_BAD_INPUT) from exc
            except ValueError as exc:
                raise CommandError(f"reconciliation_invalid: {options['answers']} is not JSON: {exc}",
                                   returncode=EXIT_BAD_INPUT) from exc
        if options.get("call") is None or not options.get("outcome") or not options.get("evidence"):
            raise CommandError("missing_argument: reconcile needs --answers FILE, or --call ID --outcome OUTCOME "
                               "--evidence TEXT", returncode=EXIT_BAD_INPUT)
        answer = {"call_id": options["call"], "outcome": options["outcome"], "evidence": options["evidence"]}
        if options.get("remote_id"):
            answer["remote_id"] = options["remote_id"]
        return [answer]

    def _status(self, org: OrgScope, as_json: bool) -> None:
        report = cutover_status(org=org)
        if as_json:
            self.stdout.write(json.dumps(report, indent=2, sort_keys=True))
            return
        gates = ", ".join(f"{state}={n}" for state, n in report["gates"].items()) or "none"
        self.stdout.write(f"org {report['org_id']}: phase {report['phase']}; gates: {gates}")
        certificate = report["certificate"]
        self.stdout.write("certificate: " + ("none" if certificate is None else
                                             f"{certificate['attempt_key']} {certificate['digest'][:16]}"))
        point = report["restore_point"]
        if point is not None:
            self.stdout.write(f"V1 restore point: {point['attempt_key']} manifest {point['manifest_digest'][:16]} "
                              f"in {point['backup_path']}")
        barriers = report["publication_barriers"]
        if barriers is not None:
            self.stdout.write(f"publication barriers: set {barriers['id']} of {barriers['attempt_key']} "
                              f"{barriers['state']}, holder {barriers['holder']} fence {barriers['holder_fence']}")
        decision = report["decision"]
        if decision is not None:
            self.stdout.write(f"decision: {decision['attempt_key']} {decision['state']}")
        for phase, b in report["budgets"].items():
            used = "-" if b["used_seconds"] is None else f"{b['used_seconds']}s"
            self.stdout.write(f"  budget {phase}: used {used}, projected {b['projected_seconds']}s "
                              f"of {b['budget_seconds']}s")
        for b in report["blockers"]:
            self.stdout.write(f"blocker {b['reason_code']}: {b['subject']}: {b['detail']}")
        self.stdout.write(f"next: {report['next_command']}")
