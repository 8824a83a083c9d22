"""HubSpot acceptance journeys against the CRM objects sandbox (``manage.py journeys run <name>``).

Set-up (:func:`stage`): the CRM sandbox as a process, ``journey_service.json``
(webhook account ``crm-webhooks`` and push account ``hubspot-crm`` whose base
URL is the sandbox), the pack, both credential generations, ``cutover
greenfield`` and the Flow ``Contact_Push_Customer_To_CRM`` (a customer
Contact is pushed to ``hubspot.contact``). Local records change only through
signed webhooks over HTTP (:class:`Crm`), as in production.

Journeys (seed 000 names them; seed 002 "Retry And Recovery Semantics"):

``out-409-recover``
    The contact already exists at the provider. The create is answered 409
    "Contact already exists. Existing ID: N"; recovery reads N, proves the
    identity and finalizes the link to N with no second POST; a later edit PATCHes N.
``out-409-create-frozen-recover``
    The same, while the local record's email changes after the create was
    frozen (the create is held in flight by the sandbox's delay fault):
    recovery compares the frozen request, and the change follows as a PATCH of N.
"""
from __future__ import annotations

import itertools
import json
import secrets
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from packs.journeys import Attributed, Harness, Journey, JourneyError, attribute_requests, register, request_key

PACK_DIR = Path(__file__).resolve().parent
SERVICE_FILE = PACK_DIR / "journey_service.json"
CONTACTS_PATH = "/crm/v3/objects/contacts"
CONTRACT = "hubspot.contact"


# --- set-up ------------------------------------------------------------------------------------------------
def stage(h: Harness, service_file: Path = SERVICE_FILE) -> None:
    """Start the CRM sandbox and configure, cut over and deploy the journey service (see module docstring).

    ``service_file`` is another service plan of the same shape (``journey_service.json`` by default).
    """
    from packs.journeys import ROOT

    service = json.loads(service_file.read_text(encoding="utf-8"))
    token, webhook_secret = "pat-journey-" + secrets.token_hex(12), secrets.token_hex(24)
    h.env["NEXUS_JOURNEY_CRM_TOKEN"], h.env["NEXUS_JOURNEY_WEBHOOK_SECRET"] = token, webhook_secret
    crm_url = h.start_sandbox("crm-sandbox", "packs.hubspot.crm_sandbox", "--token", token)
    org = service["org_id"]
    config = json.loads(json.dumps({"org_id": org, "accounts": service["accounts"]})
                        .replace("{crm_base_url}", crm_url))
    h.manage("connector_pack_publish", *[str(ROOT / p) for p in service["packs"]])
    h.manage("connector_credential_publish", "--org", org,
             str(h.write_file("credentials.json", service["credential_generations"])))
    h.manage("connector_config_apply", "--org", org, str(h.write_file("service.json", config)))
    h.manage("cutover", "greenfield", "--org", org)
    h.manage("flow_deploy", "--org", org, *[str(ROOT / f) for f in service["flows"]])
    h.values.update(crm=Crm(h, base_url=crm_url, token=token, webhook_secret=webhook_secret.encode(),
                            ingress=service["ingress"]), org=org)


class Crm:
    """The provider side of a journey: its webhooks into NexusFlow and its sandbox state and controls."""

    def __init__(self, h: Harness, *, base_url: str, token: str, webhook_secret: bytes, ingress: dict):
        self.h, self.base_url, self.token, self.webhook_secret, self.ingress = h, base_url, token, webhook_secret, ingress
        self.seeded = 0  # contacts the journey created at the provider directly (their POSTs are not NexusFlow's)
        self.own_requests: list[tuple[str, str, str]] = []  # request_key of each request the journey sent itself
        self._event_ids = itertools.count(1)
        self._clock = itertools.count(1_700_000_000_000, 1000)

    # -- webhooks (local record changes) ----------------------------------------------------------------
    def _event(self, object_id: int, prop: str | None = None, value: str | None = None) -> dict:
        event = {"eventId": next(self._event_ids), "subscriptionId": 101 if prop is None else 202, "portalId": 62515,
                 "appId": 54321, "occurredAt": next(self._clock), "attemptNumber": 0, "objectId": object_id,
                 "changeSource": "CRM_UI"}
        if prop is None:
            event.update({"subscriptionType": "contact.creation", "changeFlag": "NEW"})
        else:
            event.update({"subscriptionType": "contact.propertyChange", "propertyName": prop, "propertyValue": value})
        return event

    def post(self, events: list[dict]) -> int:
        """POST one signed webhook batch; returns the HTTP status."""
        return self.h.post_webhook(events, account_key=self.ingress["account_key"], channel=self.ingress["channel"],
                                   secret=self.webhook_secret)

    def contact_created(self, object_id: int, **properties: str) -> int:
        """A contact creation plus one property change per ``properties`` item, in one batch."""
        return self.post([self._event(object_id)] + [self._event(object_id, k, v) for k, v in properties.items()])

    def contact_changed(self, object_id: int, **properties: str) -> int:
        """Update a local record: one property change event per ``properties`` item, in one batch."""
        return self.post([self._event(object_id, k, v) for k, v in properties.items()])

    # -- the provider's own state -------------------------------------------------------------------------
    def _auth(self) -> dict:
        return {"Authorization": f"Bearer {self.token}"}

    def seed_contact(self, **properties: str) -> str:
        """Create a contact directly at the provider (as if made there before the push); returns its id."""
        body = json.dumps({"properties": properties}).encode("utf-8")
        response = httpx.post(self.base_url + CONTACTS_PATH, content=body, timeout=10,
                              headers={**self._auth(), "Content-Type": "application/json"})
        self.own_requests.append(request_key("POST", CONTACTS_PATH, body))
        if response.status_code != 201:
            raise JourneyError(f"seeding a provider contact answered {response.status_code}: {response.text}")
        self.seeded += 1
        return response.json()["id"]

    def state(self) -> dict:
        """The sandbox's ``/_sandbox/state``: contacts, companies, ``requests_by_route``."""
        return httpx.get(self.base_url + "/_sandbox/state", timeout=10).json()

    def set_faults(self, **faults: Any) -> dict:
        response = httpx.post(self.base_url + "/_sandbox/faults", json=faults, timeout=10)
        if response.status_code != 200:
            raise JourneyError(f"sandbox faults {faults} refused: {response.text}")
        return response.json()

    def routes(self) -> dict[str, int]:
        return self.state()["requests_by_route"]

    def request_log(self) -> list[dict]:
        """The sandbox's ``/_sandbox/requests``: every API request, oldest first, with its body digest."""
        return httpx.get(self.base_url + "/_sandbox/requests", timeout=10).json()["requests"]

    def attributed(self) -> list[Attributed]:
        """Every request the provider saw, attributed by correlation (:func:`packs.journeys.attribute_requests`)."""
        return attribute_requests(self.request_log(), path_prefix=urlsplit(self.base_url).path.rstrip("/"),
                                  own=self.own_requests)

    def pushed_creates(self) -> int:
        """Create POSTs NexusFlow sent (the provider's count minus the journey's own seeding POSTs)."""
        return self.routes().get(f"POST {CONTACTS_PATH}", 0) - self.seeded


def crm(h: Harness) -> Crm:
    return h.values["crm"]


def provider_report(h: Harness) -> dict:
    """What the provider saw: requests by method and path, and its final contacts."""
    state = crm(h).state()
    return {"requests_by_route": state["requests_by_route"], "seeded_by_journey": crm(h).seeded,
            "contacts": [{"id": c["id"], "properties": c["properties"], "archived": c["archived"],
                          "create_requests": c["create_requests"], "update_requests": c["update_requests"],
                          "conflict_requests": c["conflict_requests"]} for c in state["contacts"]]}


# --- local facts the checks read ------------------------------------------------------------------------------
def local_contact(object_id: int):
    """The local record the webhooks of ``object_id`` applied to (through its inbound link)."""
    from connectors.models import RemoteLink
    from nexusflow.records.models import Record

    link = RemoteLink.objects.exclude(action_type="PushToConnector").get(remote_id=str(object_id))
    return Record.objects.get(org_id=link.org_id, object_name=link.source_object, record_key=link.source_record_key)


def push_facts(object_id: int) -> dict:
    """The record's push link, effects (oldest first) and their attempts, as plain data."""
    from connectors.models import RemoteEffectAttempt, RemoteLink
    from runtime_outbox.models import IntentResultReceipt

    record = local_contact(object_id)
    links = list(RemoteLink.objects.filter(org_id=record.org_id, source_record_key=record.record_key,
                                           action_type="PushToConnector"))
    attempts = list(RemoteEffectAttempt.objects.filter(org_id=record.org_id,
                                                       effect__command__source_record_key=record.record_key)
                    .select_related("effect").order_by("effect_id", "attempt_number"))
    effects = {}
    for attempt in attempts:
        effects.setdefault(attempt.effect_id, attempt.effect)
    receipts = {r.command_id: r for r in IntentResultReceipt.objects.filter(
        command_id__in=[e.command_id for e in effects.values()])}
    return {
        "record": record,
        "links": [(link.remote_id, link.state) for link in links],
        "effects": [(e.state, e.remote_id, e.reason_code) for e in effects.values()],
        "receipts": [(receipts[e.command_id].outcome, receipts[e.command_id].remote_id)
                     if e.command_id in receipts else None for e in effects.values()],
        "attempts": [(a.operation, a.method, a.path, a.response_status, json.loads(bytes(a.request_body)))
                     for a in attempts],
    }


def _check_recovered(h: Harness, object_id: int, existing: str, *, frozen_email: str) -> dict:
    """Checks shared by both journeys right after the recovery: one POST, one read, linked to ``existing``."""
    facts = push_facts(object_id)
    routes = crm(h).routes()
    h.check_equal("NexusFlow sent exactly one create POST", crm(h).pushed_creates(), 1)
    h.check_equal("the candidate was read back once", routes.get(f"GET {CONTACTS_PATH}/{existing}", 0), 1)
    creates = [a for a in facts["attempts"] if a[0] == "create"]
    h.check_equal("one create attempt, answered 409", [(a[1], a[3]) for a in creates], [("POST", 409)])
    if creates:
        h.check_equal("the create sent the frozen email", creates[0][4]["properties"]["email"], frozen_email)
    h.check_equal("the push link finalized to the existing id", facts["links"], [(existing, "active")])
    h.check("the create effect finalized with the existing id",
            bool(facts["effects"]) and facts["effects"][0][:2] == ("finalized", existing), f"{facts['effects']}")
    h.check("Runtime received the finalized receipt for the create",
            bool(facts["receipts"]) and facts["receipts"][0] == ("finalized", existing), f"{facts['receipts']}")
    return facts


def _check_end(h: Harness, existing: str, *, expect_properties: dict, patches: int) -> None:
    from nexusflow.flows.models import FlowRun

    runs = sorted(FlowRun.objects.values_list("state", flat=True))
    h.check("every push Flow run succeeded (the Flows woke on their receipts)",
            bool(runs) and set(runs) == {"Succeeded"}, f"{runs}")
    state = crm(h).state()
    routes = state["requests_by_route"]
    live = [c for c in state["contacts"] if not c["archived"]]
    h.check_equal("the provider holds exactly one contact", [c["id"] for c in live], [existing])
    h.check_equal("still exactly one create POST from NexusFlow", crm(h).pushed_creates(), 1)
    h.check_equal("later edits PATCHed the existing id", routes.get(f"PATCH {CONTACTS_PATH}/{existing}", 0), patches)
    h.check_equal("no other PATCH", sum(n for r, n in routes.items() if r.startswith("PATCH ")), patches)
    if live:
        properties = {k: live[0]["properties"].get(k) for k in expect_properties}
        h.check_equal("the provider's contact holds the local values", properties, expect_properties)


# --- out-409-recover -------------------------------------------------------------------------------------------
def out_409_recover(h: Harness) -> None:
    c = crm(h)
    existing = c.seed_contact(email="ada@example.com", firstname="Ada", lastname="Old")
    c.contact_created(8101, email="Ada@Example.com", firstname="Ada", lastname="Lovelace")
    h.wait_idle()
    c.contact_changed(8101, lifecyclestage="customer")  # the Flow pushes the customer: a create
    h.wait_idle()
    _check_recovered(h, 8101, existing, frozen_email="Ada@Example.com")
    c.contact_changed(8101, lastname="King")
    h.wait_idle()
    facts = push_facts(8101)
    h.check("the edit's push finalized against the existing id",
            len(facts["receipts"]) == 2 and facts["receipts"][1] == ("finalized", existing), f"{facts['receipts']}")
    _check_end(h, existing, patches=1, expect_properties={
        "email": "Ada@Example.com", "firstname": "Ada", "lastname": "King", "lifecyclestage": "customer"})


# --- out-409-create-frozen-recover ---------------------------------------------------------------------------------
def out_409_create_frozen_recover(h: Harness) -> None:
    c = crm(h)
    existing = c.seed_contact(email="grace@example.com", firstname="Grace", lastname="Old")
    c.contact_created(8201, email="grace@example.com", firstname="Grace", lastname="Hopper")
    h.wait_idle()
    # Hold the create in flight at the provider so the local change lands after the create was frozen.
    c.set_faults(delay_seconds=2)
    c.contact_changed(8201, lifecyclestage="customer")
    h.wait_until("the create reached the provider",
                 lambda: c.pushed_creates() == 1)
    c.set_faults(delay_seconds=0)
    c.contact_changed(8201, email="grace.hopper@example.com")
    h.wait_idle()
    record = local_contact(8201)
    h.check_equal("the local record changed after the create was frozen", record.fields.get("email"),
                  "grace.hopper@example.com")
    _check_recovered(h, 8201, existing, frozen_email="grace@example.com")
    facts = push_facts(8201)
    h.check("the change followed as a push finalized against the existing id",
            len(facts["receipts"]) == 2 and facts["receipts"][1] == ("finalized", existing), f"{facts['receipts']}")
    _check_end(h, existing, patches=1, expect_properties={
        "email": "grace.hopper@example.com", "firstname": "Grace", "lastname": "Hopper",
        "lifecyclestage": "customer"})


register(Journey("out-409-recover",
                 "A create answered 409 'Existing ID: N' is proven by a read and linked to N; no second POST; "
                 "a later edit PATCHes N.", stage, out_409_recover, provider_report))
register(Journey("out-409-create-frozen-recover",
                 "As out-409-recover while the local email changes after the create was frozen: recovery uses "
                 "the frozen request; the change follows as a PATCH of N.", stage, out_409_create_frozen_recover,
                 provider_report))
