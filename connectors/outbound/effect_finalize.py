"""Egress step 4, finalize: lock the OutboundCommand intent, then record -> effect; write the mirror and
record the Runtime intent receipt (seed 003 "Transaction and crash rules"; seed 000 owner protection).
"""
from __future__ import annotations

import logging

from django.db import transaction

from connectors import reasons
from connectors.models import (
    RemoteEffect,
    RemoteLink,
)
from connectors.outbound.egress_common import (
    FP_AFTER_FINALIZE,
    FP_FINALIZE_INTENT_LOCKED,
    KNOWN_LANES,
    append_evidence,
    frozen_contract,
)
from connectors.store import (
    RemoteEffectStore,
    RemoteLinkStore,
)
from nexusflow.kernel import failpoints, locks
from nexusflow.kernel.rows import fetch_joined, first_row
from nexusflow.kernel.scope import OrgScope

log = logging.getLogger(__name__)

# --- (4) finalize -------------------------------------------------------------------
def effect_try_finalize_one(*, lanes: tuple[str, ...] = KNOWN_LANES) -> bool:
    """Finalize one ``remote_confirmed`` effect of ``lanes``: mirror writeback + Runtime receipt.

    Seed 002 "After POST" step 3 and "Drift Matrix" rows on the mirror tuple
    and on local deletion. The mirror is written only after the link holds the
    remote id, only to the frozen writeback tuple and only while it equals the
    link's mirror tuple (a changed tuple is ``tuple_changed``: not written);
    it is idempotent and never authority. A source deleted before writeback
    finalizes the effect without any call and suspends the link
    (``source_deleted``): its evidence stays for reconciliation or retire.
    Never calls the provider. An effect of an unknown DispatchLane is never taken.

    Lock order (seed 000, ARCHITECTURE.md section 6): the effect's
    OutboundCommand intent first (``locks.result_commit``), then the source
    record, then the effect, its link and the Runtime receipt.
    """
    from connectors.links.push_rules import append_link_evidence
    from nexusflow.records.metadata import InvalidFieldValue, UnknownField
    from nexusflow.records.models import Record
    from nexusflow.records.services import record_lock, record_write_mirror
    from runtime_outbox.models import IntentResultReceipt
    from runtime_outbox.services import intent_result_record
    from runtime_outbox.store import OutboundCommandStore

    lanes = tuple(lane for lane in lanes if lane in KNOWN_LANES)
    found = fetch_joined(RemoteEffect, ("command",), {"state": "remote_confirmed", "dispatch_lane__in": lanes},
                         order="T0.`id`", limit=1)
    if not found:
        return False
    effect = found[0]
    command = effect.command
    _binding, contract, _profile = frozen_contract(effect)
    writeback = command.frozen_binding.get("writeback") or {
        "source_object": command.source_object, "source_record_id": command.source_record_key,
        "mirror_field": contract.get("mirror_field", "")}
    with transaction.atomic(durable=True):
        mirror = "skipped"
        record = None
        # Seed 000: the result commit locks its intent before the local record projection (the one
        # sanctioned reversal); owner checks read intents NOWAIT, so none waits behind this in reverse.
        with locks.result_commit(lambda: OutboundCommandStore.lock(effect.org_id, command.pk)):
            failpoints.hit(FP_FINALIZE_INTENT_LOCKED)
            try:
                record = record_lock(org=OrgScope(effect.org_id), object_name=writeback["source_object"],
                                     record_key=writeback["source_record_id"])
            except Record.DoesNotExist:
                mirror = "source_deleted"
        effect = RemoteEffectStore.lock(effect.org_id, effect.pk)
        if effect.state != "remote_confirmed":
            return True
        link = first_row(RemoteLink, org_id=effect.org_id, link_key=effect.link_key)
        if link is not None:
            link = RemoteLinkStore.lock(link.org_id, link.pk)
        receipt = first_row(IntentResultReceipt, org_id=effect.org_id, command_id=command.pk)
        if receipt is not None:
            # Runtime already completed this intent: finish Connector's own bookkeeping from that exact
            # receipt (seed 000 lost-response replay), whatever became of the link or the record since.
            _finish_from_receipt(effect, link, receipt)
            return True
        link_tuple = (link.snapshot.get("mirror_tuple") or {}) if link is not None else {}
        if record is not None and writeback["mirror_field"]:
            if link_tuple and link_tuple.get("field") != writeback["mirror_field"]:
                mirror = "tuple_changed"
            else:
                try:
                    record_write_mirror(org=OrgScope(effect.org_id), record=record, field=writeback["mirror_field"],
                                        value=effect.remote_id)
                    mirror = "written"
                except (InvalidFieldValue, UnknownField):
                    mirror = "conflict"
        if link is not None:
            version = link.version
            if mirror == "source_deleted" and link.state == "active":
                append_link_evidence(link, kind="source_deleted", actor="egress", to_state="suspended_drift",
                                     detail={"effect": int(effect.pk), "remote_id": effect.remote_id})
                version = RemoteLinkStore.transition(org_id=link.org_id, pk=link.pk, src="active",
                                                     dst="suspended_drift", version=version,
                                                     set_fields={"reason_code": reasons.SOURCE_DELETED})
                link.state = "suspended_drift"
            RemoteLinkStore.touch(org_id=link.org_id, pk=link.pk, state=link.state, version=version,
                                  set_fields={"mirror_status": mirror})
        RemoteEffectStore.transition(org_id=effect.org_id, pk=effect.pk, src="remote_confirmed", dst="finalized",
                                     version=effect.version)
        intent_result_record(command=command, outcome="finalized", remote_id=effect.remote_id,
                             evidence={"mirror": mirror})
    failpoints.hit(FP_AFTER_FINALIZE)
    return True


def _finish_from_receipt(effect: RemoteEffect, link: RemoteLink | None, receipt) -> None:
    """Close a ``remote_confirmed`` effect whose intent Runtime already completed, from that receipt only.

    Seed 000: after Runtime completion, Integration finishes its private
    bookkeeping using that exact acknowledgement even if the old link has
    since been retired or deleted. Nothing is projected onto the record, no
    second receipt is written and the Flow is not woken again; an evidence
    row names the receipt used (its outcome and remote id, so an operator
    sees any disagreement). Called with the effect (and link, if any) locked.
    """
    append_evidence(effect, kind="finalized_from_receipt", actor="egress", to_state="finalized",
                    detail={"receipt": int(receipt.pk), "outcome": receipt.outcome,
                            "receipt_remote_id": receipt.remote_id, "remote_id": effect.remote_id,
                            "link_state": link.state if link is not None else None})
    mirror = (receipt.evidence or {}).get("mirror")
    if link is not None and link.state != "retired" and mirror and link.mirror_status != mirror:
        RemoteLinkStore.touch(org_id=link.org_id, pk=link.pk, state=link.state, version=link.version,
                              set_fields={"mirror_status": mirror})
    RemoteEffectStore.transition(org_id=effect.org_id, pk=effect.pk, src="remote_confirmed", dst="finalized",
                                 version=effect.version)
