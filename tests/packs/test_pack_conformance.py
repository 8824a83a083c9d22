"""One conformance module for every pack: a pushed webhook pack and a pulled change-stream pack.

Seed 003 "Required proof": two structurally different external-application
conformance fixtures pass through the same L0 model with no provider
literals or branches in L0 (issue #4 item 7). Each test below is run for both
packs through a small driver that only knows how its provider delivers (a
signed POST to the ingress, or a publish to the loopback stream followed by
one poll); every assertion reads the same L0 rows (ReceiptAdmissionKey,
Receipt, ReceiptComponent, Event, Projection, Execution) and the route's own
pack data, never a provider name. The no-branch check also covers the words of
both push contracts and callout profiles (a form-encoded, replay-safe POST
contract and a JSON-wrapped PATCH contract without idempotency keys), whose
egress behaviour is exercised in ``tests/connectors/outbound/test_egress_hubspot.py``.
"""
from __future__ import annotations

import ast
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from connectors.contracts.pack_document import load_pack
from connectors.models import (
    AccountServingGate,
    Event,
    Execution,
    Projection,
    Receipt,
    ReceiptAdmissionKey,
    ReceiptComponent,
)
from tests.conftest import ORG, hubspot_event, post_signed
from tests.guardrails import ROOT, Violation, l0_files, relative
from tests.stream_support import STREAM_ACCOUNT, STREAM_ROUTE, stream_target

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

_numbers = itertools.count(1)


@dataclass
class Driver:
    """How one pack's provider delivers a unit (one request / one envelope) naming several items."""

    pack_key: str
    account_key: str
    route_key: str
    deliver: Callable[[int], None]        # one unit naming n records
    redeliver: Callable[[], None]         # the last unit again, as the provider would resend it
    deliver_quarantined: Callable[[], str]  # one unit with one item L0 must quarantine; returns the reason
    state: dict = field(default_factory=dict)

    @property
    def route(self) -> dict:
        return load_pack(self.pack_key).route(self.route_key)


def _pushed(client) -> Driver:
    state: dict[str, Any] = {}

    def deliver(n: int) -> None:
        base = 10_000 * next(_numbers)
        events = [hubspot_event(base + i, base + i, 1_700_000_000_000 + i, "email", f"p{base + i}@x.io")
                  for i in range(n)]
        state["last"] = events
        response = post_signed(client, events)
        assert response.status_code == 202, response.content

    def redeliver() -> None:
        again = [{**event, "attemptNumber": event["attemptNumber"] + 1} for event in state["last"]]
        response = post_signed(client, again)
        assert response.status_code == 200, response.content

    def deliver_quarantined() -> str:
        base = 10_000 * next(_numbers)
        unsupported = {**hubspot_event(base, base, 1_700_000_000_000), "subscriptionType": "contact.deletion"}
        assert post_signed(client, [unsupported]).status_code == 202
        return "item_kind_unsupported"

    return Driver("hubspot", "crm-webhooks", "contacts.webhook", deliver, redeliver, deliver_quarantined, state)


def _pulled(sandbox) -> Driver:
    from connectors.inbound.stream_poll import stream_poll_once
    from packs.salesforce_cdc import change_event

    def poll() -> None:
        assert stream_poll_once(stream_target()).fetched

    def deliver(n: int) -> None:
        base = next(_numbers)
        sandbox.publish(change_event(record_ids=[f"003C{base:05d}{i:03d}" for i in range(n)],
                                     transaction_key=f"tx-{base}", sequence=1, fields={"Email": f"c{base}@x.io"}))
        poll()

    def redeliver() -> None:
        sandbox.set_faults(rewind=1)  # the stream serves the last envelope again
        poll()

    def deliver_quarantined() -> str:
        base = next(_numbers)
        sandbox.publish(change_event(change_type="GAP_UPDATE", record_ids=[f"003G{base:05d}"], transaction_key=f"g{base}"))
        poll()
        return "source_gap_reported"

    return Driver("salesforce_cdc", STREAM_ACCOUNT, STREAM_ROUTE, deliver, redeliver, deliver_quarantined)


@pytest.fixture(params=["pushed_webhooks", "pulled_stream"])
def driver(request, stream_org, client) -> Driver:
    return _pushed(client) if request.param == "pushed_webhooks" else _pulled(stream_org.stream)


def _receipts(driver: Driver):
    return Receipt.objects.filter(org_id=ORG, account_key=driver.account_key).order_by("id")


# --- the same L0 model ---------------------------------------------------------------
def test_a_unit_naming_several_records_is_one_receipt_with_a_component_event_projection_and_execution_each(driver):
    driver.deliver(3)
    (receipt,) = _receipts(driver)
    gate = AccountServingGate.objects.get(org_id=ORG, account_key=driver.account_key)
    key = ReceiptAdmissionKey.objects.get(org_id=ORG, account_key=driver.account_key)
    assert key.receipt_id == receipt.pk and key.channel == receipt.channel == driver.route["channel"]
    assert receipt.epoch_id == gate.epoch_id and receipt.route_key == driver.route_key
    components = list(ReceiptComponent.objects.filter(receipt=receipt).order_by("ordinal"))
    assert [(c.ordinal, c.disposition) for c in components] == [(0, "event"), (1, "event"), (2, "event")]
    assert receipt.component_count == 3 and receipt.quarantined_count == 0
    events = [c.event for c in components]
    assert len({e.source_locator for e in events}) == 3 and {e.epoch_id for e in events} == {gate.epoch_id}
    for event in events:
        projection = Projection.objects.get(org_id=ORG, event=event)
        (execution,) = Execution.objects.filter(org_id=ORG, projection=projection)
        assert (execution.generation, execution.state, bytes(execution.position)) == (1, "ready", bytes(event.position))


def test_redelivery_resolves_the_original_receipt_and_materializes_nothing_new(driver):
    driver.deliver(2)
    before = (_receipts(driver).count(), Event.objects.filter(org_id=ORG, account_key=driver.account_key).count(),
              ReceiptComponent.objects.filter(receipt__account_key=driver.account_key).count())
    driver.redeliver()
    after = (_receipts(driver).count(), Event.objects.filter(org_id=ORG, account_key=driver.account_key).count(),
             ReceiptComponent.objects.filter(receipt__account_key=driver.account_key).count())
    assert before == after == (1, 2, 2)
    assert ReceiptAdmissionKey.objects.filter(org_id=ORG, account_key=driver.account_key).count() == 1


def test_quarantined_items_carry_a_registered_connectors_reason_and_are_found_by_its_evidence_query(driver):
    from connectors.selectors import receipt_components_quarantined
    from nexusflow.kernel.reasons import REASONS

    reason = driver.deliver_quarantined()
    (component,) = ReceiptComponent.objects.filter(receipt__account_key=driver.account_key)
    assert (component.disposition, component.reason_code, component.event_id) == ("quarantined", reason, None)
    assert REASONS[reason].owner == "connectors"
    assert component in receipt_components_quarantined(org_id=ORG, reason_code=reason)
    assert not Event.objects.filter(org_id=ORG, account_key=driver.account_key).exists()


def test_events_carry_the_ordering_facts_their_route_declares(driver):
    from connectors.contracts.ordering import encode_position

    driver.deliver(2)
    ordering = driver.route["ordering"]
    gate = AccountServingGate.objects.select_related("epoch").get(org_id=ORG, account_key=driver.account_key)
    frozen = next(a for a in gate.epoch.document["accounts"] if a["account_key"] == driver.account_key)
    for event in Event.objects.filter(org_id=ORG, account_key=driver.account_key):
        item = event.payload  # the classified item: the request element, or the expanded envelope item
        assert event.ordering_contract == ordering["contract"]
        assert event.ordering_contract_digest == frozen["routes"][driver.route_key]["ordering_digest"]
        partition_fields = driver.route["kinds"].get(item[driver.route["kind_field"]], {}).get(
            "partition", ordering["partition"])
        assert event.partition == [None if item.get(f) is None else str(item[f]) for f in partition_fields]
        assert bytes(event.position) == encode_position([item[f] for f in ordering["position"]],
                                                        event.source_event_key)
        assert event.tie_breaker == str(item[ordering["tie_breaker"]])


def test_two_structurally_different_packs_pass_through_the_same_l0_admission_model(stream_org, client, monkeypatch):
    """Pushed and pulled units reach one classify/admit path; no pack has a path of its own."""
    import connectors.inbound.admission as inbound

    seen: dict[str, list[str]] = {"classify_items": [], "_admit_locked": []}
    for name in seen:
        real = getattr(inbound, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            route = args[0] if _name == "classify_items" else args[3]
            seen[_name].append(route["route_key"])
            return _real(*args, **kwargs)

        monkeypatch.setattr(inbound, name, spy)
    _pushed(client).deliver(1)
    _pulled(stream_org.stream).deliver(1)
    assert seen == {"classify_items": ["contacts.webhook", STREAM_ROUTE], "_admit_locked": ["contacts.webhook", STREAM_ROUTE]}


# --- no provider branches in L0 --------------------------------------------------------
#: Route keys whose values are L0 vocabulary the pack selects (handler names, canonical kinds,
#: contracts, mechanisms), not provider vocabulary.
_L0_OWNED = {"command", "canonical_kind", "contract", "mechanism", "kind", "disposition", "comparator_version",
             "unit", "timestamp_unit", "encoding", "algorithm", "message", "method", "delivery", "body_encoding",
             "join", "mode",
             # the create-conflict recovery comparator (``connectors.contracts.create_conflict_recovery.COMPARATORS``)
             "compare"}
#: Maps whose keys are pack words but whose values are L0 schema type names ("integer", "string").
_TYPED_MAPS = {"common_required", "required"}
#: Provider words that are also everyday HTTP/SQL words L0 uses for its own purposes; a branch on
#: them is still caught by the literal-name test when it sits next to a provider field.
_COMMON_WORDS = {"UPDATE", "DELETE", "CREATE", "Authorization", "Bearer", "GET", "limit", "topic", "after", "events",
                 "data", "event", "payload", "id", "name",
                 # L0's own association vocabulary: the contract's ``associations`` list and the
                 # ``{remote_id}`` placeholder it renders (a pack body key and template use the same words).
                 "associations", "{remote_id}",
                 # a create-conflict answer's JSON path (``existing_id.json_path``) names the provider's
                 # ``message`` field; L0's signature config uses the same word for its own purpose.
                 "message",
                 # a callout profile's ``rate_limit.daily`` block is L0's own key; the billing sandbox's
                 # daily-limit header carries the same word as its value.
                 "daily",
                 # the email relay's body keys are English words L0 uses for its own purposes (a formula's
                 # text, a range's from/to, a record's subject line in docs and checks).
                 "text", "to", "from", "subject",
                 # the sealed catalog's delivery effect families (emailSimple, customNotificationAction),
                 # which a pack's "delivers" block names; the billing pack maps a field named email too.
                 "email", "notification",
                 # the message relay's notification body keys; L0 uses the same words structurally (a plan
                 # node's type, an edge's target, a request body).
                 "type", "target", "body", "title", "recipients"}


def _strings(value: Any, key: str = "") -> set[str]:
    if key in _L0_OWNED:
        return set()
    if isinstance(value, dict):
        out = {k for k in value if key in {"kinds", "fields", "field_map"} | _TYPED_MAPS}
        if key in _TYPED_MAPS:
            return out
        for k, v in value.items():
            out |= _strings(v, k)
        return out
    if isinstance(value, list):
        return set().union(*(_strings(v, key) for v in value)) if value else set()
    return {value} if isinstance(value, str) else set()


def pack_vocabulary() -> dict[str, str]:
    """Every provider word a pack names -> the pack naming it.

    Inbound routes (fields, kinds, channels, paths), push contracts (paths,
    slot ids, mapping targets and sources, body wrap, mirror field) and
    callout profiles (credential refs, idempotency headers).
    """
    words: dict[str, str] = {}
    for path in sorted((ROOT / "packs").glob("*/pack.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        for section in ("inbound_routes", "push_contracts", "callout_profiles"):
            for item in doc.get(section, []):
                for word in _strings(item) - _COMMON_WORDS:
                    words.setdefault(word, doc["pack_key"])
    return words


def branch_violations(source: str, path: str, vocabulary: dict[str, str]) -> list[Violation]:
    """Report every string constant of ``source`` equal to a pack word (a field read or a branch on it)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in vocabulary:
            found.append(Violation(path, node.lineno, "l0-pack-branch",
                                   f"names {node.value!r} of pack {vocabulary[node.value]}"))
    return found


def test_the_vocabulary_holds_both_packs_structural_words():
    words = pack_vocabulary()
    assert {"subscriptionType", "eventId", "objectId", "contact.propertyChange"} <= set(words)
    assert {"changeType", "recordIds", "replayId", "transactionKey", "sequenceNumber", "GAP_", "ChangeEventHeader",
            "/data/ContactChangeEvent", "latestReplayId"} <= set(words)
    assert not {"record_upsert_via_link", "record.created", "strict_source_sequence"} & set(words)
    # Outbound: both push contracts' provider words, and none of the L0 encodings they select.
    assert {"/crm/v3/objects/contacts/{remote_id}", "properties", "private_app_token", "hubspot.contact",
            "/v1/customers/{remote_id}", "Idempotency-Key", "api_key", "billing.customer"} <= set(words)
    assert not {"json", "form", "bearer", "POST", "PATCH"} & set(words)


#: Words of a language an L0 module itself implements, which a pack happens to
#: use too: the Flow compiler reads Salesforce Flow metadata, whose wait events
#: have an ``eventType`` element (a Flow keyword, not the pack's field).
#: Likewise the object metadata format names its field types, one of which is ``email`` (a type name of the
#: metadata language, not the pack's field). And the OpenAPI document L0 publishes is JSON Schema, whose
#: ``properties`` keyword the CRM pack's API also uses as a body key.
LANGUAGE_WORDS = {"nexusflow/flows/": {"eventType"}, "nexusflow/records/metadata.py": {"email"},
                  "nexusflow/api_schema.py": {"properties"}}


@pytest.mark.parametrize("path", list(l0_files()), ids=lambda p: relative(p))
def test_l0_python_reads_and_branches_on_no_pack_word(path):
    vocabulary = pack_vocabulary()
    for prefix, words in LANGUAGE_WORDS.items():
        if relative(path).startswith(prefix):
            vocabulary = {w: p for w, p in vocabulary.items() if w not in words}
    violations = branch_violations(path.read_text(encoding="utf-8"), relative(path), vocabulary)
    assert not violations, "\n".join(map(str, violations))


def test_a_branch_on_a_pack_field_in_l0_is_caught():
    broken = ("def classify(item):\n    if item['changeType'].startswith('GAP_'):\n        return 'gap'\n"
              "    return item.get(route['kind_field'])\n")
    violations = branch_violations(broken, "connectors/x.py", pack_vocabulary())
    assert sorted((v.line, v.detail) for v in violations) == [
        (2, "names 'GAP_' of pack salesforce_cdc"), (2, "names 'changeType' of pack salesforce_cdc")]
    fixed = "def classify(item, route):\n    return item.get(route['kind_field'])\n"
    assert branch_violations(fixed, "connectors/x.py", pack_vocabulary()) == []


def test_a_push_contract_word_in_the_egress_adapter_is_caught():
    broken = ("def encode(contract, fields):\n    if contract['create']['path'] == '/crm/v3/objects/contacts':\n"
              "        return {'properties': fields}\n    return fields\n")
    violations = branch_violations(broken, "connectors/outbound/egress.py", pack_vocabulary())
    assert sorted((v.line, v.detail) for v in violations) == [
        (2, "names '/crm/v3/objects/contacts' of pack hubspot"), (3, "names 'properties' of pack hubspot")]
    fixed = ("def encode(contract, fields):\n"
             "    return {contract['body_wrap']: fields} if contract.get('body_wrap') else fields\n")
    assert branch_violations(fixed, "connectors/outbound/egress.py", pack_vocabulary()) == []
