"""Loopback CRM objects sandbox: a HubSpot-style contacts and companies API for demos and tests.

Behaviour follows ``FACTS.md`` ("HubSpot-style CRM objects API"). Every API
response is JSON with ``Content-Type: application/json;charset=utf-8`` (204
has no body). Contact and company ids are decimal strings ("501", "502", ...)
from one sequence, never reused, not even after a reset. Timestamps are ISO 8601 UTC with
milliseconds (``2024-05-01T10:00:00.123Z``).

Endpoints (``{id}`` is the contact id, or its email with ``?idProperty=email``):

- ``POST /crm/v3/objects/contacts`` with ``{"properties": {name: text}}`` and
  optionally ``"associations": [{"to": {"id": <company id>}, "types":
  [{"associationCategory": "HUBSPOT_DEFINED", "associationTypeId": 279}]}]``
  (the v3 create-with-associations shape; HUBSPOT_DEFINED contact-to-company
  type ids are 1 (primary) and 279) -> 201 ``{"id", "properties",
  "createdAt", "updatedAt", "archived": false}``; an association to a company
  that does not exist or is archived -> 400 ``"category":
  "VALIDATION_ERROR"`` and nothing is created;
  an email another live contact holds (compared case-insensitively) -> 409
  ``{"status": "error", "message": "Contact already exists. Existing ID: <id>",
  "correlationId": <uuid>, "category": "CONFLICT"}`` and nothing is created;
- ``PATCH /crm/v3/objects/contacts/{id}`` -> 200 same shape; an empty string
  clears a property; a missing or archived contact -> 404 ``{"status": "error",
  "message": "resource not found", "correlationId"}``; an email held by another
  contact -> 409 as above, nothing changed;
- ``GET /crm/v3/objects/contacts/{id}`` -> 200 or 404;
- ``DELETE /crm/v3/objects/contacts/{id}`` -> 204 (archives it: later reads
  and updates are 404 and its email is free again) or 404;
- ``POST /crm/v3/objects/companies`` (``{"properties": {...}}`` of
  :data:`COMPANY_PROPERTIES`, no uniqueness rule), ``PATCH|GET|DELETE
  /crm/v3/objects/companies/{id}`` (by id only) behave like the contact
  routes. An update body carries ``properties`` only (associations -> 400).

``properties`` in a response hold the contact's properties plus the system
properties ``hs_object_id``, ``createdate`` and ``lastmodifieddate``. A request
property outside :data:`CONTACT_PROPERTIES`, a non-text value, a body that is
not ``{"properties": {...}}`` or invalid JSON -> 400 with ``"category":
"VALIDATION_ERROR"``; another content type -> 415. There are no idempotency
keys: an ``Idempotency-Key`` header is ignored, so a repeated create is a
second create (or a 409 once the email exists).

Every API request needs ``Authorization: Bearer <private app token>``; a
missing or wrong token -> 401 ``"category": "INVALID_AUTHENTICATION"``.

Per contact the sandbox counts ``create_requests`` (create requests that
created it: 1), ``update_requests`` (update requests executed on it) and
``conflict_requests`` (create/update requests refused with 409 because it
holds the email), and keeps the ``associations`` its create carried; per
company ``create_requests`` and ``update_requests``. ``requests`` counts every API request (any path outside
``/_sandbox``, rejected ones included) and ``requests_by_route`` counts them
by ``"<METHOD> <path>"`` (path without the query). The request log keeps
the same requests one by one, in arrival order, with the identity a client
can correlate them by: ``{"seq": n (1, 2, ...), "method", "path" (without
the query), "body_sha256": hex SHA-256 of the exact body bytes (of ``b""``
when there is none)}``. An entry is written when the request arrives, before
any fault delay, so a request held in flight is already logged.

Test controls (no auth): ``GET /_sandbox/state`` -> ``{"contacts": [{"id",
"properties", "archived", "create_requests", "update_requests",
"conflict_requests", "associations": [{"to": company id, "types": [...]}]}],
"companies": [{"id", "properties", "archived", "create_requests",
"update_requests"}], "requests": n, "requests_by_route": {...}}`` (oldest
first, ``properties`` without the system properties); ``GET
/_sandbox/requests`` -> ``{"requests": [<request log entry>, ...]}`` (oldest
first);
``POST /_sandbox/reset``; ``GET|POST /_sandbox/faults`` with any of
``{"drop_response_after_commit": N}`` (the next N create/update requests that
are executed, whatever their answer, are performed and then the connection is
closed without a response), ``{"fail_before_commit": {"status": S, "count":
N}}`` (the next N create/update requests get status S, 400-599, and are not
executed: 429 carries the provider's rate-limit body and
``X-HubSpot-RateLimit-*`` headers, 477 a ``Retry-After``) and
``{"delay_seconds": X}`` (every create/update waits X seconds, 0-60, before it
is executed, until changed).

Run as a process: ``python -m packs.hubspot.crm_sandbox --port 0 --token T
--port-file PATH`` writes the bound port to PATH once listening and serves
until SIGTERM or SIGINT.
"""
from __future__ import annotations

import datetime as dt
import itertools
import json
import re
import secrets
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import SplitResult, parse_qs

from packs.sandbox_kit import LoopbackSandbox, Rejected, SandboxHandler, SandboxState, serve_process, write_faults

CONTACTS_PATH = "/crm/v3/objects/contacts"
COMPANIES_PATH = "/crm/v3/objects/companies"
#: Properties a request may set (the contact properties this pack maps, plus two common ones).
CONTACT_PROPERTIES: tuple[str, ...] = ("email", "firstname", "lastname", "lifecyclestage", "phone", "company")
#: Company properties a request may set.
COMPANY_PROPERTIES: tuple[str, ...] = ("name", "domain", "city", "industry", "phone")
#: Association categories, and the HUBSPOT_DEFINED contact-to-company type ids (primary, unlabeled).
ASSOCIATION_CATEGORIES: tuple[str, ...] = ("HUBSPOT_DEFINED", "USER_DEFINED", "INTEGRATOR_DEFINED")
CONTACT_TO_COMPANY_TYPES: tuple[int, ...] = (1, 279)
SYSTEM_PROPERTIES: tuple[str, ...] = ("hs_object_id", "createdate", "lastmodifieddate")
JSON_CONTENT_TYPE = "application/json;charset=utf-8"
ID_PROPERTIES: tuple[str, ...] = ("hs_object_id", "email")
FIRST_ID = 501
RATE_LIMIT_HEADERS: dict[str, str] = {
    "X-HubSpot-RateLimit-Interval-Milliseconds": "10000",
    "X-HubSpot-RateLimit-Max": "100",
    "X-HubSpot-RateLimit-Remaining": "0",
    "X-HubSpot-RateLimit-Daily": "250000",
    "X-HubSpot-RateLimit-Daily-Remaining": "249000",
}

_CONTACT_PATH = re.compile(re.escape(CONTACTS_PATH) + r"/([^/]+)")
_COMPANY_PATH = re.compile(re.escape(COMPANIES_PATH) + r"/([^/]+)")


def _rejected(status: int, body: dict[str, Any] | None, headers: dict[str, str] | None = None) -> Rejected:
    """A request error that maps to one HTTP response (``body`` None: no body)."""
    return Rejected(status, body, headers, message=str((body or {}).get("message", "")))


@dataclass(slots=True)
class _State(SandboxState):
    """Everything the sandbox remembers (``secret`` is the private app token); guarded by ``lock``."""

    contacts: dict[str, dict[str, Any]] = field(default_factory=dict)
    counters: dict[str, dict[str, int]] = field(default_factory=dict)
    companies: dict[str, dict[str, Any]] = field(default_factory=dict)
    company_counters: dict[str, dict[str, int]] = field(default_factory=dict)
    ids: Any = field(default_factory=lambda: itertools.count(FIRST_ID))  # never reset: ids are not reused

    def forget(self) -> None:
        self.contacts.clear()
        self.counters.clear()
        self.companies.clear()
        self.company_counters.clear()

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {
                "contacts": [
                    {
                        "id": contact_id,
                        "properties": dict(contact["properties"]),
                        "archived": contact["archived"],
                        **self.counters[contact_id],
                        "associations": [{"to": item["to"], "types": [dict(t) for t in item["types"]]}
                                         for item in contact["associations"]],
                    }
                    for contact_id, contact in self.contacts.items()
                ],
                "companies": [
                    {
                        "id": company_id,
                        "properties": dict(company["properties"]),
                        "archived": company["archived"],
                        **self.company_counters[company_id],
                    }
                    for company_id, company in self.companies.items()
                ],
                "requests": self.requests.count,
                "requests_by_route": self.requests.by_route(),
            }

    def holder_of(self, email: str, *, other_than: str | None = None) -> str | None:
        """The id of the live contact holding ``email`` (case-insensitive), lock held."""
        wanted = email.lower()
        for contact_id, contact in self.contacts.items():
            held = contact["properties"].get("email")
            if not contact["archived"] and contact_id != other_than and held is not None and held.lower() == wanted:
                return contact_id
        return None


class CrmSandbox(LoopbackSandbox):
    """An in-process CRM objects sandbox on ``127.0.0.1``, served from a daemon thread.

    Usage::

        with CrmSandbox("pat-test-token") as sandbox:
            httpx.post(f"{sandbox.base_url}/crm/v3/objects/contacts", json={"properties": {...}},
                       headers={"Authorization": "Bearer pat-test-token"})
    """

    handler_class: type[BaseHTTPRequestHandler]  # set below, once _SandboxHandler exists
    thread_name = "crm-sandbox"

    def __init__(self, token: str, *, port: int = 0):
        """Prepare a sandbox accepting ``Bearer token``; ``port`` 0 picks a free port.

        Raises:
            ValueError: an empty token or a port outside 0-65535.
        """
        if not token:
            raise ValueError("token must be non-empty")
        super().__init__(_State(secret=token, faults=write_faults()), port=port)

    def request_log(self) -> list[dict[str, Any]]:
        """The same list as ``GET /_sandbox/requests`` answers under ``"requests"``, oldest first."""
        return self._state.log()

    def company(self, company_id: str) -> dict[str, Any] | None:
        """The company row of ``state()`` with ``company_id``, or ``None``."""
        return next((row for row in self.state()["companies"] if row["id"] == company_id), None)

    def contact_by_email(self, email: str) -> dict[str, Any] | None:
        """The live contact row of ``state()`` holding ``email`` (case-insensitive), or ``None``."""
        wanted = email.lower()
        for contact in self.state()["contacts"]:
            held = contact["properties"].get("email")
            if not contact["archived"] and held is not None and held.lower() == wanted:
                return contact
        return None


class _SandboxHandler(SandboxHandler):
    content_type = JSON_CONTENT_TYPE
    request_log_control = True

    def serve(self, method: str, url: SplitResult, body: bytes) -> None:
        state = self.server.state
        path = url.path
        if not path.startswith("/crm/"):
            raise _rejected(404, _not_found())
        self._authenticate()
        query = parse_qs(url.query, keep_blank_values=True)
        if method == "POST" and path == CONTACTS_PATH:
            self._write(body, locator=None, query=query)
        elif method == "POST" and path == COMPANIES_PATH:
            self._write(body, locator=None, query=query, companies=True)
        elif (match := _COMPANY_PATH.fullmatch(path)) and method in ("GET", "PATCH", "DELETE"):
            self._company(method, match.group(1), body, query)
        elif (match := _CONTACT_PATH.fullmatch(path)) and method in ("GET", "PATCH", "DELETE"):
            locator = match.group(1)
            if method == "PATCH":
                self._write(body, locator=locator, query=query)
            elif method == "GET":
                with state.lock:
                    contact_id = self._resolve(locator, query)
                    found = _render(state.contacts[contact_id])
                self.send_json(200, found)
            else:
                with state.lock:
                    contact_id = self._resolve(locator, query)
                    state.contacts[contact_id]["archived"] = True
                    state.contacts[contact_id]["updatedAt"] = _now()
                self.send_json(204, None)
        else:
            raise _rejected(404, _not_found())

    def invalid(self, message: str) -> dict[str, Any]:
        return _validation(message)

    def unknown_control(self, method: str, path: str) -> Rejected:
        return _rejected(404, _not_found())

    def internal_error(self) -> dict[str, Any]:
        return _error("internal error")

    # -- /crm --------------------------------------------------------------------

    def _authenticate(self) -> None:
        header = self.headers.get("Authorization")
        if not header:
            raise _rejected(401, _error(
                "Authentication credentials not found. This API supports both API Key and OAuth 2.0 "
                "authentication.", category="INVALID_AUTHENTICATION"))
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(
            token.encode("utf-8", "surrogateescape"), self.server.state.secret.encode("utf-8")
        ):
            raise _rejected(401, _error("The access token provided is invalid.", category="INVALID_AUTHENTICATION"))

    def _resolve(self, locator: str, query: dict[str, list[str]]) -> str:
        """The id of the live contact ``locator`` names (state lock held), or raise 400/404."""
        state = self.server.state
        id_property = query.get("idProperty", ["hs_object_id"])[-1]
        if id_property not in ID_PROPERTIES:
            raise _rejected(400, _validation(f"idProperty {id_property!r} is not a unique property"))
        if id_property == "email":
            contact_id = state.holder_of(locator)
        else:
            contact = state.contacts.get(locator)
            contact_id = locator if contact is not None and not contact["archived"] else None
        if contact_id is None:
            raise _rejected(404, _not_found())
        return contact_id

    def _company(self, method: str, locator: str, body: bytes, query: dict[str, list[str]]) -> None:
        """``GET|PATCH|DELETE`` one company by id (state lock taken here)."""
        state = self.server.state
        if method == "PATCH":
            self._write(body, locator=locator, query=query, companies=True)
            return
        with state.lock:
            company_id = self._resolve_company(locator)
            if method == "GET":
                found = _render(state.companies[company_id])
            else:
                state.companies[company_id]["archived"] = True
                state.companies[company_id]["updatedAt"] = _now()
                found = None
        self.send_json(200 if method == "GET" else 204, found)

    def _resolve_company(self, locator: str) -> str:
        """The id of the live company ``locator`` names (state lock held), or raise 404."""
        company = self.server.state.companies.get(locator)
        if company is None or company["archived"]:
            raise _rejected(404, _not_found())
        return locator

    def _write(self, body: bytes, *, locator: str | None, query: dict[str, list[str]],
               companies: bool = False) -> None:
        """Create (``locator`` None) or update one contact (or company), honouring the faults."""
        state = self.server.state
        properties, associations = self._document(body, COMPANY_PROPERTIES if companies else CONTACT_PROPERTIES,
                                                  associations=locator is None and not companies)
        with state.lock:
            failure = state.faults.take_status("fail_before_commit")
        if failure is not None:
            raise _injected(failure)
        state.faults.wait("delay_seconds")
        with state.lock:
            try:
                if companies:
                    status, payload = self._execute_company(properties, locator=locator)
                else:
                    status, payload = self._execute(properties, locator=locator, query=query,
                                                    associations=associations)
            except Rejected as exc:
                status, payload, headers = exc.status, exc.body, exc.headers
            else:
                headers = {}
            drop = state.faults.take("drop_response_after_commit")
        if drop:
            self.drop_response()
            return
        self.send_json(status, payload, headers=headers)

    def _execute_company(self, properties: dict[str, str], *, locator: str | None) -> tuple[int, dict[str, Any]]:
        """Perform a company create/update under the state lock; return (status, body) or raise 404."""
        state = self.server.state
        now = _now()
        if locator is None:
            company_id = str(next(state.ids))
            company = {"id": company_id, "properties": {k: v for k, v in properties.items() if v != ""},
                       "createdAt": now, "updatedAt": now, "archived": False}
            state.companies[company_id] = company
            state.company_counters[company_id] = {"create_requests": 1, "update_requests": 0}
            return 201, _render(company)
        company_id = self._resolve_company(locator)
        company = state.companies[company_id]
        for name, value in properties.items():
            if value == "":
                company["properties"].pop(name, None)
            else:
                company["properties"][name] = value
        company["updatedAt"] = now
        state.company_counters[company_id]["update_requests"] += 1
        return 200, _render(company)

    def _execute(self, properties: dict[str, str], *, locator: str | None, query: dict[str, list[str]],
                 associations: list[dict[str, Any]] | None = None) -> tuple[int, dict[str, Any]]:
        """Perform a create/update under the state lock; return (status, body) or raise 400/404/409.

        A create's associations must each name a live company (else 400, nothing created).
        """
        state = self.server.state
        now = _now()
        if locator is None:
            unknown = [item["to"]["id"] for item in associations or []
                       if item["to"]["id"] not in state.companies or state.companies[item["to"]["id"]]["archived"]]
            if unknown:
                raise _rejected(400, _validation(
                    f"One or more associations are invalid: no company with id(s) {', '.join(unknown)}"))
            email = properties.get("email")
            holder = state.holder_of(email) if email else None
            if holder is not None:
                state.counters[holder]["conflict_requests"] += 1
                raise _rejected(409, _conflict(holder))
            contact_id = str(next(state.ids))
            contact = {"id": contact_id, "properties": {k: v for k, v in properties.items() if v != ""},
                       "createdAt": now, "updatedAt": now, "archived": False,
                       "associations": [{"to": item["to"]["id"], "types": item["types"]}
                                        for item in associations or []]}
            state.contacts[contact_id] = contact
            state.counters[contact_id] = {"create_requests": 1, "update_requests": 0, "conflict_requests": 0}
            return 201, _render(contact)
        contact_id = self._resolve(locator, query)
        email = properties.get("email")
        holder = state.holder_of(email, other_than=contact_id) if email else None
        if holder is not None:
            state.counters[holder]["conflict_requests"] += 1
            raise _rejected(409, _conflict(holder))
        contact = state.contacts[contact_id]
        for name, value in properties.items():
            if value == "":
                contact["properties"].pop(name, None)
            else:
                contact["properties"][name] = value
        contact["updatedAt"] = now
        state.counters[contact_id]["update_requests"] += 1
        return 200, _render(contact)

    def _document(self, body: bytes, allowed: tuple[str, ...], *,
                  associations: bool) -> tuple[dict[str, str], list[dict[str, Any]]]:
        """Parse ``{"properties": {name: text}}`` (plus ``"associations"`` when allowed) or raise 400/415."""
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if content_type != "application/json":
            raise _rejected(415, _error(f"Unsupported Content-Type {content_type!r}; send application/json.",
                                        category="VALIDATION_ERROR"))
        try:
            document = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise _rejected(400, _validation(f"Invalid input JSON: {exc}")) from exc
        if not isinstance(document, dict) or not isinstance(document.get("properties"), dict) \
                or set(document) - ({"properties", "associations"} if associations else {"properties"}):
            raise _rejected(400, _validation(
                'The body must be {"properties": {...}}' + (' with optional "associations": [...].'
                                                            if associations else '.')))
        invalid = []
        for name, value in document["properties"].items():
            if name not in allowed:
                invalid.append({"isValid": False, "message": f'Property "{name}" does not exist',
                                "error": "PROPERTY_DOESNT_EXIST", "name": name})
            elif not isinstance(value, str):
                invalid.append({"isValid": False, "message": f"{json.dumps(value)} is not a valid text value",
                                "error": "INVALID_OPTION", "name": name})
        if invalid:
            raise _rejected(400, _validation(
                "Property values were not valid: " + json.dumps(invalid, separators=(",", ":"))))
        return dict(document["properties"]), _associations(document.get("associations", []))


def _now() -> str:
    """The current UTC time as ``YYYY-MM-DDTHH:MM:SS.mmmZ``."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _render(contact: dict[str, Any]) -> dict[str, Any]:
    """The provider's object shape for one stored contact."""
    properties = dict(contact["properties"])
    properties.update({"hs_object_id": contact["id"], "createdate": contact["createdAt"],
                       "lastmodifieddate": contact["updatedAt"]})
    return {"id": contact["id"], "properties": properties, "createdAt": contact["createdAt"],
            "updatedAt": contact["updatedAt"], "archived": contact["archived"]}


def _associations(items: Any) -> list[dict[str, Any]]:
    """Validate a create's ``associations`` list (shape and contact-to-company types) or raise 400."""
    bad = _rejected(400, _validation(
        'associations must be [{"to": {"id": "<id>"}, "types": [{"associationCategory": "HUBSPOT_DEFINED", '
        '"associationTypeId": 279}]}]'))
    if not isinstance(items, list):
        raise bad
    out = []
    for item in items:
        if not isinstance(item, dict) or set(item) != {"to", "types"} or not isinstance(item["to"], dict) \
                or set(item["to"]) != {"id"} or not isinstance(item["to"]["id"], str) or not item["to"]["id"] \
                or not isinstance(item["types"], list) or not item["types"]:
            raise bad
        for kind in item["types"]:
            if not isinstance(kind, dict) or set(kind) != {"associationCategory", "associationTypeId"} \
                    or kind["associationCategory"] not in ASSOCIATION_CATEGORIES \
                    or isinstance(kind["associationTypeId"], bool) or not isinstance(kind["associationTypeId"], int) \
                    or kind["associationTypeId"] <= 0:
                raise bad
            if kind["associationCategory"] == "HUBSPOT_DEFINED" \
                    and kind["associationTypeId"] not in CONTACT_TO_COMPANY_TYPES:
                raise _rejected(400, _validation(
                    f"associationTypeId {kind['associationTypeId']} is not a contact to company association type"))
        out.append({"to": {"id": item["to"]["id"]}, "types": [dict(kind) for kind in item["types"]]})
    return out


def _error(message: str, *, category: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"status": "error", "message": message, "correlationId": str(uuid.uuid4())}
    if category is not None:
        body["category"] = category
    return body


def _validation(message: str) -> dict[str, Any]:
    return _error(message, category="VALIDATION_ERROR")


def _not_found() -> dict[str, Any]:
    return _error("resource not found")


def _conflict(existing_id: str) -> dict[str, Any]:
    return _error(f"Contact already exists. Existing ID: {existing_id}", category="CONFLICT")


def _injected(status: int) -> Rejected:
    """The provider's answer for an injected failure before commit."""
    if status == 429:
        body = {"status": "error", "message": "You have reached your ten_secondly_rolling limit.",
                "errorType": "RATE_LIMIT", "correlationId": str(uuid.uuid4()), "policyName": "TEN_SECONDLY_ROLLING"}
        return _rejected(429, body, dict(RATE_LIMIT_HEADERS))
    if status == 477:
        return _rejected(477, _error("This portal is being migrated; retry later.",
                                     category="MIGRATION_IN_PROGRESS"), {"Retry-After": "1"})
    return _rejected(status, _error(f"Injected failure before commit (HTTP {status}); nothing was performed."))


CrmSandbox.handler_class = _SandboxHandler


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the sandbox as a process until SIGTERM/SIGINT; return the exit status."""
    return serve_process(argv, description="Loopback CRM objects (contacts, companies) API sandbox.",
                         secret_flag="--token", secret_help="the private app token clients must present as Bearer",
                         build=CrmSandbox)


if __name__ == "__main__":
    raise SystemExit(main())
