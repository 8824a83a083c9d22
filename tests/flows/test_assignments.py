"""Collection assignment operators as Salesforce defines them ("Flow Operators in Assignment Elements", Collection).

Each row: the collection before, the operator, the value (one item or a collection), the collection after.
"""
from __future__ import annotations

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
