"""Finalized-link mapping revalidation: an approved manifest advances the link fingerprints atomically.

Seed 002 "2026-07-22 Finalized Mapping Revalidation CARVE_DOWN" ("Single-Snapshot
Contract", "L0 Transaction Invariants" 1-6, "Acceptance").

``RemoteLink.mapping_fingerprint`` and ``body_fingerprint`` stay the only
current PATCH-validation snapshot (:func:`connectors.links.push_rules.patch_drift`
reads the link row and nothing else). This module is the one mutation path
that moves them: a semantic owner approves a manifest, and one transaction
advances every member's two fingerprints, its LastValidatedPackInstallId and
its current-receipt pointer, appending one :class:`PushLinkRevalidationReceipt`
per member with the exact before/after state.

- :func:`manifest_seal` / :func:`manifest_parse`: the manifest document and
  invariant 1 (checked before any transaction);
- :func:`revalidation_draft`: the manifest for the current drift of one
  contract, for a semantic owner to approve (never applies);
- :func:`revalidation_validate`: the same locks and checks as apply, returns
  the projected receipts, writes nothing (invariant 6);
- :func:`revalidation_apply`: the only mutation entry point (invariants 2-5).

The manifest (JSON)::

    {"operation_id": str, "org_id": str, "fingerprint_algorithm": "push-fingerprint.v1",
     "approval": {"approved_by": str, "reason": str, "approval_ref": str},
     "members": [  # strictly ascending link_key
        {"link_id": int, "link_key": hex64, "row_digest": hex64,
         "old": {"mapping_fingerprint": hex64, "body_fingerprint": hex64, "install_id": str},
         "new": {"mapping_fingerprint": hex64, "body_fingerprint": hex64, "install_id": str},
         "previous_receipt_id": int | null}],
     "manifest_digest": hex64}

``manifest_digest`` is ``digest_v2("connectors.push-link-revalidation.manifest",
[("document", canonical_json(document without manifest_digest))])``;
``row_digest`` is :func:`connectors.links.push_rules.link_row_digest` of the link's
complete current row.

Lock order (ARCHITECTURE.md section 6, connectors/store.py ranks): a
RemoteLink (CONNECTOR_WORK rank 7) is locked after RemoteEffect (rank 4), so
this transaction cannot lock an effect once it holds a link; and locking the
effects first would not help, because a new ``prepared`` effect is inserted
without any lock this transaction could hold. The links are therefore locked
one by one in ascending link_key order, and each link's occupancy is then read
*without* locks (READ COMMITTED: the latest committed rows). Every
interleaving fails closed: an occupying effect committed before that read
blocks the whole manifest; an effect delivered after it is granted by a
transaction that locks its effect row and then the link row
(:func:`connectors.outbound.permit_grant._plan_request`), so it waits for this transaction
and decides on the committed new fingerprints (an effect frozen under the old
mapping is refused, ``mapping_drift``); a grant that locked the link first has
committed before this transaction got the link, and the occupancy read sees
it in flight. A create for the same slot cannot start
at all while the link exists (egress plans an update), and a second create is
kept out by the ``create_slot`` unique index and the head-of-lane rule, which
serialize grants on the effect row. The transaction never touches an effect.

No provider call, record write or attempt mutation is reachable from here:
this module imports neither :mod:`connectors.outbound.egress` nor the records services
(zero remote writes, zero record writes).
"""
from __future__ import annotations

import copy
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass

from django.db import OperationalError, transaction
from django.db.models import Q

from connectors.links.link_keys import PUSH_ACTION_TYPE
from connectors.links.push_rules import FINGERPRINT_ALGORITHM, body_fingerprint, link_row_digest, mapping_fingerprint
from connectors.models import (
    AccountServingGate,
    PackGeneration,
    PushLinkRevalidationReceipt,
    RemoteEffect,
    RemoteLink,
)
from connectors.store import RemoteLinkStore
from nexusflow.kernel import canonical_json, failpoints
from nexusflow.kernel.digests import digest_v2
from nexusflow.kernel.errors import InvalidIdentity, NexusError, StaleVersion
from nexusflow.kernel.identity import validate_key
from nexusflow.kernel.models import insert
from nexusflow.kernel.scope import OrgScope

FP_APPLY_BEFORE_COMMIT = failpoints.declare("revalidation.apply_before_commit")

MANIFEST_DOMAIN = "connectors.push-link-revalidation.manifest"
APPROVAL_DOMAIN = "connectors.push-link-revalidation.approval"

#: RemoteEffect states that occupy a link key (seed 002 "Attempt Key": an active attempt).
OCCUPYING_STATES = ("prepared", "dispatching", "uncertain", "remote_confirmed")

#: The largest manifest document (bytes) the command reads; a larger one is ``manifest_too_large``.
MAX_MANIFEST_BYTES = 16 * 1024 * 1024

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_TOP_FIELDS = {"operation_id", "org_id", "fingerprint_algorithm", "approval", "members", "manifest_digest"}
_APPROVAL_FIELDS = {"approved_by", "reason", "approval_ref"}
_MEMBER_FIELDS = {"link_id", "link_key", "row_digest", "old", "new", "previous_receipt_id"}
_TUPLE_FIELDS = {"mapping_fingerprint", "body_fingerprint", "install_id"}


class ManifestInvalid(NexusError):
    """The manifest (or a draft request) is malformed: refused before any transaction (invariant 1).

    Codes: ``manifest_malformed``, ``manifest_not_canonical``,
    ``manifest_duplicate_link``, ``manifest_unsorted``,
    ``manifest_digest_mismatch``, ``manifest_approval_missing``,
    ``manifest_algorithm_unknown``, ``manifest_empty``,
    ``manifest_member_unchanged``, ``manifest_org_mismatch``,
    ``manifest_unreadable`` (the command could not read or decode it),
    ``manifest_too_large`` (larger than :data:`MAX_MANIFEST_BYTES`); for a draft
    ``draft_contract_unknown``, ``draft_link_unknown``, ``draft_no_drift``.
    """

    code = "manifest_invalid"
    definite = True


class RevalidationRefused(NexusError):
    """The database state refuses the manifest; the transaction rolled back and nothing changed.

    Codes: ``revalidation_occupied`` (an attempt occupies a member's link
    key), ``revalidation_member_conflict`` (a member's link, row digest or old
    tuple does not match), ``revalidation_chain_broken`` (the link's receipt
    pointer does not prove its current fingerprints), ``revalidation_mixed_state``
    (the operation is applied to some members only), ``revalidation_divergent``
    (an applied operation no longer matches its after-state exactly),
    ``revalidation_stale`` (a zero-row CAS), ``revalidation_lock_conflict``
    (a lock wait timed out or deadlocked: retry).
    """

    code = "revalidation_refused"

    def __init__(self, message: str, *, code: str, detail: dict | None = None):
        super().__init__(message, code=code)
        self.detail = detail or {}


@dataclass(frozen=True)
class FingerprintTuple:
    """One side of a member: the two fingerprints (64 hex chars each) and the pack installation id."""

    mapping_fingerprint: str
    body_fingerprint: str
    install_id: str


@dataclass(frozen=True)
class Member:
    link_id: int
    link_key: str
    row_digest: str
    old: FingerprintTuple
    new: FingerprintTuple
    previous_receipt_id: int | None


@dataclass(frozen=True)
class Manifest:
    """A parsed manifest whose digest, order, canonical strings and approval were checked (invariant 1)."""

    operation_id: str
    org_id: str
    fingerprint_algorithm: str
    approved_by: str
    reason: str
    approval_ref: str
    members: tuple[Member, ...]
    manifest_digest: str
    approval_digest: str


@dataclass(frozen=True)
class Revalidation:
    """The outcome of one entry point: the operation, its manifest digest and one receipt dict per member.

    Each receipt dict: ``receipt_id`` (``None`` when projected), ``link_id``,
    ``link_key``, ``operation_id``, ``manifest_digest``, ``approval_digest``,
    ``fingerprint_algorithm``, ``old_/new_mapping_fingerprint``,
    ``old_/new_body_fingerprint``, ``old_/new_install_id``,
    ``before_row_digest``, ``after_row_digest``, ``previous_receipt_id``,
    ``approved_by``, ``reason``.
    """

    operation_id: str
    manifest_digest: str
    receipts: tuple[dict, ...]
    status = ""


class Projected(Revalidation):
    """Validate found a fresh operation that would apply: the receipts it would write (nothing written)."""

    status = "validated"


class Applied(Revalidation):
    """Apply committed the receipts and the fingerprint moves."""

    status = "applied"


class AlreadyApplied(Revalidation):
    """Every receipt and every link already match the operation's after-state exactly (nothing written)."""

    status = "already_applied"


# --- the manifest document (invariant 1) ---------------------------------------------------
def _document_digest(document: dict) -> str:
    body = {k: v for k, v in document.items() if k != "manifest_digest"}
    return digest_v2(MANIFEST_DOMAIN, [("document", canonical_json.dumps(body))]).hexdigest


def approval_digest(*, approved_by: str, reason: str, approval_ref: str) -> str:
    """Digest of one approval (64 hex chars), recorded on every receipt of the operation."""
    return digest_v2(APPROVAL_DOMAIN, [("approved_by", approved_by), ("reason", reason),
                                       ("approval_ref", approval_ref)]).hexdigest


def manifest_seal(document: dict) -> dict:
    """Return ``document`` with its members sorted by link_key and ``manifest_digest`` set.

    Args:
        document: a manifest dict (any ``manifest_digest`` in it is replaced).

    Returns:
        A new dict; :func:`manifest_parse` still checks everything else.
    """
    sealed = {k: v for k, v in document.items() if k != "manifest_digest"}
    members = sealed.get("members")
    if isinstance(members, list) and all(isinstance(m, dict) for m in members):
        sealed["members"] = sorted(members, key=lambda m: str(m.get("link_key", "")).encode("utf-8"))
    sealed["manifest_digest"] = _document_digest(sealed)
    return sealed


def _fields(value: object, expected: set[str], where: str) -> dict:
    if not isinstance(value, dict):
        raise ManifestInvalid(f"{where} must be an object", code="manifest_malformed")
    missing, unknown = sorted(expected - set(value)), sorted(set(value) - expected)
    if missing or unknown:
        raise ManifestInvalid(f"{where}: missing {missing}, unknown {unknown}", code="manifest_malformed")
    return value


def _text(value: object, where: str, *, max_length: int, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise ManifestInvalid(f"{where} must be a string", code="manifest_malformed")
    if value == "" and allow_empty:
        return value
    try:
        return validate_key(value, field=where, max_length=max_length)
    except InvalidIdentity as exc:
        raise ManifestInvalid(str(exc), code="manifest_not_canonical") from None


def _hex64(value: object, where: str) -> str:
    if not isinstance(value, str) or not _HEX64.match(value):
        raise ManifestInvalid(f"{where} must be 64 lowercase hex characters", code="manifest_not_canonical")
    return value


def _row_id(value: object, where: str, *, nullable: bool = False) -> int | None:
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ManifestInvalid(f"{where} must be a positive integer", code="manifest_malformed")
    return value


def _tuple(value: object, where: str) -> FingerprintTuple:
    value = _fields(value, _TUPLE_FIELDS, where)
    return FingerprintTuple(_hex64(value["mapping_fingerprint"], f"{where}.mapping_fingerprint"),
                            _hex64(value["body_fingerprint"], f"{where}.body_fingerprint"),
                            _text(value["install_id"], f"{where}.install_id", max_length=120))


def _approval_text(approved_by: object, reason: object, approval_ref: object) -> tuple[str, str, str]:
    for name, value in (("approved_by", approved_by), ("reason", reason)):
        if value == "" or (isinstance(value, str) and value.strip() == ""):
            raise ManifestInvalid(f"approval.{name} is empty: a manifest needs its semantic owner's approval",
                                  code="manifest_approval_missing")
    return (_text(approved_by, "approval.approved_by", max_length=120),
            _text(reason, "approval.reason", max_length=255),
            _text(approval_ref, "approval.approval_ref", max_length=255, allow_empty=True))


def manifest_parse(document: object, *, org: OrgScope) -> Manifest:
    """Check a manifest document completely, without any database access (invariant 1).

    Args:
        document: the decoded JSON document (see the module docstring).
        org: the trusted org the operator acts for; the document's ``org_id`` must equal it.

    Returns:
        The parsed :class:`Manifest`.

    Raises:
        ManifestInvalid: with a stable code: wrong shape or unknown fields
            (``manifest_malformed``); a non-canonical string or digest
            (``manifest_not_canonical``); empty approver or reason
            (``manifest_approval_missing``); an algorithm other than
            :data:`connectors.links.push_rules.FINGERPRINT_ALGORITHM`
            (``manifest_algorithm_unknown``); no members (``manifest_empty``);
            one link twice (``manifest_duplicate_link``); members not in
            strictly ascending link_key order (``manifest_unsorted``); a member
            whose new fingerprints equal its old ones
            (``manifest_member_unchanged``); another org
            (``manifest_org_mismatch``); a recomputed digest that differs
            (``manifest_digest_mismatch``).
    """
    document = _fields(document, _TOP_FIELDS, "manifest")
    approval = _fields(document["approval"], _APPROVAL_FIELDS, "approval")
    approved_by, reason, approval_ref = _approval_text(approval["approved_by"], approval["reason"],
                                                       approval["approval_ref"])
    operation_id = _text(document["operation_id"], "operation_id", max_length=120)
    org_id = _text(document["org_id"], "org_id", max_length=64)
    if org_id != org.org_id:
        raise ManifestInvalid(f"the manifest is for org {org_id!r}, not {org.org_id!r}", code="manifest_org_mismatch")
    algorithm = _text(document["fingerprint_algorithm"], "fingerprint_algorithm", max_length=40)
    if algorithm != FINGERPRINT_ALGORITHM:
        raise ManifestInvalid(f"fingerprint_algorithm {algorithm!r} is not {FINGERPRINT_ALGORITHM!r}",
                              code="manifest_algorithm_unknown")
    raw_members = document["members"]
    if not isinstance(raw_members, list):
        raise ManifestInvalid("members must be a list", code="manifest_malformed")
    if not raw_members:
        raise ManifestInvalid("the manifest has no members", code="manifest_empty")
    members = []
    for index, raw in enumerate(raw_members):
        where = f"members[{index}]"
        raw = _fields(raw, _MEMBER_FIELDS, where)
        member = Member(
            link_id=_row_id(raw["link_id"], f"{where}.link_id"),
            link_key=_hex64(raw["link_key"], f"{where}.link_key"),
            row_digest=_hex64(raw["row_digest"], f"{where}.row_digest"),
            old=_tuple(raw["old"], f"{where}.old"), new=_tuple(raw["new"], f"{where}.new"),
            previous_receipt_id=_row_id(raw["previous_receipt_id"], f"{where}.previous_receipt_id", nullable=True))
        if (member.old.mapping_fingerprint, member.old.body_fingerprint) == \
                (member.new.mapping_fingerprint, member.new.body_fingerprint):
            raise ManifestInvalid(f"{where}: new fingerprints equal the old ones", code="manifest_member_unchanged")
        members.append(member)
    for field in ("link_key", "link_id"):
        values = [getattr(m, field) for m in members]
        if len(set(values)) != len(values):
            raise ManifestInvalid(f"a link appears twice (same {field})", code="manifest_duplicate_link")
    keys = [m.link_key.encode("utf-8") for m in members]
    if keys != sorted(keys):
        raise ManifestInvalid("members are not in ascending link_key order", code="manifest_unsorted")
    digest = _hex64(document["manifest_digest"], "manifest_digest")
    if digest != _document_digest(document):
        raise ManifestInvalid("manifest_digest does not match the canonical document", code="manifest_digest_mismatch")
    return Manifest(operation_id=operation_id, org_id=org_id, fingerprint_algorithm=algorithm,
                    approved_by=approved_by, reason=reason, approval_ref=approval_ref, members=tuple(members),
                    manifest_digest=digest,
                    approval_digest=approval_digest(approved_by=approved_by, reason=reason,
                                                    approval_ref=approval_ref))


# --- draft ------------------------------------------------------------------------------------
def _install_id(pack: PackGeneration) -> str:
    # The same installation id action_config_snapshot freezes on intents and links.
    return pack.installation_id or f"{pack.owner_key}@{pack.version}"


def _serving_packs(org_id: str) -> list[tuple[PackGeneration, list[str]]]:
    """``(pack generation, offered push contract keys)`` of every serving account of the org."""
    found = []
    for gate in AccountServingGate.objects.filter(org_id=org_id, state="v2_serving").select_related("epoch"):
        account = next((a for a in gate.epoch.document["accounts"] if a["account_key"] == gate.account_key), None)
        if account and account.get("push_contracts"):
            found.append((PackGeneration.objects.get(pk=account["pack_generation"]["id"]),
                          list(account["push_contracts"])))
    return found


def _draft_contract(org_id: str, contract_key: str | None, pack_generation_id: int | None,
                    links: list[RemoteLink]) -> tuple[PackGeneration, dict]:
    """The one ``(pack generation, push contract)`` a draft takes its new fingerprints from."""
    if links and len({(link.owner_key, link.action_slot_id, link.destination_slot_id) for link in links}) > 1:
        raise ManifestInvalid("the named links belong to several slots; draft one contract at a time",
                              code="draft_contract_unknown")
    if pack_generation_id is not None:
        pack = PackGeneration.objects.filter(pk=_row_id(pack_generation_id, "pack_generation_id")).first()
        if pack is None:
            raise ManifestInvalid(f"no pack generation {pack_generation_id}", code="draft_contract_unknown")
        candidates = [(pack, c) for c in pack.document.get("push_contracts", [])]
    else:
        candidates = [(pack, c) for pack, offered in _serving_packs(org_id)
                      for c in pack.document.get("push_contracts", []) if c["contract_key"] in offered]
    if contract_key is not None:
        candidates = [(p, c) for p, c in candidates if c["contract_key"] == contract_key]
    slots = {(link.owner_key, link.action_slot_id, link.destination_slot_id) for link in links}
    if slots:
        candidates = [(p, c) for p, c in candidates
                      if (p.owner_key, c.get("action_slot_id"), c.get("destination_slot_id")) in slots]
    if len(candidates) != 1:
        where = f"pack generation {pack_generation_id}" if pack_generation_id is not None else "the serving packs"
        raise ManifestInvalid(f"{len(candidates)} push contracts of {where} match {contract_key or 'the links'}; "
                              "name exactly one (contract key, pack generation)", code="draft_contract_unknown")
    return candidates[0]


def revalidation_draft(*, org: OrgScope, approved_by: str, reason: str, approval_ref: str = "",
                       contract_key: str | None = None, link_keys: Iterable[str] = (),
                       pack_generation_id: int | None = None, operation_id: str | None = None) -> dict:
    """Build the sealed manifest a semantic owner would approve for the current mapping drift; never applies.

    Members are the org's active push links of the contract's stable slot
    whose ``mapping_fingerprint``/``body_fingerprint`` differ from the
    contract's, each bound to its current full-row digest and receipt pointer;
    ``new`` is the contract's fingerprints and pack installation. L0 does not
    decide that the mappings are equivalent: the approval fields carry that
    decision, and apply re-checks every member under lock.

    Args:
        org: the trusted org.
        approved_by / reason / approval_ref: the approval recorded on every receipt.
        contract_key: the push contract whose mapping is now authoritative.
        link_keys: restrict to these links (64 hex chars each); with no
            ``contract_key`` the contract is the one serving their slot.
        pack_generation_id: take the contract from this pack generation
            (default: the generation the org serves now).
        operation_id: default ``push-link-revalidation-<random hex>``.

    Returns:
        The manifest dict, sealed by :func:`manifest_seal` and checked by :func:`manifest_parse`.

    Raises:
        ManifestInvalid: ``draft_contract_unknown`` (no or several matching
            contracts), ``draft_link_unknown`` (a named link is missing, not an
            active push link, or of another slot), ``draft_no_drift`` (no
            member differs), or any :func:`manifest_parse` code.
    """
    # The approval and the operation id are checked before the manifest is sealed: its digest
    # cannot be computed over text that is not UTF-8.
    _approval_text(approved_by, reason, approval_ref)
    if operation_id is not None:
        _text(operation_id, "operation_id", max_length=120)
    wanted = [_hex64(key, "link key") for key in link_keys]
    if contract_key is None and not wanted:
        raise ManifestInvalid("name a contract or link keys", code="draft_contract_unknown")
    named = list(RemoteLink.objects.filter(org_id=org.org_id, link_key__in=wanted).order_by("link_key"))
    unknown = sorted(set(wanted) - {link.link_key for link in named if link.action_type == PUSH_ACTION_TYPE
                                    and link.state == "active"})
    if unknown:
        raise ManifestInvalid(f"not active push links of org {org.org_id}: {unknown}", code="draft_link_unknown")
    pack, contract = _draft_contract(org.org_id, contract_key, pack_generation_id, named)
    new = {"mapping_fingerprint": mapping_fingerprint(contract), "body_fingerprint": body_fingerprint(contract),
           "install_id": _install_id(pack)}
    links = RemoteLink.objects.filter(org_id=org.org_id, action_type=PUSH_ACTION_TYPE, state="active",
                                      owner_key=pack.owner_key, action_slot_id=contract.get("action_slot_id", ""),
                                      destination_slot_id=contract.get("destination_slot_id", ""))
    if wanted:
        links = links.filter(link_key__in=wanted)
    links = list(links.order_by("link_key"))
    if len(links) != len(wanted) and wanted:
        raise ManifestInvalid("some named links are not in the contract's slot", code="draft_link_unknown")
    members = [{"link_id": int(link.pk), "link_key": link.link_key, "row_digest": link_row_digest(link),
                "old": {"mapping_fingerprint": link.mapping_fingerprint, "body_fingerprint": link.body_fingerprint,
                        "install_id": link.last_validated_install_id},
                "new": dict(new),
                "previous_receipt_id": int(link.last_mapping_revalidation_id)
                if link.last_mapping_revalidation_id is not None else None}
               for link in links
               if (link.mapping_fingerprint, link.body_fingerprint) != (new["mapping_fingerprint"],
                                                                        new["body_fingerprint"])]
    if not members:
        raise ManifestInvalid(f"no active link of contract {contract['contract_key']} differs from pack generation "
                              f"{pack.pk}", code="draft_no_drift")
    manifest = manifest_seal({
        "operation_id": operation_id or f"push-link-revalidation-{secrets.token_hex(8)}",
        "org_id": org.org_id, "fingerprint_algorithm": FINGERPRINT_ALGORITHM,
        "approval": {"approved_by": approved_by, "reason": reason, "approval_ref": approval_ref},
        "members": members})
    manifest_parse(manifest, org=org)
    return manifest


# --- validate / apply (invariants 2-6) -------------------------------------------------------------
def _refuse(code: str, message: str, member: Member | None = None, **detail) -> RevalidationRefused:
    if member is not None:
        detail = {"link_id": member.link_id, "link_key": member.link_key, **detail}
    return RevalidationRefused(message, code=code, detail=detail)


def _lock_members(org_id: str, manifest: Manifest) -> dict[str, RemoteLink | None]:
    """Lock every member's link in ascending link_key order (the manifest is already in that order)."""
    return {m.link_key: RemoteLinkStore.lock_by_link_key(org_id, m.link_key) for m in manifest.members}


def _receipt_dict(receipt: PushLinkRevalidationReceipt) -> dict:
    return {"receipt_id": int(receipt.pk), "link_id": int(receipt.link_id), "link_key": receipt.link_key,
            "operation_id": receipt.operation_id, "manifest_digest": receipt.manifest_digest,
            "approval_digest": receipt.approval_digest, "fingerprint_algorithm": receipt.fingerprint_algorithm,
            "old_mapping_fingerprint": receipt.old_mapping_fingerprint,
            "new_mapping_fingerprint": receipt.new_mapping_fingerprint,
            "old_body_fingerprint": receipt.old_body_fingerprint, "new_body_fingerprint": receipt.new_body_fingerprint,
            "old_install_id": receipt.old_install_id, "new_install_id": receipt.new_install_id,
            "before_row_digest": receipt.before_row_digest, "after_row_digest": receipt.after_row_digest,
            "previous_receipt_id": int(receipt.previous_receipt_id) if receipt.previous_receipt_id else None,
            "approved_by": receipt.approved_by, "reason": receipt.reason}


def _projected(manifest: Manifest, member: Member, link: RemoteLink) -> dict:
    after = copy.copy(link)
    after.mapping_fingerprint = member.new.mapping_fingerprint
    after.body_fingerprint = member.new.body_fingerprint
    after.last_validated_install_id = member.new.install_id
    return {"receipt_id": None, "link_id": member.link_id, "link_key": member.link_key,
            "operation_id": manifest.operation_id, "manifest_digest": manifest.manifest_digest,
            "approval_digest": manifest.approval_digest, "fingerprint_algorithm": manifest.fingerprint_algorithm,
            "old_mapping_fingerprint": member.old.mapping_fingerprint,
            "new_mapping_fingerprint": member.new.mapping_fingerprint,
            "old_body_fingerprint": member.old.body_fingerprint, "new_body_fingerprint": member.new.body_fingerprint,
            "old_install_id": member.old.install_id, "new_install_id": member.new.install_id,
            "before_row_digest": member.row_digest,
            "after_row_digest": link_row_digest(after, revalidation_operation_id=manifest.operation_id),
            "previous_receipt_id": member.previous_receipt_id,
            "approved_by": manifest.approved_by, "reason": manifest.reason}


def _readback(org_id: str, manifest: Manifest, links: dict[str, RemoteLink | None],
              receipts: list[PushLinkRevalidationReceipt]) -> AlreadyApplied:
    """Invariant 5: an operation with receipts must match its after-state exactly, or fail closed."""
    by_link = {int(r.link_id): r for r in receipts}
    members = {m.link_id for m in manifest.members}
    if set(by_link) - members:
        raise _refuse("revalidation_divergent", f"operation {manifest.operation_id} has receipts for links outside "
                      "this manifest", links=sorted(set(by_link) - members))
    if set(by_link) != members:
        raise _refuse("revalidation_mixed_state", f"operation {manifest.operation_id} is applied to "
                      f"{len(by_link)} of {len(members)} members", missing=sorted(members - set(by_link)))
    out = []
    for member in manifest.members:
        receipt, link = by_link[member.link_id], links[member.link_key]
        expected = {"link_key": member.link_key, "manifest_digest": manifest.manifest_digest,
                    "approval_digest": manifest.approval_digest,
                    "fingerprint_algorithm": manifest.fingerprint_algorithm,
                    "old_mapping_fingerprint": member.old.mapping_fingerprint,
                    "new_mapping_fingerprint": member.new.mapping_fingerprint,
                    "old_body_fingerprint": member.old.body_fingerprint,
                    "new_body_fingerprint": member.new.body_fingerprint,
                    "old_install_id": member.old.install_id, "new_install_id": member.new.install_id,
                    "before_row_digest": member.row_digest, "previous_receipt_id": member.previous_receipt_id,
                    "approved_by": manifest.approved_by, "reason": manifest.reason}
        found = _receipt_dict(receipt)
        differs = sorted(k for k, v in expected.items() if found[k] != v)
        if link is None or link.pk != member.link_id:
            differs.append("link")
        elif link.last_mapping_revalidation_id != receipt.pk or link_row_digest(link) != receipt.after_row_digest:
            differs.append("link_after_state")
        if differs:
            raise _refuse("revalidation_divergent", f"operation {manifest.operation_id} was applied differently "
                          f"to link {member.link_id}: {', '.join(differs)}", member, differs=differs)
        out.append(found)
    return AlreadyApplied(manifest.operation_id, manifest.manifest_digest, tuple(out))


def _check_member(org_id: str, manifest: Manifest, member: Member, link: RemoteLink | None) -> None:
    """Invariants 2-4 for one fresh member, its link locked: identity, old tuple, row digest, chain, occupancy."""
    if link is None or link.pk != member.link_id or link.action_type != PUSH_ACTION_TYPE:
        raise _refuse("revalidation_member_conflict", f"link {member.link_id} is not the push link of key "
                      f"{member.link_key}", member)
    if link.state != "active":
        raise _refuse("revalidation_member_conflict", f"link {member.link_id} is {link.state}, not finalized "
                      "(active)", member, state=link.state)
    current = FingerprintTuple(link.mapping_fingerprint, link.body_fingerprint, link.last_validated_install_id)
    if current != member.old or link.last_mapping_revalidation_id != member.previous_receipt_id:
        raise _refuse("revalidation_member_conflict", f"link {member.link_id} does not hold the manifest's old "
                      "fingerprints, installation or receipt pointer", member)
    if link_row_digest(link) != member.row_digest:
        raise _refuse("revalidation_member_conflict", f"link {member.link_id} changed since the manifest bound its "
                      "row digest", member)
    if link.last_mapping_revalidation_id is not None:
        prior = PushLinkRevalidationReceipt.objects.filter(org_id=org_id, pk=link.last_mapping_revalidation_id).first()
        if prior is None or prior.link_id != link.pk or (prior.new_mapping_fingerprint, prior.new_body_fingerprint) \
                != (link.mapping_fingerprint, link.body_fingerprint):
            raise _refuse("revalidation_chain_broken", f"link {member.link_id}'s receipt pointer does not prove its "
                          "current fingerprints", member)
    occupying = list(RemoteEffect.objects.filter(org_id=org_id).filter(
        Q(link_key=member.link_key, state__in=OCCUPYING_STATES)
        | Q(create_slot=member.link_key) & ~Q(state="finalized")).order_by("id").values_list("id", "state"))
    if occupying:
        raise _refuse("revalidation_occupied", f"link key {member.link_key} is occupied by effect(s) "
                      f"{', '.join(f'{pk} ({state})' for pk, state in occupying)}: the whole manifest waits",
                      member, effects=[[int(pk), state] for pk, state in occupying])


def _require_serving(org_id: str, member: Member, link: RemoteLink) -> None:
    """The new fingerprints must be the ones the org serves for the link's slot now.

    A manifest drafted from a pack generation that does not serve yet waits
    until that generation serves: applied earlier, it would make every PATCH
    of the member refuse ``mapping_drift`` under the serving pack.
    """
    from connectors.links.link_decisions import LinkOperationRefused, serving_slot_config

    try:
        _contract, current, _account = serving_slot_config(
            org_id=org_id, owner_key=link.owner_key, action_slot_id=link.action_slot_id,
            destination_slot_id=link.destination_slot_id, source_object=link.source_object)
    except LinkOperationRefused as exc:
        raise _refuse("revalidation_not_serving", f"link {member.link_id}: {exc}", member) from None
    if (current["mapping_fingerprint"], current["body_fingerprint"]) != (member.new.mapping_fingerprint,
                                                                       member.new.body_fingerprint):
        raise _refuse("revalidation_not_serving", f"link {member.link_id}: the manifest's new fingerprints are not "
                      f"those the org serves now (install {current['install_id']}); apply it once that pack "
                      "generation serves", member, serving_install_id=current["install_id"])


def _run(org: OrgScope, document: object, *, write: bool) -> Revalidation:
    manifest = manifest_parse(document, org=org)  # invariant 1: before any transaction
    try:
        with transaction.atomic(durable=True):
            links = _lock_members(org.org_id, manifest)
            receipts = list(PushLinkRevalidationReceipt.objects.filter(
                org_id=org.org_id, operation_id=manifest.operation_id).order_by("id"))
            if receipts:
                return _readback(org.org_id, manifest, links, receipts)
            projected = []
            for member in manifest.members:
                _check_member(org.org_id, manifest, member, links[member.link_key])
                projected.append(_projected(manifest, member, links[member.link_key]))
            for member in manifest.members:  # every member's own checks first, then what the org serves
                _require_serving(org.org_id, member, links[member.link_key])
            if not write:
                transaction.set_rollback(True)
                return Projected(manifest.operation_id, manifest.manifest_digest, tuple(projected))
            written = tuple(_write(org.org_id, manifest, member, links[member.link_key], projection)
                            for member, projection in zip(manifest.members, projected, strict=True))
            failpoints.hit(FP_APPLY_BEFORE_COMMIT)
            return Applied(manifest.operation_id, manifest.manifest_digest, written)
    except OperationalError as exc:
        if exc.args and exc.args[0] in (1205, 1213):  # lock wait timeout, deadlock: nothing was committed
            raise RevalidationRefused(f"lock conflict, retry: {exc}", code="revalidation_lock_conflict") from None
        raise


def _write(org_id: str, manifest: Manifest, member: Member, link: RemoteLink, projection: dict) -> dict:
    """Append the member's receipt and CAS-advance its link (invariant 4), inside the apply transaction."""
    receipt = insert(
        PushLinkRevalidationReceipt, org_id=org_id, operation_id=manifest.operation_id, link=link,
        link_key=member.link_key, manifest_digest=manifest.manifest_digest, approval_digest=manifest.approval_digest,
        fingerprint_algorithm=manifest.fingerprint_algorithm,
        old_mapping_fingerprint=member.old.mapping_fingerprint, new_mapping_fingerprint=member.new.mapping_fingerprint,
        old_body_fingerprint=member.old.body_fingerprint, new_body_fingerprint=member.new.body_fingerprint,
        old_install_id=member.old.install_id, new_install_id=member.new.install_id,
        before_row_digest=member.row_digest, after_row_digest=projection["after_row_digest"],
        previous_receipt_id=member.previous_receipt_id, approved_by=manifest.approved_by, reason=manifest.reason)
    try:
        RemoteLinkStore.touch(
            org_id=org_id, pk=link.pk, state=link.state, version=link.version,
            fences={"mapping_fingerprint": member.old.mapping_fingerprint,
                    "body_fingerprint": member.old.body_fingerprint,
                    "last_validated_install_id": member.old.install_id,
                    "last_mapping_revalidation_id": member.previous_receipt_id},
            set_fields={"mapping_fingerprint": member.new.mapping_fingerprint,
                        "body_fingerprint": member.new.body_fingerprint,
                        "last_validated_install_id": member.new.install_id,
                        "last_mapping_revalidation_id": receipt.pk})
    except StaleVersion:
        raise _refuse("revalidation_stale", f"link {member.link_id} moved under its lock", member) from None
    moved = RemoteLink.objects.get(org_id=org_id, pk=link.pk)
    if link_row_digest(moved) != projection["after_row_digest"]:
        raise _refuse("revalidation_stale", f"link {member.link_id} does not hold the projected after-state", member)
    return _receipt_dict(receipt)


def revalidation_validate(*, org: OrgScope, manifest: object) -> Projected | AlreadyApplied:
    """Dry-run a manifest: the same locks and checks as :func:`revalidation_apply`, then roll back (invariant 6).

    Args:
        org: the trusted org.
        manifest: the decoded manifest document.

    Returns:
        :class:`Projected` with the receipts apply would write (``receipt_id``
        ``None``), or :class:`AlreadyApplied` when the operation is applied
        exactly. Nothing is written either way.

    Raises:
        ManifestInvalid: invariant 1, before any transaction.
        RevalidationRefused: as :func:`revalidation_apply` would.
    """
    return _run(org, manifest, write=False)


def revalidation_apply(*, org: OrgScope, manifest: object) -> Applied | AlreadyApplied:
    """Apply an approved manifest in one transaction: receipts plus fingerprint moves, all or nothing.

    Seed 002 CARVE_DOWN invariants 1-5: links locked in ascending link_key
    order; each member's full-row digest, old tuple and receipt pointer
    re-checked under lock; any occupying attempt of any member
    (:data:`OCCUPYING_STATES`, or a create slot held by an unfinalized effect)
    refuses the whole manifest without touching the effect; each link's
    ``mapping_fingerprint``, ``body_fingerprint``,
    ``last_validated_install_id`` and ``last_mapping_revalidation`` move by
    CAS next to one appended receipt. A retry of an applied operation only
    reads back.

    Args:
        org: the trusted org.
        manifest: the decoded manifest document.

    Returns:
        :class:`Applied` (one receipt dict per member, in link_key order) or
        :class:`AlreadyApplied` (nothing written).

    Raises:
        ManifestInvalid: invariant 1, before any transaction.
        RevalidationRefused: ``revalidation_occupied``,
            ``revalidation_member_conflict``, ``revalidation_chain_broken``,
            ``revalidation_mixed_state``, ``revalidation_divergent``,
            ``revalidation_stale``, ``revalidation_lock_conflict``; nothing
            was written.
    """
    return _run(org, manifest, write=True)
