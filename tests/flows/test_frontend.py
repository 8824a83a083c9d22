"""Metadata front end and the formula evaluator (seed 004 section 7.2 steps 1-2)."""
from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from nexusflow.flows.formula import Env, FormulaError, evaluate, parse_formula, parse_template, references
from nexusflow.flows.frontend import FrontEndError, parse_flow_document

from .conftest import CORPUS, DEMO_FLOW
from .flowxml import reformat


def _eval(expr: str, values: dict | None = None, **env):
    values = values or {}
    return evaluate(parse_formula(expr), Env(resolve=values.get, **env))


def test_normalized_form_is_versioned_and_free_of_layout():
    source = DEMO_FLOW.read_bytes()
    doc = parse_flow_document(source)
    assert doc.data["schema"] == "flows.metadata.v1"
    assert list(doc.data["elements"]) == ["actionCalls"]
    action = doc.data["elements"]["actionCalls"]["Push_Customer_To_Billing"]
    assert "locationX" not in action and [p["name"] for p in action["inputParameters"]] == ["contract", "recordId"]
    assert parse_flow_document(reformat(source)).digest == doc.digest
    # Semantics change the digest; ordered lists keep their order.
    assert parse_flow_document(source.replace(b"CreateAndUpdate", b"Create")).digest != doc.digest
    with pytest.raises(FrontEndError) as exc:
        parse_flow_document(b"<Workflow/>")
    assert exc.value.code == "not_a_flow"


def test_every_corpus_file_parses_to_the_same_form_after_reformatting():
    for path in sorted(CORPUS.glob("*.flow-meta.xml")):
        source = path.read_bytes()
        assert parse_flow_document(reformat(source)).data == parse_flow_document(source).data, path.name


def test_formula_operators_and_corpus_functions():
    record = {"$Record.Name": "Rex", "$Record.Type__c": "Dog", "$Record.Species__c": "Canine", "prefix": "",
              "a": True, "b": False}
    assert _eval("IF(ISBLANK({!prefix}), {!$Record.Name}, {!prefix} + '-' + {!$Record.Name})", record) == "Rex"
    assert _eval("IF(ISBLANK({!prefix}), {!$Record.Name}, {!prefix} + '-' + {!$Record.Name})",
                 {**record, "prefix": "SH"}) == "SH-Rex"
    assert _eval('{!$Record.Type__c} + " - " + {!$Record.Species__c}', record) == "Dog - Canine"
    assert _eval("{!a} && {!b}", record) is False and _eval("{!a} || {!b}", record) is True
    assert _eval("NOW() + 30", now=dt.datetime(2026, 1, 1)) == dt.datetime(2026, 1, 31)
    assert _eval("ISNEW()", is_new=True) is True and _eval("true") is True
    assert _eval("1 + 2 * 3 ^ 2 - -1") == Decimal(20)
    assert _eval("AND({!a}, NOT({!b}), 2 >= 1, 'x' <> 'y', 1 = 1.0)", record) is True
    assert _eval("CASE(2, 1, 'one', 2, 'two', 'many') & '!'") == "two!"
    assert _eval("LEFT(UPPER('flow'), 2) & TEXT(LEN('abc'))") == "FL3"
    assert references(parse_formula("IF({!x.y}, {!z}, {!x.y})")) == ["x.y", "z"]
    assert parse_template("Hi {!name}!") == [["text", "Hi "], ["ref", "name"], ["text", "!"]]


@pytest.mark.parametrize("expr,code", [
    ("SHOUT(1)", "unknown_function"), ("IF(1, 2)", "formula_arity"), ("1 +", "formula_syntax"),
    ("name + 1", "formula_reference"), ("{!a b}", "formula_reference"), ("(1", "formula_syntax"),
    ("'unterminated", "formula_syntax"), ("", "formula_syntax"),
])
def test_bad_formulas_fail_at_compile_time_with_stable_codes(expr, code):
    with pytest.raises(FormulaError) as exc:
        parse_formula(expr)
    assert exc.value.code == code
