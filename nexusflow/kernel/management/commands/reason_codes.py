"""``manage.py reason_codes``: the closed reason codes and their evidence (seed 003 "Operational liveness").

``reason_codes`` lists every code with owner, severity class (``benign``: an
expected, recorded outcome; ``attention``: an operator must look), alert
deadline, remediations and evidence query; ``--class benign|attention`` lists
one class only; ``--format json`` prints the same as JSON;
``reason_codes CODE --org ORG [--limit N]`` runs the code's evidence selector
for one org and prints the total and the first N rows (default 50). Exit
codes: 0 ok, 2 unknown code or class, missing ``--org``, ``--org`` or
``--class`` together with the wrong arguments, or a bad ``--org``/``--limit``.
"""
from __future__ import annotations

import json

from django.core.management.base import CommandError
from django.forms.models import model_to_dict

from nexusflow.kernel.commands import OperatorCommand
from nexusflow.kernel.errors import InvalidIdentity
from nexusflow.kernel.identity import validate_key
from nexusflow.kernel.reasons import REMEDIATIONS, SEVERITY_CLASSES, load_all_reasons


def _row(obj) -> dict:
    if isinstance(obj, dict):
        return obj
    if hasattr(obj, "_meta"):
        data = model_to_dict(obj)
        data["id"] = obj.pk
        return data
    return {"value": obj}


def _positive_int(text: str) -> int:
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


class Command(OperatorCommand):
    help = "List the closed reason codes, or show the evidence rows of one code for one org."

    def add_arguments(self, parser):
        parser.add_argument("code", nargs="?", help="a reason code: print its evidence rows for --org")
        parser.add_argument("--org", help="org id whose evidence to read (required with CODE)")
        parser.add_argument("--limit", type=_positive_int, default=50, help="most evidence rows printed (default 50)")
        parser.add_argument("--format", choices=("text", "json"), default="text")
        parser.add_argument("--class", dest="severity_class", choices=SEVERITY_CLASSES,
                            help="list only the codes of this class (benign: expected outcome; attention: an "
                                 "operator must look)")

    def handle(self, *args, code: str | None, org: str | None, limit: int, format: str,
               severity_class: str | None = None, **options):
        reasons = load_all_reasons()
        if code is None and org:
            raise CommandError("--org reads evidence: give a CODE too (`manage.py reason_codes CODE --org ORG`)",
                               returncode=2)
        if code is not None and severity_class:
            raise CommandError("--class filters the listing: give no CODE (`manage.py reason_codes --class "
                               f"{severity_class}`)", returncode=2)
        if code is None:
            entries = [{"code": r.code, "owner": r.owner, "severity_class": r.severity_class,
                        "alert_after_seconds": r.alert_after_seconds,
                        "remediations": list(r.remediations), "evidence": r.evidence}
                       for r in sorted(reasons.values(), key=lambda r: (r.owner, r.code))
                       if severity_class is None or r.severity_class == severity_class]
            if format == "json":
                self.stdout.write(json.dumps({"reasons": entries,
                                              "remediations": {k: v.description for k, v in REMEDIATIONS.items()}},
                                             indent=2))
                return
            for e in entries:
                alert = f"alert after {e['alert_after_seconds']}s" if e["alert_after_seconds"] else "no alert"
                self.stdout.write(f"{e['code']:36} {e['owner']:15} {e['severity_class']:10} {alert:22} "
                                  f"{', '.join(e['remediations'])}")
                self.stdout.write(f"{'':36} evidence: {e['evidence']}")
            return
        reason = reasons.get(code)
        if reason is None:
            raise CommandError(f"unknown reason code {code!r}; `manage.py reason_codes` lists them", returncode=2)
        if not org:
            raise CommandError("--org is required to read evidence (evidence is always org-scoped)", returncode=2)
        try:
            validate_key(org, field="org")
        except InvalidIdentity as exc:
            raise CommandError(str(exc), returncode=2) from exc
        found = reason.evidence_selector()(org_id=org, reason_code=code)
        total = found.count() if hasattr(found, "count") and not isinstance(found, list) else len(found)
        rows = [_row(r) for r in list(found[:limit])]
        if format == "json":
            self.stdout.write(json.dumps({"code": code, "org": org, "severity_class": reason.severity_class,
                                          "evidence": reason.evidence, "total": total, "rows": rows},
                                         indent=2, default=str))
            return
        shown = f"{total} row(s)" if total == len(rows) else f"{total} row(s), showing the first {len(rows)} (--limit)"
        self.stdout.write(f"{code} ({reason.owner}, {reason.severity_class}); evidence {reason.evidence}; "
                          f"{shown} for {org}")
        for remediation in reason.remediations:
            self.stdout.write(f"  remediation {remediation}: {REMEDIATIONS[remediation].description}")
        for row in rows:
            self.stdout.write("  " + json.dumps(row, default=str, sort_keys=True))
