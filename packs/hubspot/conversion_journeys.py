"""HubSpot lead-conversion acceptance journeys (``manage.py journeys run bi-conv-01|post-convert-contact-storm``).

Set-up (:func:`stage_bidirectional`): as :func:`packs.hubspot.journeys.stage`
with ``journey_service_bidirectional.json``: the webhook account and the push
account share one ``remote_scope`` (the provider portal), the push account
also serves ``hubspot.lead`` (same destination slot as contacts), and two
Flows are deployed: ``Lead_Push_To_CRM`` (every lead with an email) and
``Contact_Push_Customer_To_CRM`` (a customer contact). A lead is therefore
synced both ways: pushed out, and webhooks about its remote id apply to it
through its push link. Local edits go through the record REST endpoints as an
operator (HTTP basic, an ``org:<org>`` staff user); conversion and merge
through the identity transfer endpoints.

What a step sent to the provider is checked by correlation, never by counting
requests before and after it: the sandbox's request log is attributed to the
push attempts that sent each request (:meth:`Crm.attributed
<packs.hubspot.journeys.Crm.attributed>`), and an intent to the save that
authored it (:func:`save_intent`). The conversion made no provider request
when every request belongs to an intent its owner check found terminal and
no intent was authored since (:func:`check_converted`).

Journeys (seed 000 names them; seed 000 "Transfer", seed 002 identity model):

``bi-conv-01``
    A lead created over REST is pushed (one POST, remote contact N); a webhook
    about N changes the lead; the lead is converted to a contact over REST:
    remote authority moves once with no provider request (the lead's link
    retired with evidence, the contact's link active on N); a later contact
    edit PATCHes N and a later webhook about N applies to the contact.
``post-convert-contact-storm``
    As bi-conv-01, but the conversion races the lead's unfinished PATCH (held
    in flight by the sandbox's delay fault): it answers 409
    ``owner_outbound_pending`` with ``Retry-After`` and succeeds on retry.
    Then a burst from several threads: webhooks about N, REST edits of the
    contact, and a merge of a local-only duplicate contact into it while its
    pushes are in flight (retryable 409s, retried until they succeed). The
    local contact and the provider's contact N converge.
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import httpx

from packs.hubspot.journeys import CONTACTS_PATH, PACK_DIR, crm, stage
from packs.journeys import Attributed, Harness, Journey, JourneyError, register

SERVICE_FILE = PACK_DIR / "journey_service_bidirectional.json"
#: The fields both push contracts map (local field == provider property).
MAPPED = ("email", "firstname", "lastname", "lifecyclestage")
OPERATOR_USER = "journey-operator"
MAX_TRIES = 60


# --- set-up ------------------------------------------------------------------------------------------------
def stage_bidirectional(h: Harness, service_file: Path = SERVICE_FILE) -> None:
    """Stage the bidirectional service (see the module docstring)."""
    stage(h, service_file=service_file)


class Operator:
    """An operator client of the record REST endpoints; counts the retryable conflicts it saw, per label."""

    def __init__(self, h: Harness, *, username: str, password: str):
        self.base, self.auth = h.web_base, (username, password)
        self.conflicts: Counter[str] = Counter()
        self.conflict_codes: dict[str, set[str]] = {}
        self.retry_after_missing = 0
        self.failed: list[str] = []
        self._lock = threading.Lock()

    def call(self, method: str, path: str, body: dict) -> httpx.Response:
        try:
            return httpx.request(method, self.base + path, json=body, auth=self.auth, timeout=30)
        except httpx.HTTPError as exc:
            raise JourneyError(f"{method} {path} failed: {exc}") from None

    def until_done(self, label: str, method: str, path: str, body: dict) -> httpx.Response:
        """Send until the answer is not a retryable 409, waiting ``Retry-After`` seconds between tries."""
        for _ in range(MAX_TRIES):
            response = self.call(method, path, body)
            retry_after = response.headers.get("Retry-After")
            if response.status_code != 409 or retry_after is None:
                if response.status_code == 409:
                    with self._lock:
                        self.retry_after_missing += 1
                if response.status_code >= 300:
                    with self._lock:
                        self.failed.append(f"{label}: {response.status_code} {response.text[:200]}")
                return response
            with self._lock:
                self.conflicts[label] += 1
                self.conflict_codes.setdefault(label, set()).add(response.json().get("error", ""))
            time.sleep(float(retry_after))
        raise JourneyError(f"{label}: still conflicting after {MAX_TRIES} tries")

    def create(self, object_name: str, **fields: str) -> dict:
        response = self.until_done(f"create {object_name}", "POST", f"/api/v2/records/{object_name}/",
                                   {"fields": fields})
        if response.status_code != 201:
            raise JourneyError(f"creating a {object_name} answered {response.status_code}: {response.text}")
        return response.json()

    def edit(self, label: str, object_name: str, key: str, **fields: str) -> httpx.Response:
        return self.until_done(label, "PATCH", f"/api/v2/records/{object_name}/{key}/", {"fields": fields})


def operator(h: Harness) -> Operator:
    """Create the journey's operator (a staff user of the journey org) once and return its client."""
    if "operator" not in h.values:
        import secrets

        from django.contrib.auth.models import Group, User

        password = secrets.token_hex(16)
        user = User.objects.create_user(OPERATOR_USER, password=password, is_staff=True)
        user.groups.add(Group.objects.get_or_create(name=f"org:{h.values['org']}")[0])
        h.values["operator"] = Operator(h, username=OPERATOR_USER, password=password)
    return h.values["operator"]


# --- local facts ---------------------------------------------------------------------------------------------
def record(object_name: str, key: str):
    from nexusflow.records.models import Record

    return Record.objects.get(object_name=object_name, record_key=key)


def push_links(object_name: str, key: str) -> list[tuple[str, str]]:
    """``(remote_id, state)`` of every push link of the record, oldest first."""
    from connectors.models import RemoteLink

    return [(link.remote_id, link.state) for link in RemoteLink.objects.filter(
        source_object=object_name, source_record_key=key, action_type="PushToConnector").order_by("id")]


def all_links() -> list[tuple[str, str, str]]:
    """``(source object, remote_id, state)`` of every link (push and inbound)."""
    from connectors.models import RemoteLink

    return [(link.source_object, link.remote_id, link.state) for link in RemoteLink.objects.order_by("id")]


def push_in_flight(object_name: str, key: str) -> bool:
    """Whether a PATCH/POST of the record's pushes may be at the provider now (its permit is ``sending``)."""
    from connectors.models import DispatchPermit

    return DispatchPermit.objects.filter(state="sending", attempt__effect__command__source_object=object_name,
                                         attempt__effect__command__source_record_key=key).exists()


def mapped(fields: dict) -> dict:
    return {name: fields.get(name) for name in MAPPED}


def provider_contact(h: Harness, remote_id: str) -> dict | None:
    return next((c for c in crm(h).state()["contacts"] if c["id"] == remote_id), None)


def save_intent(object_name: str, key: str, version: int) -> int | None:
    """The outbound intent the record-triggered Flow run of one save (``version``) authored, or ``None`` yet."""
    from nexusflow.flows.models import FlowRun
    from runtime_outbox.models import OutboundCommand

    runs = list(FlowRun.objects.filter(trigger_object_name=object_name, record_key=key, record_version=version)
                .values_list("id", flat=True))
    found = OutboundCommand.objects.filter(origin_flow_run_id__in=runs).values_list("id", flat=True).first()
    return None if found is None else int(found)


def conversion_fact(lead_key: str):
    from nexusflow.records.models import IdentityTransfer

    return IdentityTransfer.objects.get(kind="convert", source_object="Lead", source_record_key=lead_key)


def terminal_at_transfer(transfer) -> set[int]:
    """Ids of the outbound intents the transfer's owner check found terminal (its ``owner_intents``)."""
    return {int(intent["command_id"]) for side in transfer.owner_intents.values() for intent in side
            if intent["state"] == "terminal"}


def requests_since(attributed: list[Attributed], transfer) -> list[dict]:
    """Provider requests not proven to predate ``transfer``: sent for no intent, or for one it did not find terminal.

    An intent the transfer's owner check found terminal (seed 000: under the owner fence, every intent of
    both records) had its result receipt before the transfer committed, so its requests were made before;
    the journey's own requests are the journey's. Everything else in the log is returned (log entries).
    """
    before = terminal_at_transfer(transfer)
    return [a.request for a in attributed if not a.own and (a.command_id is None or a.command_id not in before)]


def intents_since(transfer) -> list[tuple[int, str, str]]:
    """``(id, source object, source record key)`` of every outbound intent but those the transfer found terminal."""
    from runtime_outbox.models import OutboundCommand

    return [(int(i), o, k) for i, o, k in OutboundCommand.objects.exclude(id__in=terminal_at_transfer(transfer))
            .order_by("id").values_list("id", "source_object", "source_record_key")]


def requests_of(attributed: list[Attributed], command_id: int | None) -> list[str]:
    """``"METHOD path"`` of each provider request the push attempts of one intent sent, in log order."""
    return [f"{a.request['method']} {a.request['path']}" for a in attributed
            if command_id is not None and a.command_id == command_id]


# --- shared steps ----------------------------------------------------------------------------------------------
LEAD = {"email": "ada.byron@example.com", "firstname": "Ada", "lastname": "Byron", "company": "Analytical Engines",
        "lifecyclestage": "lead"}


def lead_pushed_and_synced(h: Harness) -> tuple[str, str]:
    """Create the lead over REST, see it pushed once, then change it by a webhook about its remote id.

    Returns:
        ``(lead record key, remote id N)``.
    """
    c, op = crm(h), operator(h)
    lead_key = op.create("Lead", **LEAD)["record_key"]
    h.wait_idle()
    links = push_links("Lead", lead_key)
    h.check_equal("the lead was pushed with exactly one create POST", c.pushed_creates(), 1)
    h.check("the lead's push link is active on one remote id", len(links) == 1 and links[0][1] == "active",
            f"{links}")
    if not links:
        raise JourneyError("the lead was not pushed; nothing else can be checked")
    remote_id = links[0][0]
    h.values["remote_id"] = remote_id
    contact = provider_contact(h, remote_id) or {"properties": {}}
    h.check_equal("the provider's contact N holds the lead's mapped fields", mapped(contact["properties"]),
                  mapped(LEAD))
    c.contact_changed(int(remote_id), lastname="Lovelace")
    h.wait_idle()
    lead = record("Lead", lead_key)
    h.check_equal("a webhook about N changed the lead (synced both ways)", lead.fields.get("lastname"), "Lovelace")
    h.check_equal("the webhook created no other local record", all_links(), [("Lead", remote_id, "active")])
    return lead_key, remote_id


def check_converted(h: Harness, lead_key: str, contact_key: str, remote_id: str) -> None:
    """Remote authority moved once: the lead's link retired with evidence, the contact's active on N.

    Call once the conversion's consequences settled (:meth:`Harness.wait_idle`) and before anything else
    changes the two records. "No provider request" is proven by correlation, not by counting requests
    around the call: every request the provider saw belongs to an intent the conversion found terminal
    (work that finished before it), and no intent was authored since.
    """
    from connectors.models import RemoteLinkEvidence
    from nexusflow.records.models import IdentityTransfer

    transfer = conversion_fact(lead_key)
    h.check_equal("the conversion made no provider request", requests_since(crm(h).attributed(), transfer), [])
    h.check_equal("the conversion authored no outbound intent", intents_since(transfer), [])
    h.check_equal("the lead's push link is retired", push_links("Lead", lead_key), [(remote_id, "retired")])
    h.check_equal("the contact's push link is active on N", push_links("Contact", contact_key),
                  [(remote_id, "active")])
    evidence = sorted(RemoteLinkEvidence.objects.filter(kind="transferred").values_list("link__source_object",
                                                                                          "to_state"))
    h.check_equal("the move left transfer evidence on both links", evidence,
                  [("Contact", "active"), ("Lead", "retired")])
    lead, contact = record("Lead", lead_key), record("Contact", contact_key)
    h.check("the lead is converted and soft-deleted", lead.is_deleted and lead.fields.get("status") == "converted",
            f"deleted={lead.is_deleted} status={lead.fields.get('status')}")
    h.check_equal("the contact mirrors N", contact.mirrors.get("hubspot_contact_id"), remote_id)
    h.check_equal("the contact took the lead's mapped fields", mapped(contact.fields), mapped(lead.fields))
    h.check_equal("one conversion fact", list(IdentityTransfer.objects.filter(kind="convert")
                                              .values_list("source_record_key", "target_record_key")),
                  [(lead_key, contact_key)])


def check_end(h: Harness, contact_key: str, remote_id: str) -> None:
    """The end state both journeys share: one remote contact N equal to the local contact, all work done."""
    from connectors.models import RemoteEffect
    from nexusflow.flows.models import FlowRun

    runs = sorted(FlowRun.objects.values_list("state", flat=True))
    h.check("every push Flow run succeeded", bool(runs) and set(runs) == {"Succeeded"}, f"{runs}")
    from connectors import reasons
    from nexusflow.kernel.reasons import ATTENTION, codes_of_class
    from runtime_outbox.models import IntentResultReceipt

    effects = RemoteEffect.objects.filter(state__in=("uncertain", "quarantined"))
    # An older version's PATCH found a newer version already at the remote: seed 002 "superseded", settled with
    # a Runtime receipt, nothing sent (a benign reason code). A parked effect with an attention code is
    # unfinished or failed work.
    superseded = effects.filter(state="quarantined", reason_code=reasons.SUPERSEDED_BY_NEWER_VERSION)
    stuck = list(effects.filter(reason_code__in=sorted(codes_of_class(ATTENTION)))
                 .order_by("id").values_list("id", "state", "reason_code"))
    h.check_equal("no effect is left uncertain or quarantined with an attention reason code", stuck, [])
    outcomes = set(IntentResultReceipt.objects.filter(command_id__in=superseded.values("command_id"))
                   .values_list("outcome", flat=True))
    h.check("every superseded older version holds a 'superseded' receipt",
            outcomes <= {"superseded"} and IntentResultReceipt.objects.filter(
                command_id__in=superseded.values("command_id")).count() == superseded.count(), f"{outcomes}")
    state = crm(h).state()
    live = [c for c in state["contacts"] if not c["archived"]]
    h.check_equal("the provider holds exactly one contact, N", [c["id"] for c in live], [remote_id])
    h.check_equal("exactly one create POST in all", crm(h).pushed_creates(), 1)
    patched = {r: n for r, n in state["requests_by_route"].items() if r.startswith("PATCH ")}
    h.check("every PATCH went to N", set(patched) == {f"PATCH {CONTACTS_PATH}/{remote_id}"}, f"{patched}")
    contact = record("Contact", contact_key)
    if live:
        h.check_equal("the provider's contact N equals the local contact's mapped fields",
                      mapped(live[0]["properties"]), mapped(contact.fields))
    h.check_equal("every remote link on N: the lead's retired, the contact's active",
                  sorted(lk for lk in all_links() if lk[1] == remote_id),
                  [("Contact", remote_id, "active"), ("Lead", remote_id, "retired")])


def convert_path(lead_key: str) -> str:
    return f"/api/v2/records/Lead/{lead_key}/convert/"


# --- bi-conv-01 -------------------------------------------------------------------------------------------------
def bi_conv_01(h: Harness) -> None:
    c, op = crm(h), operator(h)
    lead_key, remote_id = lead_pushed_and_synced(h)
    response = op.until_done("convert", "POST", convert_path(lead_key),
                             {"transfer_id": "bi-conv-01", "target_object": "Contact"})
    h.check_equal("the conversion answered 201", response.status_code, 201)
    if response.status_code != 201:
        raise JourneyError(f"the conversion answered {response.status_code}: {response.text}")
    contact_key = response.json()["target_record_key"]
    h.wait_idle()
    check_converted(h, lead_key, contact_key, remote_id)

    edited = op.edit("contact edit", "Contact", contact_key, lifecyclestage="customer", firstname="Augusta")
    h.check_equal("the contact edit answered 200", edited.status_code, 200)
    h.wait_idle()
    edit_intent = save_intent("Contact", contact_key, edited.json()["version"]) if edited.status_code == 200 else None
    h.check_equal("the contact edit PATCHed N", requests_of(c.attributed(), edit_intent),
                  [f"PATCH {CONTACTS_PATH}/{remote_id}"])
    contact = provider_contact(h, remote_id) or {"properties": {}}
    h.check_equal("the provider's contact took the edit", (contact["properties"].get("firstname"),
                                                           contact["properties"].get("lifecyclestage")),
                  ("Augusta", "customer"))

    c.contact_changed(int(remote_id), lastname="King")
    h.wait_idle()
    h.check_equal("a later webhook about N applied to the contact", record("Contact", contact_key).fields.get(
        "lastname"), "King")
    h.check_equal("the lead was not touched by it", record("Lead", lead_key).fields.get("lastname"), "Lovelace")
    check_end(h, contact_key, remote_id)
    h.check_equal("no request was refused or left conflicting", op.failed, [])


# --- post-convert-contact-storm -----------------------------------------------------------------------------------
STORM_DELAY_SECONDS = 3  # below the callout timeout (5 s): a PATCH is held in flight, not timed out
WEBHOOK_ROUNDS = 3
EDIT_THREADS, EDITS_PER_THREAD = 2, 2


def post_convert_contact_storm(h: Harness) -> None:
    c, op = crm(h), operator(h)
    lead_key, remote_id = lead_pushed_and_synced(h)
    duplicate_key = op.create("Contact", email="ada.dup@example.com", firstname="Ada", lastname="Duplicate",
                              lifecyclestage="lead")["record_key"]
    h.wait_idle()

    # A local lead edit whose PATCH the provider holds in flight: the conversion races unfinished work.
    c.set_faults(delay_seconds=STORM_DELAY_SECONDS)
    lead_edit = op.edit("lead edit", "Lead", lead_key, firstname="Ada Augusta")
    h.check_equal("the lead edit answered 200", lead_edit.status_code, 200)
    if lead_edit.status_code != 200:
        raise JourneyError(f"the lead edit answered {lead_edit.status_code}: {lead_edit.text}")
    edited_version = lead_edit.json()["version"]
    h.wait_until("the lead edit's push intent exists",
                 lambda: save_intent("Lead", lead_key, edited_version) is not None)
    first = op.call("POST", convert_path(lead_key), {"transfer_id": "storm-convert", "target_object": "Contact"})
    h.check_equal("the conversion racing the lead's PATCH answered 409", first.status_code, 409)
    h.check_equal("... with code owner_outbound_pending", first.json().get("error") if first.status_code == 409
                  else None, "owner_outbound_pending")
    h.check("... and a Retry-After", first.headers.get("Retry-After", "").isdigit(), f"{dict(first.headers)}")
    converted = first
    if first.status_code == 409 and first.headers.get("Retry-After"):
        time.sleep(float(first.headers["Retry-After"]))
        converted = op.until_done("convert", "POST", convert_path(lead_key),
                                  {"transfer_id": "storm-convert", "target_object": "Contact"})
        h.check_equal("the retried conversion succeeded", converted.status_code, 201)
    if converted.status_code not in (200, 201):
        raise JourneyError(f"the conversion answered {converted.status_code}: {converted.text}")
    contact_key = converted.json()["target_record_key"]
    h.wait_idle()
    lead_intent = save_intent("Lead", lead_key, edited_version)
    h.check("the lead's PATCH finished before the conversion",
            lead_intent in terminal_at_transfer(conversion_fact(lead_key)), f"intent {lead_intent}")
    h.check_equal("... and reached the provider as a PATCH of N", requests_of(c.attributed(), lead_intent),
                  [f"PATCH {CONTACTS_PATH}/{remote_id}"])
    check_converted(h, lead_key, contact_key, remote_id)

    # The burst: webhooks about N, REST edits of the contact and a merge racing its in-flight pushes.
    h.check_equal("the contact becomes a customer (its pushes start)",
                  op.edit("contact edit", "Contact", contact_key, lifecyclestage="customer").status_code, 200)
    errors: list[str] = []

    def webhooks():
        for round_ in range(WEBHOOK_ROUNDS):
            c.contact_changed(int(remote_id), lastname=f"Storm-{round_}")

    def edits(thread: int):
        for edit in range(EDITS_PER_THREAD):
            op.edit("contact edit", "Contact", contact_key, firstname=f"Ada-{thread}-{edit}")

    def merge():
        # The provider holds each request STORM_DELAY_SECONDS: the merge arrives while this push is at the provider.
        h.wait_until("a push of the contact is in flight", lambda: push_in_flight("Contact", contact_key))
        response = op.until_done("merge", "POST", f"/api/v2/records/Contact/{duplicate_key}/merge/",
                                 {"transfer_id": "storm-merge", "target_key": contact_key})
        if response.status_code != 201:
            errors.append(f"merge answered {response.status_code}: {response.text}")

    def guarded(fn, *args):
        def body():
            try:
                fn(*args)
            except Exception as exc:  # a thread's failure becomes a failed check, never a hang
                errors.append(f"{fn.__name__}: {exc}")
        return threading.Thread(target=body)

    threads = [guarded(merge), guarded(webhooks)] + [guarded(edits, n) for n in range(EDIT_THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    c.set_faults(delay_seconds=0)
    h.wait_idle()

    h.check_equal("no burst thread failed", errors, [])
    h.check("the merge racing the contact's in-flight pushes got a retryable 409",
            op.conflicts["merge"] >= 1, f"conflicts: {dict(op.conflicts)}")
    h.check("its conflicts were owner_outbound_pending or owner_contended",
            op.conflict_codes.get("merge", set()) <= {"owner_outbound_pending", "owner_contended"},
            f"{op.conflict_codes}")
    h.check_equal("every mutation finally succeeded", op.failed, [])
    h.check_equal("every 409 carried Retry-After", op.retry_after_missing, 0)
    h.values["conflicts"] = dict(op.conflicts)
    h.say(f"journey: retryable 409s seen: {dict(op.conflicts)}")
    duplicate = record("Contact", duplicate_key)
    h.check("the duplicate was merged into the contact (soft-deleted)", duplicate.is_deleted, "still live")
    contact = record("Contact", contact_key)
    h.check("the last REST edit or webhook value holds locally",
            contact.fields.get("lastname", "").startswith("Storm-") and contact.fields.get("firstname", "")
            .startswith("Ada-"), f"{contact.fields}")
    check_end(h, contact_key, remote_id)


def provider_report(h: Harness) -> dict:
    """What the provider saw (as the other HubSpot journeys) plus the retryable conflicts the operator saw."""
    from packs.hubspot.journeys import provider_report as base

    report = base(h)
    if "operator" in h.values:
        report["operator_conflicts"] = dict(operator(h).conflicts)
    return report


register(Journey("bi-conv-01",
                 "A lead created over REST is pushed once (N), changed by a webhook about N, converted to a "
                 "contact with no provider call; later contact edits PATCH N and webhooks about N apply to it.",
                 stage_bidirectional, bi_conv_01, provider_report))
register(Journey("post-convert-contact-storm",
                 "As bi-conv-01, with the conversion racing the lead's in-flight PATCH (409 Retry-After, retried), "
                 "then a burst of webhooks, REST edits and a merge racing in-flight pushes; all converge on N.",
                 stage_bidirectional, post_convert_contact_storm, provider_report))
