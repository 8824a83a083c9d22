"""Association contracts of a push: the frozen source-id vector and its resolution (seed 002).

Seed 002 "Attempt Key" (the position-aligned association source-id
snapshot), "Deferred Association Dispatch Lane" and "Retry And Recovery
Semantics" 1; ARCHITECTURE.md section 4 (``DispatchLane`` is
``RemoteEffect.dispatch_lane``).

A push contract may list ``associations`` (validated at pack publication by
:func:`connectors.contracts.pack_document.validate_associations`): each entry names a
``source_field`` of the source object holding the record key of a target
record, the ``target_contract`` that pushes that target, a ``mode`` and a
``template`` with the ``{remote_id}`` placeholder.

- :func:`association_freeze` runs on the request thread while the intent is
  authored: it freezes the vector of save-time source ids (``""`` for a
  blank entry), fails admission for an ``update_only`` target that is not
  linked, and picks the ``deferred_association`` lane for a create candidate
  whose ``create_inline`` target is not linked yet. It never calls out.
- :func:`association_resolve` runs in the grant transaction of a create: it
  resolves every target link from the frozen vector (never from the current
  lookup field) and returns the rendered entries, or says why the create
  must wait or fail closed.

L0 only: contract keys, objects, field names and templates come from pack
and metadata data.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

from connectors.links.link_keys import PUSH_ACTION_TYPE, effect_remote_scope, link_key_for
from connectors.models import RemoteEffect, RemoteLink
from nexusflow.kernel.errors import InvalidIdentity
from nexusflow.kernel.identity import validate_key
from nexusflow.kernel.rows import first_row

#: The lane of every push except a create waiting for a ``create_inline`` target (seed 002, schema default).
CONFIGURED = "configured"
#: Seed 002's narrow lane: a create candidate whose ``create_inline`` target was not linked at save time.
DEFERRED = "deferred_association"

#: :class:`Resolution` verdicts.
READY, WAIT, SNAPSHOT_MISSING, UNRESOLVED = "ready", "wait", "snapshot_missing", "unresolved"


def association_source_fields(contract: dict) -> list[str]:
    """Every source field the contract's associations read (part of the #1781 authority scope), sorted."""
    return sorted({entry["source_field"] for entry in contract.get("associations", [])})


def _target_contract(pack_document: dict, contract_key: str) -> dict | None:
    return next((c for c in pack_document.get("push_contracts", []) if c["contract_key"] == contract_key), None)


def target_link_key(*, owner_key: str, target: dict, source_record_key: str) -> str:
    """The ``link_key`` of ``target`` (a push contract) for the target record ``source_record_key`` (64 hex)."""
    return link_key_for(owner_key=owner_key, action_slot_id=target["action_slot_id"], action_type=PUSH_ACTION_TYPE,
                        source_object=target["source_object"], source_record_key=source_record_key,
                        destination_slot_id=target["destination_slot_id"])


def _target_record_exists(org_id: str, object_name: str, record_key: str) -> bool:
    from nexusflow.records.models import Record

    return Record.objects.filter(org_id=org_id, object_name=object_name, record_key=record_key,
                                 is_deleted=False).exists()


def association_freeze(*, org_id: str, pack, account: dict, contract: dict, record, link_key: str,
                       error) -> tuple[list[str], str]:
    """Freeze the association source-id vector of one intent and choose its DispatchLane.

    Runs in the application transaction, after the #1781 decision covered
    :func:`association_source_fields`; reads (never locks) the target records
    and links; performs no remote I/O.

    Args:
        org_id: the trusted org.
        pack: the serving PackGeneration (``owner_key``, ``document``).
        account: the serving account document (its ``push_contracts``).
        contract: the push contract being authored.
        record: the locked source record (``object_name``, ``record_key``, ``fields``).
        link_key: the intent's own link key.
        error: the exception class to raise (called as ``error(message, code=...)``).

    Returns:
        ``(vector, lane)``: one save-time source record key per association,
        position-aligned with ``contract["associations"]`` (``""`` when the
        source field is blank), and ``"deferred_association"`` when the intent
        is a create candidate (no RemoteLink for ``link_key``) and a
        ``create_inline`` target has no active link, else ``"configured"``.

    Raises:
        error: ``association_source_invalid`` (the source field is no lookup
            of the target's object, or its value is no canonical key),
            ``association_target_unserved`` (the account does not offer the
            target contract), ``association_target_missing`` (no live target
            record), ``association_target_not_linked`` (an ``update_only``
            target without an active link, even when a ``create_inline``
            target is also pending).

    Seed 002, "Deferred Association Dispatch Lane" and "Attempt Key".
    """
    from nexusflow.records.metadata import current_view

    entries = contract.get("associations", [])
    if not entries:
        return [], CONFIGURED
    definition = current_view().object(record.object_name)
    vector: list[str] = []
    pending: list[int] = []
    for position, entry in enumerate(entries):
        value = record.fields.get(entry["source_field"]) or ""
        vector.append(value)
        if value == "":
            continue
        where = f"contract {contract['contract_key']} association {position}"
        target = _target_contract(pack.document, entry["target_contract"])
        if target is None or target["contract_key"] not in account.get("push_contracts", []):
            raise error(f"{where}: the account does not offer {entry['target_contract']!r}",
                        code="association_target_unserved")
        field = definition.fields.get(entry["source_field"])
        if field is None or field.references not in (None, target["source_object"]):
            raise error(f"{where}: {record.object_name}.{entry['source_field']} does not reference the target's "
                        f"object", code="association_source_invalid")
        try:
            validate_key(value, field=f"{record.object_name}.{entry['source_field']}")
        except InvalidIdentity as exc:
            raise error(f"{where}: {exc}", code="association_source_invalid") from None
        if not _target_record_exists(org_id, target["source_object"], value):
            raise error(f"{where}: no live target record {value}", code="association_target_missing")
        link = RemoteLink.objects.filter(org_id=org_id, link_key=target_link_key(
            owner_key=pack.owner_key, target=target, source_record_key=value)).first()
        if link is not None and link.state == "active":
            continue
        if entry["mode"] == "update_only":
            raise error(f"{where}: the update_only target {value} has no finalized link",
                        code="association_target_not_linked")
        pending.append(position)
    create_candidate = not RemoteLink.objects.filter(org_id=org_id, link_key=link_key).exists()
    return vector, (DEFERRED if create_candidate and pending else CONFIGURED)


def _render(template, remote_id: str):
    """``template`` with every ``{remote_id}`` placeholder in its strings replaced by ``remote_id``."""
    if isinstance(template, str):
        return template.replace("{remote_id}", remote_id)
    if isinstance(template, dict):
        return {key: _render(value, remote_id) for key, value in template.items()}
    if isinstance(template, list):
        return [_render(value, remote_id) for value in template]
    return copy.deepcopy(template)


@dataclass(frozen=True)
class Resolution:
    """How a create's associations resolved at grant.

    ``verdict``: ``ready`` (``entries`` are the rendered templates, in
    contract order, blanks and skipped entries left out), ``wait`` (a
    ``create_inline`` target is not linked yet), ``snapshot_missing`` (a
    ``deferred_association`` effect without the full vector) or
    ``unresolved`` (a target that can never resolve: its record is deleted,
    its link is retired, suspended or of another remote scope).
    ``live_lookup`` says the historical live-lookup exception was used.
    """

    verdict: str
    entries: tuple = ()
    detail: dict | None = None
    live_lookup: bool = False


def association_resolve(*, effect, binding: dict, pack_document: dict, contract: dict) -> Resolution:
    """Resolve the associations of a create from its frozen source-id vector (read-only).

    Args:
        effect: the locked RemoteEffect (``org_id``, ``account_key``,
            ``dispatch_lane``, ``command``).
        binding: its FrozenDispatchBinding (``associations``: the vector).
        pack_document / contract: the frozen pack generation's document and
            the effect's push contract in it.

    Targets are resolved from the frozen save-time source record ids, never
    from the current lookup field. Compatibility exception (seed 002
    "Deferred Association Dispatch Lane"): a ``configured`` effect authored
    before the vector existed (empty vector) reads the current lookup fields
    once here, waits only for ``create_inline`` targets and leaves out an
    unready ``update_only`` target; a ``deferred_association`` effect (or any
    effect whose vector is not contract-aligned) fails closed instead.

    Seed 002, "Deferred Association Dispatch Lane", "Retry And Recovery Semantics" 1.
    """
    entries = contract.get("associations", [])
    if not entries:
        return Resolution(READY)
    vector = list(binding.get("associations") or [])
    live = False
    if len(vector) != len(entries):
        if vector or effect.dispatch_lane != CONFIGURED:
            return Resolution(SNAPSHOT_MISSING, detail={"expected": len(entries), "frozen": len(vector),
                                                        "lane": effect.dispatch_lane})
        vector, live = _live_vector(effect, entries), True
    owner_key = binding["pack_generation"]["owner_key"]
    rendered = []
    for position, (entry, source_id) in enumerate(zip(entries, vector, strict=True)):
        if not source_id:
            continue
        verdict, found = _target(effect, pack_document, owner_key, entry["target_contract"], source_id)
        if verdict != READY and live and entry["mode"] != "create_inline":
            continue  # historical recovery: an unready update_only target cannot hold the create
        detail = {"position": position, "target_contract": entry["target_contract"], "source_record_id": source_id,
                  **found}
        if verdict != READY:
            return Resolution(verdict, detail=detail, live_lookup=live)
        rendered.append(_render(entry["template"], found["remote_id"]))
    return Resolution(READY, tuple(rendered), live_lookup=live)


def _live_vector(effect, entries: list[dict]) -> list[str]:
    from nexusflow.records.models import Record

    record = first_row(Record, org_id=effect.org_id, object_name=effect.command.source_object,
                       record_key=effect.command.source_record_key, is_deleted=False)
    fields = record.fields if record is not None else {}
    return [fields.get(entry["source_field"]) or "" for entry in entries]


def _target(effect, pack_document: dict, owner_key: str, contract_key: str, source_id: str) -> tuple[str, dict]:
    """``(verdict, facts)`` of one association target: ``ready`` with its ``remote_id``, ``wait`` or ``unresolved``."""
    target = _target_contract(pack_document, contract_key)
    if target is None:
        return UNRESOLVED, {"why": "target_contract_unknown"}
    if not _target_record_exists(effect.org_id, target["source_object"], source_id):
        return UNRESOLVED, {"why": "target_record_deleted"}
    key = target_link_key(owner_key=owner_key, target=target, source_record_key=source_id)
    link = first_row(RemoteLink, org_id=effect.org_id, link_key=key)
    if link is None:
        # The target's own create ended without a link and nobody superseded it: waiting cannot end.
        failed = RemoteEffect.objects.filter(org_id=effect.org_id, create_slot=key,
                                             state__in=("no_effect", "quarantined")).first()
        if failed is not None:
            return UNRESOLVED, {"why": "target_create_failed", "effect": int(failed.pk)}
        return WAIT, {"why": "target_not_linked"}
    if link.state != "active" or link.remote_scope != effect_remote_scope(effect):
        return UNRESOLVED, {"why": f"target_link_{link.state}" if link.state != "active" else "target_link_scope",
                            "link": int(link.pk)}
    return READY, {"remote_id": link.remote_id, "link": int(link.pk)}
