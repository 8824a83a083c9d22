"""Pack data shapes of pulled routes and ordering contracts, and the generic envelope reading (no database)."""
from __future__ import annotations

import copy
import json

import pytest

from connectors.contracts.ordering import validate_contract
from connectors.contracts.pack_document import PackError, load_pack
from connectors.contracts.stream_routes import (
    encode_cursor,
    envelope_transport_key,
    expand_envelope,
    render_cursor,
    validate_pull_route,
)
from packs.salesforce_cdc import change_event, stream_route


def _route() -> dict:
    return copy.deepcopy(stream_route())


def test_the_pulled_pack_loads_and_declares_a_strict_sequence_route():
    route = load_pack("salesforce_cdc").route("contacts.changes")
    assert route["delivery"] == "pull"
    assert route["ordering"]["contract"] == "strict_source_sequence"
    assert route["ordering"]["partition"] == ["transactionKey"] and route["ordering"]["position"] == ["sequenceNumber"]


@pytest.mark.parametrize("breakage,message", [
    (lambda r: r.pop("stream"), "needs a 'stream' object"),
    (lambda r: r["stream"].pop("next_cursor_field"), "stream.next_cursor_field is missing"),
    (lambda r: r["stream"].update(batch_limit=0), "batch_limit"),
    (lambda r: r["stream"].update(method="POST"), "stream.method must be GET"),
    (lambda r: r.update(auth={"mechanism": "hmac"}), "auth is"),
    (lambda r: r.update(transport_key={"kind": "item_keys", "fields": ["x"]}), "transport_key is"),
    (lambda r: r["transport_key"].update(path=[]), "transport_key.path"),
    (lambda r: r["envelope"].update(fields={}), "non-empty 'fields'"),
    (lambda r: r["envelope"]["fan_out"].pop("as"), "envelope.fan_out needs"),
])
def test_a_malformed_pulled_route_is_refused_with_the_key_it_lacks(breakage, message):
    route = _route()
    breakage(route)
    with pytest.raises(ValueError, match=message):
        validate_pull_route(route)


@pytest.mark.parametrize("ordering,message", [
    ({"contract": "arrival_order"}, "unsupported ordering contract"),
    ({"contract": "strict_source_sequence", "partition": ["t"], "position": ["a", "b"], "tie_breaker": "r",
      "comparator_version": "1", "successor": {"first": 1, "step": 1},
      "gap": {"deadline_seconds": 300, "disposition": "quarantine"}}, "exactly one integer"),
    ({"contract": "strict_source_sequence", "partition": ["t"], "position": ["s"], "tie_breaker": "r",
      "comparator_version": "1", "gap": {"deadline_seconds": 300, "disposition": "quarantine"}}, "needs a successor"),
    ({"contract": "strict_source_sequence", "partition": ["t"], "position": ["s"], "tie_breaker": "r",
      "comparator_version": "1", "successor": {"first": 1, "step": 1},
      "gap": {"deadline_seconds": 300, "disposition": "drop"}}, "gap.disposition must be one of"),
    ({"contract": "latest_source_position", "partition": ["p"], "position": [], "tie_breaker": "e",
      "comparator_version": "1"}, "at least one field"),
    ({"contract": "order_independent"}, "conformance statement"),
])
def test_ordering_objects_outside_the_three_closed_shapes_are_refused(ordering, message):
    with pytest.raises(ValueError, match=message):
        validate_contract(ordering)


@pytest.mark.parametrize("breakage,message", [
    (lambda r: r["ordering"].pop("successor"), "needs a successor"),
    (lambda r: r.update(delivery="carrier"), "delivery must be"),
])
def test_a_pack_file_with_a_broken_pulled_route_does_not_load(tmp_path, breakage, message):
    broken = copy.deepcopy(load_pack("salesforce_cdc").document)
    breakage(broken["inbound_routes"][0])
    (tmp_path / "salesforce_cdc").mkdir()
    (tmp_path / "salesforce_cdc" / "pack.json").write_text(json.dumps(broken))
    with pytest.raises(PackError, match=message):
        load_pack("salesforce_cdc", packs_dir=tmp_path)


def test_one_envelope_fans_out_into_one_flat_item_per_named_record():
    envelope = change_event(record_ids=["003a", "003b"], transaction_key="tx", sequence=4, fields={"Email": "e@x.io"})
    envelope["data"]["event"]["replayId"] = 77
    items = expand_envelope(_route(), envelope)
    assert [i["recordId"] for i in items] == ["003a", "003b"]
    assert {(i["replayId"], i["transactionKey"], i["sequenceNumber"], i["changeType"]) for i in items} == {
        (77, "tx", 4, "UPDATE")}
    assert items[0]["recordFields"] == {"Email": "e@x.io"}  # the header is not a changed value


def test_an_envelope_naming_no_record_is_one_item_without_a_record_and_a_non_object_stays_as_is():
    gap = change_event(change_type="GAP_OVERFLOW", record_ids=[])
    (item,) = expand_envelope(_route(), gap)
    assert "recordId" not in item and item["changeType"] == "GAP_OVERFLOW"
    assert expand_envelope(_route(), ["not", "an", "envelope"]) == [["not", "an", "envelope"]]


def test_the_transport_key_is_the_opaque_id_alone_or_else_the_content():
    route = _route()
    first, second = change_event(record_ids=["003a"]), change_event(record_ids=["003b"])
    first["data"]["event"]["replayId"] = second["data"]["event"]["replayId"] = 5001
    assert envelope_transport_key(route, first) == envelope_transport_key(route, second)
    second["data"]["event"]["replayId"] = "5001"  # opaque: another JSON value is another key
    assert envelope_transport_key(route, first) != envelope_transport_key(route, second)
    first["data"]["event"]["replayId"] = second["data"]["event"]["replayId"] = None
    assert envelope_transport_key(route, first) != envelope_transport_key(route, second)
    assert envelope_transport_key(route, first) == envelope_transport_key(route, copy.deepcopy(first))


@pytest.mark.parametrize("value,param", [(12345, "12345"), ("AAAAAAAAbcQ=", "AAAAAAAAbcQ="), (None, None)])
def test_cursor_bytes_round_trip_to_the_request_parameter(value, param):
    stored = None if value is None else encode_cursor(value)
    assert render_cursor(stored) == param
