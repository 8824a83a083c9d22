"""Change Data Capture pack, pulled from a stream: ``pack.json`` data plus its loopback sandbox.

The L0 runtime reads ``pack.json`` itself (the route's ``stream``,
``envelope`` and ``ordering`` blocks) and never imports this package. The
helpers here build provider-shaped change envelopes for the sandbox and the
tests (``FACTS.md``, "Salesforce-style Change Data Capture"):

    {"data": {"schema": "<schema id>",
              "payload": {"ChangeEventHeader": {"entityName", "recordIds", "changeType",
                                                "changeOrigin", "transactionKey", "sequenceNumber",
                                                "commitTimestamp", "commitNumber", "commitUser",
                                                "changedFields"},
                          <changed fields>},
              "event": {"replayId": <opaque, assigned by the stream>}},
     "channel": "/data/<Object>ChangeEvent"}
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

PACK_PATH: Path = Path(__file__).resolve().parent / "pack.json"
ROUTE_KEY = "contacts.changes"
CHANGE_TYPES = ("CREATE", "UPDATE", "DELETE", "UNDELETE")
GAP_TYPES = ("GAP_CREATE", "GAP_UPDATE", "GAP_DELETE", "GAP_UNDELETE", "GAP_OVERFLOW")


def load_pack() -> dict[str, Any]:
    """Return the parsed ``pack.json``.

    Raises:
        OSError / ValueError: the file cannot be read or is not JSON.
    """
    with PACK_PATH.open(encoding="utf-8") as handle:
        return json.load(handle)


def stream_route(route_key: str = ROUTE_KEY) -> dict[str, Any]:
    """Return the inbound route ``route_key`` of this pack.

    Raises:
        KeyError: no such route.
    """
    for route in load_pack()["inbound_routes"]:
        if route["route_key"] == route_key:
            return route
    raise KeyError(f"pack has no inbound route {route_key!r}")


def change_event(*, entity: str = "Contact", change_type: str = "UPDATE", record_ids: Sequence[str] = (),
                 transaction_key: str = "tx-0001", sequence: int = 1, commit_ms: int = 1_700_000_000_000,
                 fields: Mapping[str, Any] | None = None, commit_number: int = 1, origin: str = "com/salesforce/api/rest/60.0",
                 user: str = "005000000000001AAA") -> dict[str, Any]:
    """Build one unpublished change envelope (the stream assigns ``replayId`` on publish).

    Args:
        entity: ``entityName``; the channel is ``/data/<entity>ChangeEvent``.
        change_type: ``CREATE``, ``UPDATE``, ``DELETE``, ``UNDELETE`` or a ``GAP_*`` type.
        record_ids: ``recordIds``; one change may name several records.
        transaction_key, sequence: ``transactionKey`` and ``sequenceNumber`` (order inside it).
        commit_ms: ``commitTimestamp`` in epoch milliseconds.
        fields: changed field values; ``changedFields`` lists their names for updates.
    """
    fields = dict(fields or {})
    header = {
        "entityName": entity, "recordIds": list(record_ids), "changeType": change_type, "changeOrigin": origin,
        "transactionKey": transaction_key, "sequenceNumber": sequence, "commitTimestamp": commit_ms,
        "commitNumber": commit_number, "commitUser": user,
        "changedFields": sorted(fields) if change_type == "UPDATE" else [],
    }
    return {"data": {"schema": "IeRuaY6cbI_HsV8Rv1Mc5g", "payload": {"ChangeEventHeader": header, **fields},
                     "event": {"replayId": None}},
            "channel": f"/data/{entity}ChangeEvent"}


def replay_id(envelope: Mapping[str, Any]) -> Any:
    """The opaque ``replayId`` the stream assigned to ``envelope`` (never computed from another)."""
    return envelope["data"]["event"]["replayId"]
