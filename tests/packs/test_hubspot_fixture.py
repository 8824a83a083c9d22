"""The committed demo webhook file has every property the demo relies on."""
from __future__ import annotations

import json
from collections import Counter, defaultdict
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from packs.hubspot import item_conforms, webhook_route
from packs.hubspot.fixtures.make_demo_webhooks import (
    OUTPUT_PATH,
    STAGES,
    build_deliveries,
    expected_final_state,
    render_lines,
    write_fixture,
)
from packs.hubspot.sender import Delivery, load_deliveries

ROUTE = webhook_route()
PROPERTIES = {"email", "firstname", "lastname", "lifecyclestage"}
Key = tuple[int, int]  # (subscriptionId, eventId)


@pytest.fixture(scope="module")
def deliveries() -> list[Delivery]:
    return load_deliveries(OUTPUT_PATH)


def _array_bodies(deliveries: list[Delivery]) -> list[tuple[int, Delivery]]:
    return [(index, d) for index, d in enumerate(deliveries) if isinstance(d.body, list)]


def _valid_items(body: list[Any]) -> list[dict[str, Any]]:
    return [item for item in body if item_conforms(ROUTE, item)]


def _key(item: dict[str, Any]) -> Key:
    return item["subscriptionId"], item["eventId"]


def _events(deliveries: list[Delivery]) -> dict[Key, dict[str, Any]]:
    events: dict[Key, dict[str, Any]] = {}
    for _, delivery in _array_bodies(deliveries):
        for item in _valid_items(delivery.body):  # type: ignore[arg-type]
            events.setdefault(_key(item), item)
    return events


def test_file_is_byte_identical_to_a_fresh_run(tmp_path: Path) -> None:
    committed = OUTPUT_PATH.read_bytes()
    assert committed == render_lines(build_deliveries()).encode("utf-8")
    fresh = write_fixture(tmp_path / "fresh.jsonl")
    assert fresh.read_bytes() == committed


def test_counts_and_batch_sizes(deliveries: list[Delivery]) -> None:
    events = _events(deliveries)
    assert len(events) >= 300
    assert len({event["objectId"] for event in events.values()}) >= 40
    for _, delivery in _array_bodies(deliveries):
        assert 1 <= len(delivery.body) <= 20
    assert Counter(d.sign for d in deliveries)["valid"] >= 70


def test_event_shapes(deliveries: list[Delivery]) -> None:
    allowed = {"eventId", "subscriptionId", "portalId", "appId", "occurredAt", "subscriptionType",
               "attemptNumber", "objectId", "changeSource", "sourceId", "changeFlag", "propertyName",
               "propertyValue"}
    for _, delivery in _array_bodies(deliveries):
        for item in _valid_items(delivery.body):  # type: ignore[arg-type]
            assert set(item) <= allowed
            for name in ("eventId", "subscriptionId", "portalId", "appId", "occurredAt", "attemptNumber",
                         "objectId"):
                assert type(item[name]) is int
            assert item["occurredAt"] > 1_000_000_000_000  # epoch milliseconds
            assert item["attemptNumber"] >= 0
            assert item["changeSource"] in {"CRM_UI", "IMPORT", "API", "INTEGRATION"}
            if item["subscriptionType"] == "contact.creation":
                assert item["changeFlag"] == "NEW"
                assert "propertyName" not in item
            else:
                assert item["subscriptionType"] == "contact.propertyChange"
                assert item["propertyName"] in PROPERTIES
                assert isinstance(item["propertyValue"], str) and item["propertyValue"]
                if item["propertyName"] == "lifecyclestage":
                    assert item["propertyValue"] in STAGES


def test_redelivered_events_are_identical_except_attempt_number(deliveries: list[Delivery]) -> None:
    seen: dict[Key, dict[str, Any]] = {}
    for _, delivery in _array_bodies(deliveries):
        for item in _valid_items(delivery.body):  # type: ignore[arg-type]
            stripped = {k: v for k, v in item.items() if k != "attemptNumber"}
            assert seen.setdefault(_key(item), stripped) == stripped


def test_event_ids_repeat_across_subscriptions(deliveries: list[Delivery]) -> None:
    by_event_id: dict[int, set[int]] = defaultdict(set)
    for subscription_id, event_id in _events(deliveries):
        by_event_id[event_id].add(subscription_id)
    assert sum(1 for subscriptions in by_event_id.values() if len(subscriptions) > 1) >= 1


def test_out_of_order_pairs(deliveries: list[Delivery]) -> None:
    first_seen: dict[Key, tuple[int, int]] = {}
    for index, delivery in _array_bodies(deliveries):
        if delivery.sign != "valid":
            continue
        for offset, item in enumerate(_valid_items(delivery.body)):  # type: ignore[arg-type]
            first_seen.setdefault(_key(item), (index, offset))
    partitions: dict[tuple[int, str | None], list[dict[str, Any]]] = defaultdict(list)
    for event in _events(deliveries).values():
        partitions[(event["objectId"], event.get("propertyName"))].append(event)
    inverted = 0
    for events in partitions.values():
        by_arrival = sorted(events, key=lambda e: first_seen[_key(e)])
        positions = [(e["occurredAt"], e["eventId"]) for e in by_arrival]
        if any(later > earlier for later, earlier in pairwise(positions)):
            inverted += 1
    assert inverted >= 20


def test_same_occurred_at_ties_are_broken_by_event_id(deliveries: list[Delivery]) -> None:
    first_seen: dict[Key, int] = {}
    for index, delivery in _array_bodies(deliveries):
        for item in _valid_items(delivery.body):  # type: ignore[arg-type]
            first_seen.setdefault(_key(item), index)
    groups: dict[tuple[int, str, int], list[dict[str, Any]]] = defaultdict(list)
    for event in _events(deliveries).values():
        if "propertyName" in event:
            groups[(event["objectId"], event["propertyName"], event["occurredAt"])].append(event)
    ties = [group for group in groups.values() if len({e["propertyValue"] for e in group}) > 1]
    assert len(ties) >= 3
    final = expected_final_state(deliveries)
    winner_first = 0
    for group in ties:
        winner = max(group, key=lambda e: e["eventId"])
        loser = min(group, key=lambda e: e["eventId"])
        later = [e for e in _events(deliveries).values() if e["objectId"] == winner["objectId"]
                 and e.get("propertyName") == winner["propertyName"] and e["occurredAt"] > winner["occurredAt"]]
        if not later:
            assert final[str(winner["objectId"])][winner["propertyName"]] == winner["propertyValue"]
        winner_first += first_seen[_key(winner)] <= first_seen[_key(loser)]
    assert winner_first >= 1


def test_whole_batch_redeliveries_raise_every_attempt_number(deliveries: list[Delivery]) -> None:
    earlier: list[list[dict[str, Any]]] = []
    redeliveries = 0
    for _, delivery in _array_bodies(deliveries):
        items = _valid_items(delivery.body)  # type: ignore[arg-type]
        for previous in earlier:
            if [_key(i) for i in previous] == [_key(i) for i in items]:
                if all(now["attemptNumber"] == before["attemptNumber"] + 1 for now, before in zip(items, previous, strict=True)):
                    redeliveries += 1
                    break
        earlier.append(items)
    assert redeliveries >= 15


def test_regrouped_redeliveries(deliveries: list[Delivery]) -> None:
    seen: set[Key] = set()
    earlier_sets: list[frozenset[Key]] = []
    regrouped = 0
    for _, delivery in _array_bodies(deliveries):
        keys = frozenset(_key(i) for i in _valid_items(delivery.body))  # type: ignore[arg-type]
        if keys and keys <= seen and keys not in earlier_sets:
            regrouped += 1
        seen |= keys
        earlier_sets.append(keys)
    assert regrouped >= 3


def test_first_sends_have_attempt_zero_and_attempts_grow(deliveries: list[Delivery]) -> None:
    last: dict[Key, int] = {}
    for _, delivery in _array_bodies(deliveries):
        for item in _valid_items(delivery.body):  # type: ignore[arg-type]
            expected = last[_key(item)] + 1 if _key(item) in last else 0
            assert item["attemptNumber"] == expected
            last[_key(item)] = item["attemptNumber"]


def test_bad_signatures_are_each_redelivered_validly(deliveries: list[Delivery]) -> None:
    signs = Counter(d.sign for d in deliveries)
    assert signs["invalid"] >= 1 and signs["stale"] >= 1 and signs["missing"] >= 1
    for index, delivery in enumerate(deliveries):
        if delivery.sign == "valid":
            continue
        assert isinstance(delivery.body, list)
        for item in _valid_items(delivery.body):
            assert any(
                later.sign == "valid" and isinstance(later.body, list)
                and any(_key(other) == _key(item) and other["attemptNumber"] > item["attemptNumber"]
                        for other in _valid_items(later.body))
                for later in deliveries[index + 1 :]
            ), f"event {_key(item)} of badly signed delivery {index} is never redelivered validly"


def test_every_event_reaches_a_valid_array_delivery(deliveries: list[Delivery]) -> None:
    delivered: set[Key] = set()
    for _, delivery in _array_bodies(deliveries):
        if delivery.sign == "valid":
            delivered |= {_key(i) for i in _valid_items(delivery.body)}  # type: ignore[arg-type]
    assert delivered == set(_events(deliveries))


def test_malformed_input(deliveries: list[Delivery]) -> None:
    bad_items: list[dict[str, Any]] = []
    for _, delivery in _array_bodies(deliveries):
        body = delivery.body
        rejected = [item for item in body if not item_conforms(ROUTE, item)]  # type: ignore[union-attr]
        if rejected:
            assert delivery.sign == "valid"
            assert _valid_items(body), "schema failures must sit inside otherwise valid batches"  # type: ignore[arg-type]
            bad_items.extend(rejected)
    assert 2 <= len(bad_items) <= 3
    assert any(item.get("objectId") == "abc" for item in bad_items)
    assert any("eventId" not in item for item in bad_items)
    assert any(item.get("subscriptionType") == "contact.deletion" for item in bad_items)
    strings = [d.body for d in deliveries if isinstance(d.body, str)]
    assert "not json" in strings
    assert '{"a":1}' in strings
    assert json.loads('{"a":1}') == {"a": 1}


def test_non_ascii_values_and_raw_utf8_body(deliveries: list[Delivery]) -> None:
    values = {e["propertyValue"] for e in _events(deliveries).values() if "propertyValue" in e}
    assert {"Zoë", "Øyvind", "李"} & values
    assert sum(1 for value in values if not value.isascii()) >= 5
    raw = [d.body for d in deliveries if isinstance(d.body, str) and d.body.startswith("[")]
    assert raw and not raw[0].isascii()
    assert all(item_conforms(ROUTE, item) for item in json.loads(raw[0]))


def test_customers_with_later_changes(deliveries: list[Delivery]) -> None:
    final = expected_final_state(deliveries)
    customers = [locator for locator, props in final.items() if props.get("lifecyclestage") == "customer"]
    assert len(customers) >= 15
    events = list(_events(deliveries).values())
    changed_after = 0
    for locator in customers:
        mine = [e for e in events if str(e["objectId"]) == locator and "propertyName" in e]
        became = min(e["occurredAt"] for e in mine
                     if e["propertyName"] == "lifecyclestage" and e["propertyValue"] == "customer")
        if any(e["propertyName"] in {"email", "firstname", "lastname"} and e["occurredAt"] > became for e in mine):
            changed_after += 1
    assert changed_after >= 8
    assert sum(1 for props in final.values() if props == {}) >= 1
    assert len(final) >= 40


def test_expected_final_state_on_a_tiny_input() -> None:
    def change(event_id: int, object_id: Any, occurred_at: int, name: str, value: str, **extra: Any) -> dict:
        return {"eventId": event_id, "subscriptionId": 2, "occurredAt": occurred_at, "objectId": object_id,
                "subscriptionType": "contact.propertyChange", "attemptNumber": 0,
                "propertyName": name, "propertyValue": value, **extra}

    creation = {"eventId": 1, "subscriptionId": 1, "occurredAt": 100, "objectId": 7,
                "subscriptionType": "contact.creation", "attemptNumber": 0}
    only_created = {**creation, "eventId": 2, "objectId": 8}
    legacy = {k: v for k, v in change(20, 9, 50, "email", "old@x").items() if k != "subscriptionType"}
    legacy["eventType"] = "contact.propertyChange"
    deliveries = [
        Delivery([change(11, 7, 300, "firstname", "Later"), creation, only_created], "valid"),
        Delivery([change(10, 7, 200, "firstname", "Earlier")], "invalid"),
        Delivery([change(12, 7, 400, "lastname", "Low id"), change(13, 7, 400, "lastname", "High id")]),
        Delivery([change(5, 7, 400, "lastname", "Lower id")]),
        Delivery([change(99, "abc", 999, "firstname", "bad id"), change(98, 7, 450, "email", "x@y"),
                  {**change(97, 7, 999, "firstname", "no id")} | {"eventId": None}]),
        Delivery("not json"),
        Delivery('{"a":1}'),
        Delivery(json.dumps([change(15, 7, 500, "email", "late@é.example")], ensure_ascii=False)),
        Delivery([legacy, {**creation, "subscriptionType": "contact.deletion", "eventId": 3, "objectId": 10}]),
    ]
    assert expected_final_state(deliveries) == {
        "7": {"firstname": "Later", "lastname": "High id", "email": "late@é.example"},
        "8": {},
        "9": {"email": "old@x"},
    }
