"""The V1 push provenance marker: which action and destination a record's remote-id mirror was last PATCHed for.

Seed 002 "Migration Contract For #1783": a V1 record's remote-id mirror field and provenance marker become
a V2 RemoteLink at certification only when they prove one ``link_key`` and one remote id unambiguously.
A push contract that declares a ``provenance_field`` (a mirror field of its source object, pack data) gets
the marker written by every confirmed V1 push (:func:`connectors.v1.push.v1_push_record`), after the call
settled, once per record (a marker already there is never overwritten: a different one stays as proof of
the older action or destination, and the adoption refuses the record).

The marker is canonical JSON text::

    {"v": 1, "owner_key": <pack owner key>, "action_slot_id": <slot>, "destination_slot_id": <slot>,
     "destination": <64 hex: the update route the call used>, "remote_id_digest": <64 hex: the remote id>}
"""
from __future__ import annotations

import json

from nexusflow.kernel import canonical_json
from nexusflow.kernel.digests import digest_v2

FORMAT = 1


def destination_digest(*, base_url: str, contract: dict) -> str:
    """The remote destination a push reaches: base URL, update method and path template, target object (64 hex)."""
    update = contract.get("update") or {}
    return digest_v2("connectors.v1-provenance-destination", [
        ("base_url", base_url.rstrip("/")), ("method", str(update.get("method", "")).upper()),
        ("path", str(update.get("path", ""))), ("target_object", str(contract.get("target_object", "")))]).hexdigest


def remote_id_digest(remote_id: str) -> str:
    return digest_v2("connectors.v1-provenance-remote-id", [("remote_id", remote_id)]).hexdigest


def provenance_marker(*, owner_key: str, contract: dict, base_url: str, remote_id: str) -> str:
    """The marker text for a confirmed V1 push of ``remote_id`` through ``contract`` at ``base_url``."""
    return canonical_json.dumps({
        "v": FORMAT, "owner_key": owner_key, "action_slot_id": contract.get("action_slot_id", ""),
        "destination_slot_id": contract.get("destination_slot_id", ""),
        "destination": destination_digest(base_url=base_url, contract=contract),
        "remote_id_digest": remote_id_digest(remote_id)}).decode()


def parse_marker(text) -> dict | None:
    """The marker as a dict, or ``None`` when ``text`` is not a marker of this format."""
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return None
    keys = {"v", "owner_key", "action_slot_id", "destination_slot_id", "destination", "remote_id_digest"}
    if not isinstance(value, dict) or set(value) != keys or value["v"] != FORMAT:
        return None
    return value
