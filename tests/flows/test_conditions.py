"""Condition operators on collections: ``Contains`` in decisions, ``In`` / ``NotIn`` in record filters."""
from __future__ import annotations

from decimal import Decimal

import pytest

from nexusflow.flows.conditions import condition_holds


@pytest.mark.parametrize("items,value,holds", [
    (["500-1", "500-2"], "500-1", True),
    (["500-10"], "500-1", False),  # an item equal to the value, not a substring of the list's text
    ([], "500-1", False),
    ([Decimal(3), Decimal(4)], "3", True),
    ([{"Id": "a"}], {"Id": "a"}, True),
])
def test_a_collection_contains_an_item_equal_to_the_value(items, value, holds):
    right = {"kind": "elementReference", "value": "wanted"}
    assert condition_holds({"left": "ids", "operator": "Contains", "right": right}, {},
                           resolve=lambda ref: items if ref == "ids" else value) is holds


@pytest.mark.parametrize("field,items,in_holds", [
    ("a0U-1", ["a0U-1", "a0U-2"], True),
    ("a0U-3", ["a0U-1", "a0U-2"], False),
    ("a0U-1", [], False),
    ("", ["a0U-1", ""], False),  # an empty field is in no collection
    (None, ["a0U-1"], False),
    ("a0U-1", ["A0U-1"], False),  # record keys compare exactly
])
def test_record_filter_in_and_not_in(field, items, in_holds):
    fields = {"Id": field}
    assert condition_holds({"field": "Id", "operator": "In", "value": items}, fields) is in_holds
    assert condition_holds({"field": "Id", "operator": "NotIn", "value": items}, fields) is (not in_holds)
