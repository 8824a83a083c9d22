"""Runtime condition evaluation over normalized conditions (seed 004 sections 7.4 and 12.2); pure.

The compiler normalizes trigger filters and decision conditions
(:func:`nexusflow.flows.compiler.values.normalize_value`,
:func:`~nexusflow.flows.compiler.values.parse_logic`); admission
(:func:`trigger_matches`) and the interpreter (:func:`conditions_hold`)
evaluate them here, so neither imports the compiler for it.
"""
from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

from . import formula as fx


def _literal(value: dict[str, Any] | None) -> Any:
    if value is None:
        return None
    kind, text = value.get("kind"), value.get("value")
    if kind == "booleanValue":
        return text == "true"
    if kind == "numberValue":
        return Decimal(text)
    return text


def _typed(left: Any, right: Any) -> tuple[Any, Any]:
    """Compare a boolean with its type: a record field stores a Boolean (checkbox) value as ``"true"`` /
    ``"false"`` text, which equals the boolean literal of the same value."""
    if isinstance(right, bool) and isinstance(left, str) and left.lower() in ("true", "false"):
        return left.lower() == "true", right
    if isinstance(left, bool) and isinstance(right, str) and right.lower() in ("true", "false"):
        return left, right.lower() == "true"
    return left, right


def _compare(op: str, left: Any, right: Any) -> bool:
    if op == "IsNull":
        # A Get Records result that found nothing is null (an empty collection), as is an unset value.
        return (left is None or left == "" or left == []) == bool(right)
    if op == "IsBlank":
        return (left is None or left == "") == bool(right)
    left, right = _typed(left, right)
    if op == "EqualTo":
        return left is not None and fx._equal(left, right)
    if op == "NotEqualTo":
        return left is None or not fx._equal(left, right)
    if op in ("GreaterThan", "GreaterThanOrEqualTo", "LessThan", "LessThanOrEqualTo"):
        symbol = {"GreaterThan": ">", "GreaterThanOrEqualTo": ">=", "LessThan": "<", "LessThanOrEqualTo": "<="}[op]
        try:
            return fx._compare(symbol, left, right)
        except fx.FormulaRuntimeError:
            return False
    if op == "Contains":
        if isinstance(left, list):  # a collection contains an item equal to the value
            return any(fx._equal(item, right) for item in left)
        return left is not None and str(right) in str(left)
    if op in ("In", "NotIn"):  # data-element filters: the field's value among a collection's items
        items = right if isinstance(right, list) else ([] if right in (None, "") else [right])
        found = left not in (None, "") and any(fx._equal(left, item) for item in items)
        return found if op == "In" else not found
    if op == "StartsWith":
        return left is not None and str(left).startswith(str(right))
    if op == "EndsWith":
        return left is not None and str(left).endswith(str(right))
    raise ValueError(f"operator {op} needs context the evaluator does not have")


def _combine(logic: Any, results: list[bool]) -> bool:
    if not results:
        return True
    if logic == "and":
        return all(results)
    if logic == "or":
        return any(results)
    if isinstance(logic, int):
        return results[logic - 1]
    op = logic[0]
    if op == "not":
        return not _combine(logic[1], results)
    a, b = _combine(logic[1], results), _combine(logic[2], results)
    return (a and b) if op == "and" else (a or b)


def condition_holds(condition: dict[str, Any], fields: dict[str, Any],
                    resolve: Callable[[str], Any] | None = None) -> bool:
    """Evaluate one normalized condition against trigger-record fields.

    Accepts the trigger-filter shape ``{"field", "operator", "value"}`` and the
    decision shape ``{"left", "operator", "right"}``.

    Raises:
        ValueError: an operator or reference this evaluator cannot decide.
    """
    if "field" in condition:
        left = fields.get(condition["field"])
        right_raw = condition["value"]
    else:
        ref = condition["left"]
        if isinstance(ref, str) and ref.startswith("$Record.") and ref.count(".") == 1:
            left = fields.get(ref.split(".", 1)[1])
        elif resolve is not None:
            left = resolve(ref)
        else:
            raise ValueError(f"reference {ref!r} needs a resolver")
        right_raw = condition["right"]
    if isinstance(right_raw, dict) and right_raw.get("kind") == "elementReference":
        if resolve is None:
            raise ValueError("element references need a resolver")
        right = resolve(right_raw["value"])
    else:
        right = _literal(right_raw) if isinstance(right_raw, dict) or right_raw is None else right_raw
    return _compare(condition["operator"], left, right)


def conditions_hold(conditions: list[dict[str, Any]], logic: Any, fields: dict[str, Any],
                    resolve: Callable[[str], Any] | None = None) -> bool:
    """Combine conditions with ``and``/``or`` or a custom logic AST; an empty list holds."""
    return _combine(logic, [condition_holds(c, fields, resolve) for c in conditions])


def trigger_matches(trigger: dict[str, Any], *, object_name: str, created: bool, fields: dict[str, Any],
                    prior: dict[str, Any] | None = None) -> bool:
    """Return True when a saved record matches a plan's record-trigger selection.

    ``prior`` holds the field values the save replaced (``None`` on create).
    A trigger that ``requires_change`` (the Flow metadata's
    ``doesRequireRecordChangedToMeetCriteria``) matches an update only when
    its conditions hold now and did not hold on ``prior``: the record was
    updated to meet them.
    """
    if trigger.get("object") != object_name:
        return False
    rtt = trigger.get("record_trigger_type")
    if created and rtt not in ("Create", "CreateAndUpdate"):
        return False
    if not created and rtt not in ("Update", "CreateAndUpdate"):
        return False
    if not _filters_hold(trigger, fields, changed=_changed(created, fields, prior)):
        return False
    if trigger.get("requires_change") and not created and prior is not None:
        return not _filters_hold(trigger, prior, changed=lambda _field: False)
    return True


def filters_hold_unchanged(trigger: dict[str, Any], fields: dict[str, Any]) -> bool:
    """A schedule- or delete-triggered flow's entry filters on one record's ``fields`` (nothing changed: there
    is no save; the activation gate refuses ``IsChanged`` on such a start)."""
    return _filters_hold(trigger, fields, changed=lambda _field: False)


def _changed(created: bool, fields: dict[str, Any], prior: dict[str, Any] | None) -> Callable[[str], bool]:
    """``ISCHANGED(field)`` of a save: false on create and without the prior values (the record's whole
    field set before the save), else whether the saved value differs from the one it replaced (an absent
    field and an empty one are the same: no value)."""
    def changed(field: str) -> bool:
        return not created and prior is not None and (prior.get(field) or None) != (fields.get(field) or None)

    return changed


def _filters_hold(trigger: dict[str, Any], fields: dict[str, Any], *, changed: Callable[[str], bool]) -> bool:
    """The trigger's entry conditions on ``fields``; an ``IsChanged`` filter (value true or false) asks
    ``changed(field)``."""
    results = []
    for f in trigger["filters"]:
        if f.get("operator") == "IsChanged":
            results.append(changed(f["field"]) == bool(_literal(f.get("value"))))
        else:
            results.append(condition_holds(f, fields))
    return _combine(trigger["filter_logic"], results)
