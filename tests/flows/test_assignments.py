"""Collection assignment operators as Salesforce defines them ("Flow Operators in Assignment Elements", Collection).

Each row: the collection before, the operator, the value (one item or a collection), the collection after.
"""
from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from nexusflow.flows.errors import FlowExecutionError
from nexusflow.flows.handlers import _node_blockers
from nexusflow.flows.interpreter import COLLECTION_ASSIGNMENT_OPERATORS, collection_assign


@pytest.mark.parametrize("before,op,value,after", [
    # Add At Start: the value's items go first, in their order.
    (["b", "c"], "AddAtStart", "a", ["a", "b", "c"]),
    (["c"], "AddAtStart", ["a", "b"], ["a", "b", "c"]),
    (None, "AddAtStart", "a", ["a"]),
    # Remove All: every item equal to the value (or to any item of a value collection).
    (["a", "b", "a", "c"], "RemoveAll", "a", ["b", "c"]),
    (["a", "b", "a", "c"], "RemoveAll", ["a", "c"], ["b"]),
    (["a", "b"], "RemoveAll", "z", ["a", "b"]),
    ([], "RemoveAll", "a", []),
    # Remove First: only the first item equal to the value.
    (["a", "b", "a"], "RemoveFirst", "a", ["b", "a"]),
    (["a", "b"], "RemoveFirst", "z", ["a", "b"]),
    # Remove After First: every item after the first match; the match stays.
    (["a", "b", "c", "b", "d"], "RemoveAfterFirst", "b", ["a", "b"]),
    (["a", "b"], "RemoveAfterFirst", "z", ["a", "b"]),
    # Remove Before First: every item before the first match; the match stays.
    (["a", "b", "c", "b", "d"], "RemoveBeforeFirst", "b", ["b", "c", "b", "d"]),
    (["a", "b"], "RemoveBeforeFirst", "z", ["a", "b"]),
    # Remove Uncommon: keep only the items the value collection also has.
    (["a", "b", "c", "a"], "RemoveUncommon", ["a", "c", "x"], ["a", "c", "a"]),
    (["a", "b"], "RemoveUncommon", [], []),
    # Remove Position: the 1-based position.
    (["a", "b", "c"], "RemovePosition", Decimal(2), ["a", "c"]),
    (["a", "b", "c"], "RemovePosition", "3", ["a", "b"]),
    # Items compare by value: numbers and records too.
    ([Decimal(1), Decimal(2), Decimal(1)], "RemoveAll", Decimal(1), [Decimal(2)]),
    ([{"Id": "1"}, {"Id": "2"}], "RemoveFirst", {"Id": "2"}, [{"Id": "1"}]),
])
def test_collection_assignment_operators(before, op, value, after):
    original = None if before is None else list(before)
    assert collection_assign(op, before, value, target="items") == after
    assert before == original  # the old value is not changed in place


@pytest.mark.parametrize("before,position", [(["a"], 0), (["a"], 2), (["a"], "x"), (["a"], Decimal("1.5")),
                                             ([], 1), (["a"], True)])
def test_remove_position_outside_the_collection_is_a_precise_execution_error(before, position):
    with pytest.raises(FlowExecutionError) as caught:
        collection_assign("RemovePosition", before, position, target="items")
    assert caught.value.code == "flow_collection_position"


def test_a_collection_operator_on_a_single_value_is_an_execution_error():
    with pytest.raises(FlowExecutionError):
        collection_assign("RemoveAll", "a", "a", target="name")


@pytest.mark.parametrize("op", sorted(COLLECTION_ASSIGNMENT_OPERATORS))
def test_every_collection_operator_is_activated(op):
    node = {"type": "assignments", "items": [{"operator": op, "target": "items",
                                              "value": {"kind": "stringValue", "value": "a"}}]}
    assert ("assignment", f"operator {op} is not executed") not in _node_blockers(node)


# --- Collection Sort (collectionProcessors, SortCollectionProcessor) -------------------------------------
ROWS = [{"Name": "b", "Rank": "10"}, {"Name": "a", "Rank": "9"}, {"Name": "c", "Rank": ""}, {"Name": "d", "Rank": "9"}]


@pytest.mark.parametrize("option,names", [
    ({"field": "Rank", "order": "Asc", "nulls_first": False}, ["a", "d", "b", "c"]),  # 9 < 10 as numbers; stable
    ({"field": "Rank", "order": "Desc", "nulls_first": False}, ["b", "a", "d", "c"]),
    ({"field": "Rank", "order": "Asc", "nulls_first": True}, ["c", "a", "d", "b"]),
    ({"field": "Name", "order": "Desc", "nulls_first": False}, ["d", "c", "b", "a"]),
])
def test_collection_sort_orders_by_its_option(option, names):
    from nexusflow.flows.interpreter import _sorted_items

    assert [row["Name"] for row in _sorted_items(ROWS, option)] == names


def test_collection_sort_and_filter_elements_run_in_the_interpreter():
    from nexusflow.flows.interpreter import FILTER_PROCESSOR, SORT_PROCESSOR, _Run

    payload = {"checkpoint_schema": {"variables": {
        "rows": {"data_type": "SObject", "collection": True, "object": "Thing"},
        "row": {"data_type": "SObject", "collection": False, "object": "Thing"}}}}
    graph = [
        {"element": "Sort_Rows", "type": "collectionProcessors", "processor": SORT_PROCESSOR, "collection": "rows",
         "conditions": [], "logic": "and", "current_item": None, "limit": 3,
         "sort": [{"field": "Rank", "order": "Desc", "nulls_first": False}],
         "edges": [{"kind": "success", "to": "Keep_Nine"}]},
        {"element": "Keep_Nine", "type": "collectionProcessors", "processor": FILTER_PROCESSOR,
         "collection": "Sort_Rows", "current_item": "row", "sort": [], "limit": None, "logic": "and",
         "conditions": [{"left": "row.Rank", "operator": "EqualTo", "right": {"kind": "stringValue", "value": "9"}}],
         "edges": []},
    ]
    run = _Run(plan_payload=payload, record={}, object_name="", prior=None, is_new=False,
               now=dt.datetime(2026, 1, 1, tzinfo=dt.UTC), reader=None, budget=50, fan_out_limit=50)
    run.vars["rows"] = [dict(r) for r in ROWS]
    run.run(graph, "Sort_Rows")
    assert [r["Name"] for r in run.elements["Sort_Rows"]] == ["b", "a", "d"]
    assert [r["Name"] for r in run.elements["Keep_Nine"]] == ["a", "d"]
    assert [r["Name"] for r in run.vars["rows"]] == ["b", "a", "c", "d"]  # the input is never changed
