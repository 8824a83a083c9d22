"""Create-conflict recovery: a provider's "already exists" answer to a create, proven before it is trusted.

Seed 002 "Lifecycle" and "Retry And Recovery Semantics": ambiguity is parked
for reconciliation, never guessed, and a create is never repeated blindly.
Some providers refuse a create whose unique identity already exists and name
the existing record in the refusal. A push contract (L1 data) may declare how
to read that candidate and how to prove it is the record this create meant::

    "create_conflict_recovery": {
        "statuses": [409],                          # create answers that may name an existing record
        "existing_id": {"json_path": "message",     # dotted path into the JSON answer
                        "pattern": "Existing ID: (\\d+)"},   # optional; exactly one group
        "verify": {"method": "GET",                 # a read: GET only
                   "path": "/objects/{remote_id}",  # relative to the frozen base URL
                   "identity": [{"request": "email",            # field of the frozen request body
                                 "remote": "properties.email",  # dotted path in the read's JSON
                                 "compare": "casefold"}]}}      # or "exact"

This module is the neutral interpretation of that block: validation at pack
publication, candidate extraction at settlement and the identity verdict of
the verify read. The egress adapter (:mod:`connectors.outbound.egress`) owns the state
changes and the I/O.
"""
from __future__ import annotations

import json
import re
import urllib.parse

from nexusflow.kernel.errors import InvalidIdentity
from nexusflow.kernel.identity import canonical_locator

KEY = "create_conflict_recovery"
COMPARATORS = ("exact", "casefold")
#: Verify-read statuses that prove the candidate does not exist (any other non-2xx is transient).
GONE_STATUSES = (404, 410)

MATCH = "match"
MISMATCH = "mismatch"
GONE = "gone"
TRANSIENT = "transient"

_PLACEHOLDER = "{remote_id}"
_LOCATOR_MAX = 160


def _dotted(value: str, where: str) -> None:
    if not isinstance(value, str) or not value or any(not part for part in value.split(".")) \
            or value != value.strip():
        raise ValueError(f"{where} must be a non-empty dotted JSON path")


def validate(contract: dict) -> None:
    """Check a push contract's ``create_conflict_recovery`` block, if it declares one.

    Args:
        contract: one push contract of a pack document.

    Raises:
        ValueError: not an object, unknown or missing keys, a status outside
            400-499, an ``existing_id`` without a JSON path or with a pattern
            that does not compile to exactly one group, a verify that is not a
            ``GET`` of a path with ``{remote_id}``, an empty identity, an
            identity entry with unknown keys or comparator, or a JSON contract
            body (the frozen request body is read back to compare identity).

    Seed 002 "Retry And Recovery Semantics".
    """
    if KEY not in contract:
        return
    block = contract[KEY]
    name = f"push contract {contract.get('contract_key')}: {KEY}"
    if not isinstance(block, dict):
        raise ValueError(f"{name} must be a JSON object")
    if set(block) != {"statuses", "existing_id", "verify"}:
        raise ValueError(f"{name} must have exactly statuses, existing_id and verify")
    statuses = block["statuses"]
    if not isinstance(statuses, list) or not statuses or not all(
            isinstance(s, int) and not isinstance(s, bool) and 400 <= s <= 499 for s in statuses):
        raise ValueError(f"{name}.statuses must be a non-empty list of 4xx statuses")
    existing = block["existing_id"]
    if not isinstance(existing, dict) or not set(existing) <= {"json_path", "pattern"} or "json_path" not in existing:
        raise ValueError(f"{name}.existing_id must be an object with json_path and an optional pattern")
    _dotted(existing["json_path"], f"{name}.existing_id.json_path")
    if "pattern" in existing:
        try:
            pattern = re.compile(existing["pattern"]) if isinstance(existing["pattern"], str) else None
        except re.error as exc:
            raise ValueError(f"{name}.existing_id.pattern does not compile: {exc}") from None
        if pattern is None or pattern.groups != 1:
            raise ValueError(f"{name}.existing_id.pattern must be a regular expression with exactly one group")
    verify = block["verify"]
    if not isinstance(verify, dict) or set(verify) != {"method", "path", "identity"}:
        raise ValueError(f"{name}.verify must have exactly method, path and identity")
    if verify["method"] != "GET":
        raise ValueError(f"{name}.verify.method must be GET: the verification is a read")
    path = verify["path"]
    if not isinstance(path, str) or not path.startswith("/") or path.count(_PLACEHOLDER) != 1:
        raise ValueError(f"{name}.verify.path must start with '/' and hold {_PLACEHOLDER!r} once")
    identity = verify["identity"]
    if not isinstance(identity, list) or not identity:
        raise ValueError(f"{name}.verify.identity must list at least one identity field")
    for position, entry in enumerate(identity):
        where = f"{name}.verify.identity[{position}]"
        if not isinstance(entry, dict) or set(entry) != {"request", "remote", "compare"}:
            raise ValueError(f"{where} must have exactly request, remote and compare")
        _dotted(entry["request"], f"{where}.request")
        _dotted(entry["remote"], f"{where}.remote")
        if entry["compare"] not in COMPARATORS:
            raise ValueError(f"{where}.compare must be one of {list(COMPARATORS)}")
    if contract.get("body_encoding", "json") != "json":
        raise ValueError(f"{name} needs a JSON request body")


def recovery_of(contract: dict) -> dict | None:
    """The contract's validated recovery block, or ``None`` when it declares none."""
    block = contract.get(KEY)
    return block if isinstance(block, dict) else None


def _at(value, path: str):
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _json(body: bytes):
    try:
        return json.loads(bytes(body).decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None


def existing_id(contract: dict, *, status: int | None, body: bytes) -> str | None:
    """The existing remote id a refused create names, or ``None``.

    Args:
        contract: the frozen push contract.
        status: the create's HTTP status (``None``: no answer).
        body: the answer's bytes.

    Returns:
        A canonical locator when the contract declares recovery, ``status`` is
        one of its statuses and the body yields an id; otherwise ``None`` (the
        answer keeps its ordinary classification).
    """
    block = recovery_of(contract)
    if block is None or status not in block["statuses"]:
        return None
    value = _at(_json(body), block["existing_id"]["json_path"])
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return None
    if "pattern" in block["existing_id"]:
        if not isinstance(value, str):
            return None
        match = re.search(block["existing_id"]["pattern"], value)
        if match is None or match.group(1) is None:
            return None
        value = match.group(1)
    try:
        return canonical_locator(value, field="existing remote id", max_length=_LOCATOR_MAX)
    except InvalidIdentity:
        return None


def verify_path(contract: dict, remote_id: str) -> str:
    """The verify read's path for ``remote_id`` (percent-encoded into the placeholder)."""
    return recovery_of(contract)["verify"]["path"].replace(_PLACEHOLDER, urllib.parse.quote(remote_id, safe=""))


def request_fields(contract: dict, request_body: bytes) -> dict | None:
    """The fields of a frozen JSON create body (unwrapped from ``body_wrap``), or ``None`` if unreadable."""
    document = _json(request_body)
    if isinstance(document, dict) and contract.get("body_wrap"):
        document = document.get(contract["body_wrap"])
    return document if isinstance(document, dict) else None


def _same(left, right, compare: str) -> bool:
    if not isinstance(left, str) or not isinstance(right, str) or not left or not right:
        return False
    if compare == "casefold":
        return left.casefold() == right.casefold()
    return left == right


def judge(contract: dict, *, request: dict | None, status: int | None, body: bytes) -> tuple[str, list[str]]:
    """Decide what a verify read proves about the candidate.

    Args:
        request: the frozen create request's fields (:func:`request_fields`).
        status: the read's HTTP status, ``None`` when no answer arrived.
        body: the read's bytes.

    Returns:
        ``(verdict, mismatched identity request fields)`` with verdict
        :data:`MATCH` (every identity field present on both sides and equal),
        :data:`MISMATCH`, :data:`GONE` (404/410) or :data:`TRANSIENT` (no
        answer, any other status, or a 2xx body that is not JSON: read again later).
    """
    if status in GONE_STATUSES:
        return GONE, []
    if status is None or not 200 <= status < 300:
        return TRANSIENT, []
    remote = _json(body)
    if not isinstance(remote, dict):
        return TRANSIENT, []
    if request is None:
        return MISMATCH, ["<request body unreadable>"]
    differing = [entry["request"] for entry in recovery_of(contract)["verify"]["identity"]
                 if not _same(_at(request, entry["request"]), _at(remote, entry["remote"]), entry["compare"])]
    return (MISMATCH if differing else MATCH), differing
