"""V1 push links adopted only where provable, at ``cutover certify`` (issue 21 item 5).

Seed 002 "Migration Contract For #1783": a V1 record's remote-id mirror field and provenance marker
(:mod:`connectors.v1.provenance`) become a V2 :class:`~connectors.models.RemoteLink` only when they prove
one ``link_key`` and one remote id unambiguously. Every other case fails closed with a reason code and no
link; the V2 create gate then refuses to POST for such a record (``legacy_remote_id_unlinked``), so an
ambiguous record is never guessed and never created again. The operator path is ``push_links adopt``
(bind a proven remote id) or ``push_links rebind`` / ``retire`` on a link that exists.

For each push contract a certified account offers (the candidate epoch's accounts), each live record of
its source object with a value in the contract's ``mirror_field``, ``provenance_field`` or
``legacy_mirror_fields``:

====================================  ===========================================================
case                                  outcome
====================================  ===========================================================
one remote id in ``mirror_field``,    adopted: an ``active`` RemoteLink of the contract's link key,
a marker naming this owner, action    its action-config snapshot from the certified epoch's account
slot and destination, and that id     (so the first V2 PATCH validates it like any finalized link)
two or more distinct remote ids over  ``v1_link_multiple_candidates``
the current and legacy fields
a marker but no remote id             ``v1_link_provenance_without_remote_id``
the remote id only in a legacy field  ``v1_link_remote_id_outside_field_pair``
a remote id with no (valid) marker    ``v1_link_provenance_missing``
a marker of another owner or action   ``v1_link_action_slot_unmapped``
a marker of another destination slot  ``v1_link_destination_drift``
or route (base URL, method, path,
target object)
a marker of another remote id         ``v1_link_provenance_mismatch``
a link of the key with another remote ``v1_link_conflict``; a remote id another link of the same
id                                    slot holds: ``v1_link_remote_id_claimed``
====================================  ===========================================================

The plan is computed under the certify transaction's gate locks, the links are created in the same
transaction as the V1ShutdownCertificate, and the certificate document carries the result (byte-stable:
sorted, digests only, no remote id in clear). After cutover the mirror fields are compatibility mirrors.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from django.db import transaction

from connectors.links.link_keys import PUSH_ACTION_TYPE, account_remote_scope, link_key_for
from connectors.links.push_rules import action_config_snapshot
from connectors.models import PackGeneration, RemoteLink, ServingEpoch
from connectors.store import RemoteLinkStore
from connectors.v1.provenance import destination_digest, parse_marker, remote_id_digest
from nexusflow.kernel import canonical_json
from nexusflow.kernel.digests import digest_v2
from nexusflow.kernel.scope import OrgScope
from nexusflow.records.models import Record

from . import reasons


@dataclass
class AdoptionPlan:
    """``adopt``: RemoteLink values to create; ``refused``: ``[{"contract", "record", "reason_code", "detail"}]``."""

    adopt: list[dict] = field(default_factory=list)
    refused: list[dict] = field(default_factory=list)
    already: list[dict] = field(default_factory=list)

    def document(self) -> dict:
        """The certificate's ``link_adoption`` section (sorted; remote ids only as digests)."""
        adopted = sorted([v["snapshot"]["contract_key"], v["source_record_key"], v["link_key"],
                          remote_id_digest(v["remote_id"])] for v in self.adopt + self.already)
        refused = sorted([r["contract"], r["record"], r["reason_code"]] for r in self.refused)
        return {"adopted": adopted, "refused": refused,
                "digest": digest_v2("cutover.link-adoption", [("adopted", canonical_json.dumps(adopted)),
                                                              ("refused", canonical_json.dumps(refused))]).hexdigest}


def _refuse(plan: AdoptionPlan, contract: dict, record: Record, code: str, detail: str) -> None:
    plan.refused.append({"contract": contract["contract_key"], "record": record.record_key, "reason_code": code,
                         "detail": detail})


def _contracts(org: OrgScope, epoch: ServingEpoch):
    for account in epoch.document["accounts"]:
        if not account.get("push_contracts"):
            continue
        pack = PackGeneration.objects.get(pk=account["pack_generation"]["id"])
        for contract in pack.document.get("push_contracts", []):
            if contract["contract_key"] in account["push_contracts"]:
                profile = next(p for p in pack.document.get("callout_profiles", [])
                               if p["profile_key"] == contract["callout_profile"])
                yield pack, account, contract, profile


def adoption_plan(*, org: OrgScope, epoch: ServingEpoch) -> AdoptionPlan:
    """Classify every V1 record with a remote-id mirror or a provenance marker (see the module table).

    Args:
        epoch: the certified candidate ServingEpoch (its accounts are the V2 destinations).

    Returns:
        :class:`AdoptionPlan`; nothing is written.
    """
    plan = AdoptionPlan()
    for pack, account, contract, profile in _contracts(org, epoch):
        current = contract.get("mirror_field") or ""
        provenance = contract.get("provenance_field") or ""
        legacy = [f for f in contract.get("legacy_mirror_fields", []) if f and f != current]
        fields = [f for f in [current, provenance, *legacy] if f]
        if not current or not fields:
            continue
        destination = destination_digest(base_url=account["base_url"], contract=contract)
        scope = account_remote_scope(account)
        records = Record.objects.filter(org_id=org.org_id, object_name=contract["source_object"], is_deleted=False)
        for record in records.order_by("record_key"):
            mirrors = record.mirrors or {}
            held = {f: mirrors[f] for f in [current, *legacy] if isinstance(mirrors.get(f), str) and mirrors[f]}
            marker_text = mirrors.get(provenance) if provenance else None
            if not held and not marker_text:
                continue
            if len(set(held.values())) > 1:
                _refuse(plan, contract, record, reasons.V1_LINK_MULTIPLE_CANDIDATES,
                        f"{len(set(held.values()))} remote ids over {', '.join(sorted(held))}")
                continue
            if not held:
                _refuse(plan, contract, record, reasons.V1_LINK_PROVENANCE_WITHOUT_REMOTE_ID,
                        f"{provenance} is set and no remote-id field holds an id")
                continue
            if current not in held:
                _refuse(plan, contract, record, reasons.V1_LINK_REMOTE_ID_OUTSIDE_FIELD_PAIR,
                        f"the remote id is only in {', '.join(sorted(held))}, not in {current}")
                continue
            remote_id = held[current]
            marker = parse_marker(marker_text)
            if marker is None:
                _refuse(plan, contract, record, reasons.V1_LINK_PROVENANCE_MISSING,
                        f"{current} holds a remote id and {provenance or 'no provenance field'} proves no V1 push")
                continue
            if (marker["owner_key"], marker["action_slot_id"]) != (pack.owner_key, contract["action_slot_id"]):
                _refuse(plan, contract, record, reasons.V1_LINK_ACTION_SLOT_UNMAPPED,
                        "the marker names another owner or action slot than the contract's")
                continue
            if (marker["destination_slot_id"], marker["destination"]) != (contract["destination_slot_id"],
                                                                          destination):
                _refuse(plan, contract, record, reasons.V1_LINK_DESTINATION_DRIFT,
                        "the marker names another destination slot or route than the certified account's")
                continue
            if marker["remote_id_digest"] != remote_id_digest(remote_id):
                _refuse(plan, contract, record, reasons.V1_LINK_PROVENANCE_MISMATCH,
                        f"the marker proves a push of another remote id than {current} holds")
                continue
            link_key = link_key_for(owner_key=pack.owner_key, action_slot_id=contract["action_slot_id"],
                                    action_type=PUSH_ACTION_TYPE, source_object=contract["source_object"],
                                    source_record_key=record.record_key,
                                    destination_slot_id=contract["destination_slot_id"])
            existing = RemoteLink.objects.filter(org_id=org.org_id, link_key=link_key).first()
            snapshot = dict(action_config_snapshot(pack=pack, contract=contract, profile=profile, account=account))
            snapshot["mirror_tuple"] = {"source_object": contract["source_object"], "field": current}
            snapshot["contract_key"] = contract["contract_key"]
            snapshot["adopted_from"] = "v1"
            values = {"org_id": org.org_id, "link_key": link_key, "owner_key": pack.owner_key,
                      "action_slot_id": contract["action_slot_id"], "action_type": PUSH_ACTION_TYPE,
                      "destination_slot_id": contract["destination_slot_id"],
                      "source_object": contract["source_object"], "source_record_key": record.record_key,
                      "remote_scope": scope, "remote_id": remote_id, "live_remote_id": remote_id,
                      "state": "active", "snapshot": snapshot, "created_install_id": snapshot["install_id"],
                      "last_validated_install_id": snapshot["install_id"],
                      "mapping_fingerprint": snapshot["mapping_fingerprint"],
                      "body_fingerprint": snapshot["body_fingerprint"], "mirror_status": "written"}
            if existing is not None:
                if existing.remote_id == remote_id and existing.state != "retired":
                    plan.already.append(values)
                else:
                    _refuse(plan, contract, record, reasons.V1_LINK_CONFLICT,
                            f"link {existing.pk} of the key is {existing.state} with another remote id")
                continue
            claimed = RemoteLink.objects.filter(org_id=org.org_id, owner_key=pack.owner_key,
                                                destination_slot_id=contract["destination_slot_id"],
                                                remote_scope=scope, live_remote_id=remote_id).exists()
            if claimed:
                _refuse(plan, contract, record, reasons.V1_LINK_REMOTE_ID_CLAIMED,
                        "another link of the same destination already holds this remote id")
                continue
            plan.adopt.append(values)
    by_remote: dict[tuple, list[dict]] = {}  # two records claiming one remote id: neither is adopted
    for values in plan.adopt:
        by_remote.setdefault((values["owner_key"], values["destination_slot_id"], values["remote_scope"],
                              values["remote_id"]), []).append(values)
    for group in by_remote.values():
        if len(group) > 1:
            for values in group:
                plan.adopt.remove(values)
                plan.refused.append({"contract": values["snapshot"]["contract_key"],
                                     "record": values["source_record_key"],
                                     "reason_code": reasons.V1_LINK_REMOTE_ID_CLAIMED,
                                     "detail": f"{len(group)} records carry the same remote id"})
    return plan


def adopt_links(plan: AdoptionPlan) -> int:
    """Create the plan's links inside the caller's (certify) transaction; returns how many were created.

    Raises:
        IntegrityError: a concurrent writer created a link of one of the keys (the certify transaction rolls
            back; its rerun classifies again).
    """
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("adopt_links runs inside the certify transaction")
    for values in plan.adopt:
        RemoteLinkStore.create(**values)
    return len(plan.adopt)

