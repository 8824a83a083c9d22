"""Generic shapes of pulled routes and envelopes, as pack data declares them (seed 003 "Inbound facts").

A pack route is pushed (the default: the provider POSTs signed batches to
the ingress) or pulled (``"delivery": "pull"``: L0 fetches envelopes from the
account's ``base_url`` with the route's credential). L0 interprets only the
closed shapes below; names of fields, paths and topics are pack data.

Pulled route blocks::

    "stream": {"method": "GET", "path": "/...", "topic": "...", "topic_param": "...", "cursor_param": "...",
               "limit_param": "...", "batch_limit": 50, "events_field": "...",
               "next_cursor_field": "...", "timeout_seconds": 10}
    "auth": {"mechanism": "bearer", "header": "<header name>", "scheme": "<scheme word>"}
    "transport_key": {"kind": "envelope_field", "path": [<keys>]}
    "envelope": {"fields": {<item field>: [<keys>]},
                 "values": {"path": [<keys>], "as": <item field>, "exclude": [<keys>]},   # optional
                 "fan_out": {"path": [<keys>], "as": <item field>}}                      # optional

One envelope becomes one Receipt; ``fan_out`` makes one item (one
ReceiptComponent) per element of the list at its path. ``gap_kind_prefixes``
(any route) names kinds that report a source gap; such items are
quarantined with ``source_gap_reported``.

Ordering shapes (the route's ``ordering`` object)::

    {"contract": "latest_source_position", "partition": [...], "position": [...], "tie_breaker": f,
     "comparator_version": "1"[, "settle_seconds": n]}
    {"contract": "strict_source_sequence", "partition": [...], "position": [f], "tie_breaker": f,
     "comparator_version": "1", "successor": {"first": n, "step": n},
     "gap": {"deadline_seconds": n, "disposition": "quarantine"}}
    {"contract": "order_independent", "conformance": "<why operations commute>"}
"""
from __future__ import annotations

import json
from typing import Any

from nexusflow.kernel import canonical_json
from nexusflow.kernel.digests import digest_v2

_MISSING = object()
_STREAM_KEYS = ("path", "topic", "topic_param", "cursor_param", "limit_param", "batch_limit", "events_field",
                "next_cursor_field")


def _path(value: Any, what: str) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(k, str) and k for k in value):
        raise ValueError(f"{what} must be a non-empty list of keys")
    return value


def validate_pull_route(route: dict) -> None:
    """Check a pulled route's ``stream``, ``auth``, ``transport_key`` and ``envelope`` blocks.

    Raises:
        ValueError: a missing block or key, or a value of the wrong shape.
    """
    stream = route.get("stream")
    if not isinstance(stream, dict):
        raise ValueError("a pulled route needs a 'stream' object")
    for key in _STREAM_KEYS:
        if key not in stream:
            raise ValueError(f"stream.{key} is missing")
    if stream.get("method", "GET") != "GET":
        raise ValueError("stream.method must be GET")
    limit = stream["batch_limit"]
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
        raise ValueError("stream.batch_limit must be an integer 1-1000")
    auth = route.get("auth")
    if not isinstance(auth, dict) or auth.get("mechanism") != "bearer" or not auth.get("header"):
        raise ValueError("a pulled route's auth is {'mechanism': 'bearer', 'header', 'scheme'}")
    if "credential_ref" not in route:
        raise ValueError("a pulled route needs a credential_ref")
    transport = route.get("transport_key")
    if not isinstance(transport, dict) or transport.get("kind") != "envelope_field":
        raise ValueError("a pulled route's transport_key is {'kind': 'envelope_field', 'path': [...]}")
    _path(transport.get("path"), "transport_key.path")
    envelope = route.get("envelope")
    if not isinstance(envelope, dict) or not isinstance(envelope.get("fields"), dict) or not envelope["fields"]:
        raise ValueError("a pulled route needs an 'envelope' with a non-empty 'fields' map")
    for name, path in envelope["fields"].items():
        _path(path, f"envelope.fields.{name}")
    for block in ("values", "fan_out"):
        if block in envelope:
            spec = envelope[block]
            if not isinstance(spec, dict) or not isinstance(spec.get("as"), str):
                raise ValueError(f"envelope.{block} needs 'path' and 'as'")
            _path(spec.get("path"), f"envelope.{block}.path")


def value_at(document: Any, path: list[str]) -> Any:
    """The value at ``path`` inside nested objects, or ``None`` when any key is absent."""
    for key in path:
        if not isinstance(document, dict) or key not in document:
            return None
        document = document[key]
    return document


def expand_envelope(route: dict, envelope: Any) -> list[Any]:
    """Turn one envelope into the flat items the route's schema classifies.

    Returns:
        One dict per element of the ``fan_out`` list (or one dict when the
        route has no fan-out or the list is empty or absent), holding the
        declared ``fields`` that are present, the ``values`` object and the
        fan-out element. A non-object envelope is returned as the only item
        (it is quarantined as ``item_not_object``).
    """
    spec = route.get("envelope")
    if spec is None:
        return [envelope]
    if not isinstance(envelope, dict):
        return [envelope]
    base: dict[str, Any] = {}
    for name, path in spec["fields"].items():
        value = value_at(envelope, path)
        if value is not None:
            base[name] = value
    values = spec.get("values")
    if values is not None:
        found = value_at(envelope, values["path"])
        if isinstance(found, dict):
            excluded = set(values.get("exclude", []))
            base[values["as"]] = {k: v for k, v in found.items() if k not in excluded}
    fan = spec.get("fan_out")
    targets = value_at(envelope, fan["path"]) if fan is not None else None
    if isinstance(targets, list) and targets:
        return [{**base, fan["as"]: target} for target in targets]
    return [base]


def envelope_transport_key(route: dict, envelope: Any) -> str:
    """The transport idempotency key of one pulled envelope.

    Derived from the opaque value at ``transport_key.path`` (never computed
    from another one); an envelope without it is keyed by its canonical
    content, so a redelivery of the same bytes still resolves one Receipt.
    """
    value = value_at(envelope, route["transport_key"]["path"])
    if value is None or isinstance(value, (dict, list, float, bool)):
        return digest_v2("connectors.transport-key", [
            ("route_key", route["route_key"]), ("envelope_content", canonical_json.dumps(envelope))]).hexdigest
    return digest_v2("connectors.transport-key", [
        ("route_key", route["route_key"]), ("envelope_key", canonical_json.dumps(value))]).hexdigest


def encode_cursor(value: Any) -> bytes:
    """Durable cursor bytes for an opaque source position (its canonical JSON)."""
    return canonical_json.dumps(value)


def render_cursor(cursor: bytes | None) -> str | None:
    """The request parameter text of stored cursor bytes: a string as is, any other JSON value as its text."""
    if cursor is None:
        return None
    value = json.loads(bytes(cursor).decode("utf-8"))
    return value if isinstance(value, str) else canonical_json.dumps(value).decode("utf-8")
