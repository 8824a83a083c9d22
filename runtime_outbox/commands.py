"""Application command handlers (Runtime behaviour for admitted Connector executions).

A handler runs inside the Runtime application transaction and returns
``(outcome, result)`` where ``outcome`` is one of ``applied``, ``noop`` or
``rejected``. Handlers are generic: the pack's route ``application`` block
names the handler and parametrizes it.
"""
from __future__ import annotations

from collections.abc import Callable

from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.scope import OrgScope
from nexusflow.records.access import AccessDenied, acting_as
from nexusflow.records.edits import require_create, require_record_access, require_update
from nexusflow.records.metadata import InvalidFieldValue, UnknownField, UnknownObject
from nexusflow.records.selectors import access_integration_user
from nexusflow.records.services import record_create, record_delete, record_lock_owner, record_update

from .ports import inbound_link_create, inbound_link_find

Handler = Callable[[OrgScope, dict], tuple[str, dict]]
HANDLERS: dict[str, Handler] = {}


class UnknownCommand(NexusError):
    code = "unknown_application_command"


def handler(name: str):
    def register(fn: Handler) -> Handler:
        HANDLERS[name] = fn
        return fn
    return register


@handler("record_upsert_via_link")
def record_upsert_via_link(org: OrgScope, command: dict) -> tuple[str, dict]:
    """Upsert the local record that the inbound RemoteLink names for the source locator.

    The link (owner pack, destination slot, provider account, remote id) is
    the only way from a provider object to a local record; a missing link
    creates the record and its link in this same transaction.

    Application block keys: ``object``, ``destination_slot_id``, ``field_map``
    (provider field -> local field); ``property_field`` / ``value_field`` (one
    changed property per event) and/or ``values_field`` (an object of changed
    values per event); ``noop_kinds`` (canonical kinds recorded as ``noop``);
    ``delete_kinds`` (canonical kinds that delete the linked record, see
    :func:`_delete_via_link`). An upsert of a linked record that is deleted
    is a ``noop`` (``record_deleted``): a removal is final.
    """
    app = command["application"]
    object_name = app["object"]
    if command["canonical_kind"] in app.get("delete_kinds", ()):
        return _delete_via_link(org, command, app)
    if command["canonical_kind"] in app.get("noop_kinds", ()):
        # The route declares kinds this handler records but does not apply (e.g. removals).
        return "noop", {"reason": "kind_not_applied", "kind": command["canonical_kind"]}
    changes: dict[str, str] = {}
    if command["canonical_kind"] == "record.field_changed":
        payload = command["payload"]
        target = app["field_map"].get(payload.get(app["property_field"]))
        if target is None:
            return "noop", {"reason": "property_not_mapped", "property": payload.get(app["property_field"])}
        changes[target] = payload.get(app["value_field"])
    values = command["payload"].get(app.get("values_field", ""))
    if isinstance(values, dict):
        # A change envelope carries several field values at once (route "values_field").
        changes.update({app["field_map"][name]: value for name, value in values.items() if name in app["field_map"]})
    link = _link_of(org, command, app)
    principal = _integration_principal(org, command)
    try:
        if link is None:
            # Inbound application runs as the account's declared integration user: it owns what it creates.
            if principal is not None:
                require_create(principal, object_name, changes)
            with acting_as(principal.user_id if principal is not None else None):
                record = record_create(org=org, object_name=object_name, values=changes,
                                       owner_id=access_integration_user(org_id=org.org_id,
                                                                        account_key=command["account_key"]))
            inbound_link_create(org_id=org.org_id, owner_key=command["owner_key"], route_key=command["route_key"],
                                destination_slot_id=app["destination_slot_id"], source_object=object_name,
                                source_record_key=record.record_key, remote_scope=command.get("remote_scope") or command["account_key"],
                                remote_id=command["source_locator"])
            return "applied", {"record_key": record.record_key, "created": True, "changed": sorted(changes)}
        # The link names the local record, of whichever object (a record pushed from another object
        # that maps to the same destination slot, e.g. one converted since).
        record = record_lock_owner(org=org, object_name=link.source_object, record_key=link.source_record_key)
        if record.is_deleted:  # deleted here or by an earlier removal of the provider's record
            return "noop", {"record_key": record.record_key, "reason": "record_deleted"}
        if principal is not None:
            require_update(principal, record, changes)
        with acting_as(principal.user_id if principal is not None else None):
            change = record_update(org=org, record=record, changes=changes)
    except (UnknownObject, UnknownField, InvalidFieldValue, AccessDenied) as exc:
        return "rejected", {"reason": exc.code, "detail": str(exc)}
    if not change.changed_fields:
        return "noop", {"record_key": record.record_key, "reason": "no_change"}
    return "applied", {"record_key": record.record_key, "created": False, "changed": sorted(change.changed_fields)}


def _integration_principal(org: OrgScope, command: dict):
    """The access-policy principal inbound application of the command's account runs as (``None``: no policy).

    The policy's ``integration_users[account]``, else its ``integration_user``; a policy that declares
    neither lets inbound application do nothing (seed 004 section 17: the integration user decides).
    """
    from nexusflow.records.selectors import access_policy

    policy = access_policy(org_id=org.org_id)
    if policy is None:
        return None
    return policy.principal(policy.integration_user(command["account_key"]) or "integration:undeclared")


def _link_of(org: OrgScope, command: dict, app: dict):
    """The inbound link naming the local record of the command's provider object, or ``None``."""
    return inbound_link_find(org_id=org.org_id, owner_key=command["owner_key"],
                             destination_slot_id=app["destination_slot_id"],
                             remote_scope=command.get("remote_scope") or command["account_key"],
                             remote_id=command["source_locator"])


def _delete_via_link(org: OrgScope, command: dict, app: dict) -> tuple[str, dict]:
    """Apply the provider's removal of a linked record: the local record goes through the record deletion
    lifecycle (seed 000 before-delete hooks, so delete-triggered Flows run as for a local delete).

    ``noop`` when no link names the provider's record (``record_not_linked``) or the record is deleted
    already (``record_deleted``). A hook's retryable refusal (owner work pending) raises, so the whole
    application transaction rolls back and the execution retries.
    """
    link = _link_of(org, command, app)
    if link is None:
        return "noop", {"reason": "record_not_linked"}
    record = record_lock_owner(org=org, object_name=link.source_object, record_key=link.source_record_key)
    if record.is_deleted:
        return "noop", {"record_key": record.record_key, "reason": "record_deleted"}
    principal = _integration_principal(org, command)
    if principal is not None:
        try:
            require_record_access(principal, record, "delete")
        except AccessDenied as exc:
            return "rejected", {"reason": exc.code, "detail": str(exc)}
    record_delete(org=org, record=record)
    return "applied", {"record_key": record.record_key, "deleted": True}


def run(org: OrgScope, command: dict) -> tuple[str, dict]:
    """Run one application command; a command with ``events`` applies each event in order.

    A windowed Execution (seed 003 "Inbound facts", ProjectionWindow) carries
    its members' facts in SourcePosition order; they apply in this one
    transaction. The outcome is ``applied`` if any member applied, else
    ``rejected`` if any was rejected, else ``noop``.
    """
    name = command.get("application", {}).get("command")
    fn = HANDLERS.get(name)
    if fn is None:
        raise UnknownCommand(f"no application command {name!r}")
    members = command.get("events")
    if members is None:
        return fn(org, command)
    base = {k: v for k, v in command.items() if k != "events"}
    outcomes, results = [], []
    for member in members:
        outcome, result = fn(org, {**base, **member})
        outcomes.append(outcome)
        results.append({"source_event_key": member["source_event_key"], "outcome": outcome, "result": result})
    overall = "applied" if "applied" in outcomes else "rejected" if "rejected" in outcomes else "noop"
    return overall, {"members": results}
