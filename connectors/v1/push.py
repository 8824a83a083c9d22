"""V1 synchronous PATCH-only push of existing links (seed 002 "Scope": "#1726 / v1a").

The V1 runtime is "synchronous PATCH-existing only": it has no POST/create, no
local writeback, no durable link table, no attempt table and no retry. The
PATCH target is the record's compatibility remote-id field (the contract's
``mirror_field``), read at call time; a record without one is refused before
any I/O (never a create). The request follows the live contract's ``update``
route and mapping; the one provider call goes through :func:`connectors.v1.egress.v1_call_send`
behind its committed pre-I/O row.
"""
from __future__ import annotations

import urllib.parse
from dataclasses import dataclass

import httpx
from django.db import transaction

from connectors.contracts import outcomes
from connectors.outbound.egress_common import bearer, content_type, encode_body
from connectors.outbound.intents import render_request_fields
from connectors.reasons import V1_NO_LINKED_REMOTE
from connectors.v1.config import live_contract, live_pack_owner, live_secret
from connectors.v1.egress import v1_call_prepare, v1_call_send
from connectors.v1.models import V1ProviderCall
from connectors.v1.provenance import provenance_marker
from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.scope import OrgScope
from nexusflow.records.models import Record
from nexusflow.records.selectors import record_get
from nexusflow.records.services import record_lock, record_write_mirror


class V1PushRefused(NexusError):
    """The V1 push cannot be sent: the record is unknown, or carries no remote id (V1 never creates)."""

    code = V1_NO_LINKED_REMOTE
    http_status = 409
    definite = True


@dataclass(frozen=True)
class V1PushReport:
    """``call_id``: the V1ProviderCall row; ``state``: confirmed | refused | ambiguous; ``status``: HTTP status."""

    call_id: V1ProviderCall.Id
    remote_id: str
    state: str
    status: int | None


def v1_push_record(*, org: OrgScope, contract_key: str, record_key: str,
                   client: httpx.Client | None = None) -> V1PushReport:
    """PATCH one existing remote record from a local record, synchronously, once.

    Args:
        org: the trusted org.
        contract_key: a push contract a live account of the org offers.
        record_key: the local record of the contract's ``source_object``.
        client: an httpx client to reuse (tests).

    Returns:
        :class:`V1PushReport` of the settled call.

    Raises:
        V1PushRefused (409 ``v1_no_linked_remote``): no live record, or no remote id in its mirror field;
            nothing was written and nothing sent.
        V1ContractUnknown (404), V1CredentialUnavailable (503): see :mod:`connectors.v1.config`.
        V1MaintenanceClosed (503): the root outbound maintenance barrier is closed; nothing written or sent.

    Seed 002 "Scope" (synchronous PATCH-existing only) and seed 003 "V1 concepts to retire".
    """
    account, contract, profile = live_contract(org.org_id, contract_key)
    record = record_get(org=org, object_name=contract["source_object"], record_key=record_key)
    if record is None:
        raise V1PushRefused(f"no live {contract['source_object']} record {record_key!r}")
    mirror = contract.get("mirror_field", "")
    remote_id = (record.mirrors or {}).get(mirror) or (record.fields or {}).get(mirror) or ""
    if not isinstance(remote_id, str) or not remote_id:
        raise V1PushRefused(f"record {record_key} has no remote id in {mirror!r}: V1 pushes existing links only")
    update = contract["update"]
    url = account["base_url"].rstrip("/") + update["path"].format(remote_id=urllib.parse.quote(remote_id, safe=""))
    body = encode_body(contract, render_request_fields(contract, record.fields or {}))
    headers = {"Content-Type": content_type(contract), "Accept": "application/json"}
    auth = profile.get("auth", {})
    if auth.get("kind") == "bearer":
        headers["Authorization"] = bearer(live_secret(org.org_id, account, auth["credential_ref"]))
    outcomes.policy(profile)  # a profile V1 cannot classify is refused here, before the pre-I/O row
    call = v1_call_prepare(org_id=org.org_id, account_key=account["account_key"], call_site="v1.push.update",
                           kind="push", subject=record_key, method=update["method"], url=url, body=body,
                           root_barrier="root_outbound")
    result = v1_call_send(call, headers=headers, profile=profile, client=client)
    if result.state == "confirmed" and contract.get("provenance_field"):
        _write_provenance(org, contract, account, record_key, remote_id)
    return V1PushReport(result.call_id, remote_id, result.state, result.status)


def _write_provenance(org: OrgScope, contract: dict, account: dict, record_key: str, remote_id: str) -> None:
    """Record which action and destination the confirmed PATCH used (:mod:`connectors.v1.provenance`), once.

    Its own transaction after the call settled: a crash in between leaves a remote id without provenance,
    which the V1 link adoption refuses (fail closed), never a marker without the call.
    """
    marker = provenance_marker(owner_key=live_pack_owner(account), contract=contract, base_url=account["base_url"],
                               remote_id=remote_id)
    with transaction.atomic():
        try:
            record = record_lock(org=org, object_name=contract["source_object"], record_key=record_key)
        except Record.DoesNotExist:
            return  # deleted meanwhile: nothing to mark
        if (record.mirrors or {}).get(contract["provenance_field"]) in (None, ""):
            record_write_mirror(org=org, record=record, field=contract["provenance_field"], value=marker)
