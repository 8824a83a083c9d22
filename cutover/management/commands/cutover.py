"""``manage.py cutover <procedure> --org ORG``: the whole-service cutover, one procedure per call.

- ``greenfield``: a fresh install with no V1 activates its first ServingEpoch;
- ``v1-install``: a fresh V1 install (every gate ``v1_serving``, served by ``run_workers --role v1``);
- ``preflight --attempt KEY --plan FILE``: certify a V1 -> V2 attempt before maintenance
  (one immutable CutoverReadinessCertificate), or refuse it with reason-coded blockers;
- ``halt-v1 --attempt KEY``: close the V1 maintenance barriers, move every gate to ``halting_v1``
  under the attempt's certificate and remeasure; a breach reopens the barriers and aborts to
  ``v1_serving`` (exit 3);
- ``status [--json]``: phase, gate counts, certificate, budgets, blockers and the next command.

Exit codes: 0 done; 1 a greenfield/v1-install refusal or an unexpected error; 2 bad input (the
stable code first on the line); 3 preflight or halt-v1 refused (blockers, a changed input under the same
attempt, gates in the wrong state); 4 deferred (an owner could not be read now: run it again).
"""
import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from connectors.serving.gates import EpochVerificationDeferred
from cutover.halt import HaltAborted, cutover_halt_v1
from cutover.preflight import CutoverPlanInvalid, ReadinessRefused, cutover_preflight
from cutover.services import cutover_greenfield
from cutover.status import cutover_status
from cutover.v1_install import cutover_v1_install
from nexusflow.kernel.errors import InvalidIdentity, NexusError
from nexusflow.kernel.scope import OrgScope

EXIT_BAD_INPUT, EXIT_REFUSED, EXIT_DEFERRED = 2, 3, 4


class Command(BaseCommand):
    help = ("Run a cutover procedure: 'greenfield' (a fresh install with no V1 activates V2), 'v1-install' "
            "(a fresh V1 install: every gate v1_serving, served by run_workers --role v1), 'preflight' (certify a "
            "V1 -> V2 attempt against an L2 plan before maintenance), 'halt-v1' (close the V1 maintenance barriers "
            "and halt every gate under that certificate) or 'status' (where the cutover stands).")

    def add_arguments(self, parser):
        parser.add_argument("procedure", choices=["greenfield", "v1-install", "preflight", "halt-v1", "status"])
        parser.add_argument("--org", required=True, help="Org id whose accounts to activate, install or certify.")
        parser.add_argument("--attempt", help="preflight: the service cutover attempt key (a new key per input change).")
        parser.add_argument("--plan", help="preflight: the L2 cutover plan JSON file (docs/operations.md).")
        parser.add_argument("--json", dest="as_json", action="store_true", help="status: print the report as JSON.")

    def handle(self, *args, procedure, org, attempt=None, plan=None, as_json=False, **options):
        scope = OrgScope(org)
        try:
            if procedure == "v1-install":
                report = cutover_v1_install(org=scope)
                self.stdout.write(f"V1 installed for {org}: configuration generation {report.configuration_generation}, "
                                  f"release {report.release[:16]}; accounts: {', '.join(report.accounts)}; "
                                  f"stream cursors: {', '.join(report.cursors) or 'none'}; new rows: {report.created}")
                return
            if procedure == "preflight":
                self._preflight(scope, attempt, plan)
                return
            if procedure == "halt-v1":
                self._halt(scope, attempt)
                return
            if procedure == "status":
                self._status(scope, as_json)
                return
            report = cutover_greenfield(org=scope)
        except (InvalidIdentity, CutoverPlanInvalid) as exc:
            raise CommandError(f"{exc.code}: {exc}", returncode=EXIT_BAD_INPUT) from exc
        except EpochVerificationDeferred as exc:
            raise CommandError(f"{exc.code}: {exc}", returncode=EXIT_DEFERRED) from exc
        except (ReadinessRefused, HaltAborted) as exc:
            lines = [f"  {b['reason_code']}: {b['subject']}: {b['detail']}" for b in exc.blockers]
            tail = "; nothing entered maintenance" if isinstance(exc, ReadinessRefused) else ""
            raise CommandError(f"{exc.code}: {exc}{tail}\n" + "\n".join(lines),
                               returncode=EXIT_REFUSED) from exc
        except NexusError as exc:
            # greenfield and v1-install keep their original exit 1 for a refusal.
            code = EXIT_REFUSED if procedure in ("preflight", "halt-v1") else 1
            raise CommandError(f"{exc.code}: {exc}", returncode=code) from exc
        state = "already active" if report.already_active else "activated"
        self.stdout.write(f"epoch {report.epoch_id} {state} ({report.epoch_digest[:16]}); "
                          f"accounts: {', '.join(report.accounts)}; decision: {report.decision}")

    def _preflight(self, org: OrgScope, attempt: str | None, plan_path: str | None) -> None:
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
        report = cutover_preflight(org=org, attempt_key=attempt, plan=plan)
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
        for phase, b in report["budgets"].items():
            used = "-" if b["used_seconds"] is None else f"{b['used_seconds']}s"
            self.stdout.write(f"  budget {phase}: used {used}, projected {b['projected_seconds']}s "
                              f"of {b['budget_seconds']}s")
        for b in report["blockers"]:
            self.stdout.write(f"blocker {b['reason_code']}: {b['subject']}: {b['detail']}")
        self.stdout.write(f"next: {report['next_command']}")
