"""``manage.py records access <verb>``: author and read access policies (see ``records.py`` for usage and exit codes)."""
from __future__ import annotations

import json

from django.core.management.base import CommandError

from nexusflow.kernel.command_input import json_document_argument
from nexusflow.kernel.errors import InvalidIdentity
from nexusflow.kernel.identity import validate_key


def _bad(exc) -> CommandError:
    return CommandError(f"{exc.code}: {exc}", returncode=2)


def _key(value: str, field: str, max_length: int = 64) -> str:
    try:
        return validate_key(value, field=field, max_length=max_length)
    except InvalidIdentity as exc:
        raise _bad(exc) from None


def handle_access(command, *, access_command: str, **options) -> None:
    """Run one ``records access`` verb; raises ``CommandError`` with the exit code of the module docstring."""
    org_id = _key(options["org"], "org")
    if access_command == "publish":
        _publish(command, org_id, **options)
    elif access_command == "show":
        _show(command, org_id, as_json=options["json"])
    elif access_command == "check":
        _check(command, org_id, **options)
    elif access_command == "draft":
        _draft(command, org_id)
    else:
        _share(command, org_id, **options)


def _publish(command, org_id: str, *, file: str, actor: str, reason: str, **_options) -> None:
    from nexusflow.records.access import AccessPolicyInvalid
    from nexusflow.records.access_services import access_policy_publish

    document = json_document_argument(file, invalid_code="access_policy_invalid")
    try:
        row, created = access_policy_publish(org_id=org_id, document=document, authored_by=actor, reason=reason)
    except AccessPolicyInvalid as exc:
        raise _bad(exc) from None
    command.stdout.write(json.dumps({"org": row.org_id, "generation": row.generation, "digest": row.digest,
                                     "created": created}))


def access_report(org_id: str) -> dict:
    """The support view of an org's access policy: the generation in force (``None``: unrestricted) and the chain."""
    from nexusflow.records.models import AccessPolicyGeneration

    chain = list(AccessPolicyGeneration.objects.filter(org_id=org_id).order_by("generation"))
    latest = chain[-1] if chain else None
    return {
        "org": org_id,
        "generation": latest.generation if latest else None,
        "digest": latest.digest if latest else None,
        "document": latest.document if latest else None,
        "generations": [{"generation": g.generation, "digest": g.digest, "authored_by": g.authored_by,
                         "reason": g.reason, "created_at": g.created_at.isoformat()} for g in chain],
    }


def _show(command, org_id: str, *, as_json: bool) -> None:
    report = access_report(org_id)
    out = command.stdout.write
    if as_json:
        out(json.dumps(report, indent=2, sort_keys=True))
        return
    if report["generation"] is None:
        out(f"org {org_id}: no access policy (unrestricted)")
        return
    doc = report["document"]
    out(f"org {org_id}: access policy generation {report['generation']} digest {report['digest']}")
    out(f"  integration user: {doc['integration_user'] or '-'}")
    for account_key, user_id in sorted((doc.get("integration_users") or {}).items()):
        out(f"  integration user of account {account_key}: {user_id}")
    for user in doc["users"]:
        out(f"  user {user['id']} {'active' if user['active'] else 'INACTIVE'} {user['email']} "
            f"sets {', '.join(user['permission_sets']) or '-'}")
    for name, body in sorted(doc["permission_sets"].items()):
        out(f"  permission set {name}: objects {json.dumps(body['objects'], sort_keys=True)} "
            f"fields {json.dumps(body['fields'], sort_keys=True)} view_all {body['view_all']} "
            f"modify_all {body['modify_all']}")
    for name, model in sorted(doc["sharing"].items()):
        out(f"  sharing {name}: {model}")
    for g in report["generations"]:
        out(f"  generation {g['generation']} by {g['authored_by']} at {g['created_at']}: {g['reason']}")


def _check(command, org_id: str, *, user: str, object_name: str, record_key: str | None, op: str,
           fields: str | None, **_options) -> None:
    from nexusflow.records.access import FIELD_OPS, OBJECT_OPS, field_access, object_access
    from nexusflow.records.selectors import access_principal, record_access_check
    from nexusflow.records.services import RecordNotFound

    user = _key(user, "user")
    object_name = _key(object_name, "object", max_length=80)
    allowed_ops = FIELD_OPS if fields else OBJECT_OPS
    if op not in allowed_ops:
        raise CommandError(f"invalid_operation: --op {op!r} is not one of {', '.join(allowed_ops)}", returncode=2)
    if fields:
        names = [_key(name.strip(), "field", max_length=80) for name in fields.split(",") if name.strip()]
        decision = field_access(access_principal(org_id=org_id, user_id=user), object_name, names, op)
        body = {"allowed": not decision.denied, "allowed_fields": list(decision.allowed),
                "denied_fields": list(decision.denied)}
    elif record_key is not None:
        try:
            decision = record_access_check(org_id=org_id, user_id=user, object_name=object_name,
                                           record_key=_key(record_key, "record_key"), op=op)
        except RecordNotFound as exc:
            raise CommandError(f"{exc.code}: {exc}", returncode=1) from None
        body = {"allowed": decision.allowed, "record": record_key}
    else:
        decision = object_access(access_principal(org_id=org_id, user_id=user), object_name, op)
        body = {"allowed": decision.allowed}
    command.stdout.write(json.dumps({"org": org_id, "user": user, "object": object_name, "op": op, **body,
                                     "basis": decision.basis, "context_digest": decision.context_digest},
                                    sort_keys=True))
    if not body["allowed"]:
        raise CommandError(f"access_denied: {user} may not {op} {object_name} ({decision.basis})", returncode=1)


def _share(command, org_id: str, *, object_name: str, record_key: str, user: str, access: str, actor: str,
           reason: str, **_options) -> None:
    from nexusflow.records.access import AccessPolicyInvalid
    from nexusflow.records.access_services import record_share_set
    from nexusflow.records.services import RecordNotFound

    try:
        row, created = record_share_set(org_id=org_id, object_name=object_name, record_key=record_key, user_id=user,
                                        access=access, authored_by=actor, reason=reason)
    except AccessPolicyInvalid as exc:
        raise _bad(exc) from None
    except RecordNotFound as exc:
        raise CommandError(f"{exc.code}: {exc}", returncode=1) from None
    command.stdout.write(json.dumps({"org": org_id, "record": f"{object_name}/{record_key}", "user": user,
                                     "access": access, "sequence": row.sequence if row else None,
                                     "created": created}))


def _draft(command, org_id: str) -> None:
    from nexusflow.records.access import access_document_from_view
    from nexusflow.records.authority import AUTOMATED_PROCESS_USER
    from nexusflow.records.metadata import current_view
    from nexusflow.records.selectors import access_policy

    policy = access_policy(org_id=org_id)
    document = (dict(policy.document) if policy is not None
                else access_document_from_view(current_view(), system_users=[AUTOMATED_PROCESS_USER]))
    command.stdout.write(json.dumps(document, indent=2, sort_keys=True))
