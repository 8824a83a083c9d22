"""HubSpot-style webhook pack: ``pack.json`` data plus its loopback sender.

The L0 runtime reads ``pack.json`` itself; the functions here serve the
pack's own modules (the sender and the demo fixture generator), which need
the route's signature config and item schema without the runtime.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

PACK_PATH: Path = Path(__file__).resolve().parent / "pack.json"
WEBHOOK_ROUTE_KEY = "contacts.webhook"

_SCHEMA_TYPES: dict[str, tuple[type, ...]] = {"integer": (int,), "string": (str,)}


def load_pack() -> dict[str, Any]:
    """Return the parsed ``pack.json`` of this pack.

    Raises:
        OSError: the file cannot be read.
        ValueError: the file is not valid JSON.
    """
    with PACK_PATH.open(encoding="utf-8") as handle:
        return json.load(handle)


def webhook_route(route_key: str = WEBHOOK_ROUTE_KEY) -> dict[str, Any]:
    """Return the inbound route ``route_key`` from ``pack.json``.

    Raises:
        KeyError: the pack declares no such route.
    """
    for route in load_pack()["inbound_routes"]:
        if route["route_key"] == route_key:
            return route
    raise KeyError(f"pack has no inbound route {route_key!r}")


def item_kind(route: Mapping[str, Any], item: Any) -> str | None:
    """Return the provider kind of one batch element, ``None`` if it names none.

    The kind is read from ``route["kind_field"]``, falling back to
    ``route["kind_field_fallback"]`` for older payloads.
    """
    if not isinstance(item, dict):
        return None
    for field in (route["kind_field"], route.get("kind_field_fallback")):
        if field and isinstance(item.get(field), str):
            return item[field]
    return None


def item_conforms(route: Mapping[str, Any], item: Any) -> bool:
    """Say whether one batch element satisfies the route's declared schema.

    An element conforms when it is a JSON object, names a kind listed in
    ``route["kinds"]``, and carries every field of ``route["common_required"]``
    and of that kind's ``required`` map with the declared type (``"integer"``:
    a JSON integer, booleans excluded; ``"string"``: a JSON string).
    """
    kind = item_kind(route, item)
    if kind is None or kind not in route["kinds"]:
        return False
    required = {**route["common_required"], **route["kinds"][kind]["required"]}
    for field, type_name in required.items():
        value = item.get(field)
        if isinstance(value, bool) or not isinstance(value, _SCHEMA_TYPES[type_name]):
            return False
    return True
