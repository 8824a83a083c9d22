"""The Flow formula function library (seed 004 section 7.2 steps 1-2).

Each family is a table of (expression, expected) rows taken from the examples
of the Flow formula operator and function reference, plus the edge cases the
reference states in words (ADDMONTHS keeps the end of the month, ROUND rounds
half away from zero, FIND is 1-based and 0 when absent, WEEKDAY counts from
Sunday = 1, FLOOR/CEILING versus MFLOOR/MCEILING on negative numbers).
"""
from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from nexusflow.flows.formula import (
    CONTEXT_FUNCTIONS,
    FUNCTIONS,
    Env,
    FormulaError,
    FormulaRuntimeError,
    evaluate,
    functions_used,
    parse_formula,
)

UTC = dt.UTC
#: A trigger record as the interpreter resolves it: every field is text (or null).
RECORD = {
    "$Record.Amount": "250.00", "$Record.Stage": "Closed Won", "$Record.Colors": "Red;Blue;Green",
    "$Record.CloseDate": "2024-02-29", "$Record.Stamp": "2024-02-29T17:30:00Z", "$Record.Name": "acme corp",
    "$Record.Empty": "", "$Record.Missing": None, "$Record.Clock": "17:30:45.125",
}
NOW = dt.datetime(2024, 6, 2, 9, 15, 30, tzinfo=UTC)


def _eval(expr: str, values: dict | None = None, **env):
    resolve = {**RECORD, **(values or {})}.get
    return evaluate(parse_formula(expr), Env(resolve=resolve, now=NOW, **env))


def _approx(text: str):
    return pytest.approx(Decimal(text), abs=Decimal("1e-12"))


def _ids(rows):
    return [row[0] for row in rows]


LOGICAL = [
    ("IF(1 > 2, 'yes', 'no')", "no"),
    ("IF(ISBLANK({!$Record.Missing}), 'blank', 'set')", "blank"),
    ("IF(false, 1 / 0, 2)", Decimal(2)),  # only the chosen branch is evaluated
    ("AND(true, 1 < 2, NOT(false))", True),
    ("AND(false, 1 / 0 > 1)", False),  # stops at the first false
    ("OR(false, false)", False),
    ("OR(true, 1 / 0 > 1)", True),
    ("NOT(true)", False),
    ("ISBLANK({!$Record.Empty})", True),
    ("ISBLANK('x')", False),
    ("ISNULL({!$Record.Missing})", True),
    ("BLANKVALUE({!$Record.Missing}, 'default')", "default"),
    ("BLANKVALUE('set', 1 / 0)", "set"),  # the substitute is evaluated only for a blank value
    ("NULLVALUE({!$Record.Empty}, 0)", Decimal(0)),
    ("CASE(MONTH(DATE(2024, 3, 1)), 1, 'Jan', 2, 'Feb', 3, 'Mar', 'Other')", "Mar"),
    ("CASE(7, 1, 'one', 'none')", "none"),
    ("ISNUMBER('12.5')", True),
    ("ISNUMBER('-1e3')", True),
    ("ISNUMBER('12a')", False),
    ("ISNUMBER('')", False),
    ("ISPICKVAL({!$Record.Stage}, 'Closed Won')", True),
    ("ISPICKVAL({!$Record.Stage}, 'Closed')", False),
]

TEXT = [
    ("FIND('Street', '123 Main Street')", Decimal(10)),
    ("FIND('x', 'abc')", Decimal(0)),
    ("FIND('a', 'banana', 3)", Decimal(4)),
    ("FIND('a', 'banana', 0)", Decimal(0)),
    ("FIND('', 'banana')", Decimal(0)),
    ("LPAD('my_company.com', 14, 'z')", "my_company.com"),
    ("LPAD('my_company.com', 15, 'z')", "zmy_company.com"),
    ("LPAD('my_company.com', 2)", "my"),  # a longer text is truncated
    ("LPAD('7', 3, '0')", "007"),
    ("LPAD('abc', 7, 'xy')", "xyxyabc"),
    ("LPAD('ab', 4)", "  ab"),
    ("RPAD('my_company.com', 14, 'z')", "my_company.com"),
    ("RPAD('my_company.com', 15, 'z')", "my_company.comz"),
    ("RPAD('my_company.com', 2)", "my"),
    ("RPAD('ab', 5, 'xy')", "abxyx"),
    ("INCLUDES({!$Record.Colors}, 'Blue')", True),
    ("INCLUDES({!$Record.Colors}, 'Bl')", False),
    ("INCLUDES({!$Record.Colors}, '')", False),
    ("REVERSE('abc')", "cba"),
    ("INITCAP('hello WORLD')", "Hello World"),
    ("INITCAP({!$Record.Name})", "Acme Corp"),
    ("ASCII('A')", Decimal(65)),
    ("ASCII('')", None),
    ("CHR(65)", "A"),
    ("LEFT('formula', 4)", "form"),
    ("RIGHT('formula', 3)", "ula"),
    ("MID('formula', 2, 3)", "orm"),
    ("LEN('formula')", Decimal(7)),
    ("UPPER('abc') & LOWER('DEF')", "ABCdef"),
    ("TRIM('  both sides  ')", "both sides"),
    ("SUBSTITUTE('a-b-c', '-', '+')", "a+b+c"),
    ("CONTAINS('formula', 'mul')", True),
    ("BEGINS('formula', 'form')", True),
    ("BEGINS('formula', 'Form')", False),
    ("TEXT(DATE(2005, 11, 15))", "2005-11-15"),
    ("TEXT(DATETIMEVALUE('2005-11-15 17:00:00'))", "2005-11-15 17:00:00Z"),
    ("TEXT(TIMEVALUE('17:30:45.125'))", "17:30:45.125Z"),
    ("TEXT(ROUND(2.345, 2))", "2.35"),
    ("VALUE('3.14')", Decimal("3.14")),
    ("VALUE({!$Record.Missing})", None),
]

MATH = [
    ("2 ^ 10", Decimal(1024)),
    ("2 ^ -1", Decimal("0.5")),
    ("2 ^ 0.5", _approx("1.414213562373095")),
    ("2 ^ 3 ^ 2", Decimal(512)),  # right-associative
    ("ROUND(1.5, 0)", Decimal(2)),
    ("ROUND(1.2345, 0)", Decimal(1)),
    ("ROUND(-1.5, 0)", Decimal(-2)),
    ("ROUND(225.49823, 2)", Decimal("225.50")),
    ("ROUND(2.5, 0)", Decimal(3)),  # half away from zero, not to even
    ("ROUND(1234.5678, -2)", Decimal(1200)),
    ("TRUNC(12.34567, 3)", Decimal("12.345")),
    ("TRUNC(-12.34567, 1)", Decimal("-12.3")),
    ("TRUNC(-5.5)", Decimal(-5)),
    ("TRUNC(5.99)", Decimal(5)),
    ("FLOOR(2.5)", Decimal(2)),
    ("FLOOR(-2.5)", Decimal(-2)),  # toward zero
    ("CEILING(2.5)", Decimal(3)),
    ("CEILING(-2.5)", Decimal(-3)),  # away from zero
    ("MFLOOR(2.5)", Decimal(2)),
    ("MFLOOR(-2.5)", Decimal(-3)),
    ("MCEILING(2.5)", Decimal(3)),
    ("MCEILING(-2.5)", Decimal(-2)),
    ("MOD(3, 3)", Decimal(0)),
    ("MOD(4, 3)", Decimal(1)),
    ("MOD(123, 100)", Decimal(23)),
    ("MOD(-5, 3)", Decimal(-2)),  # the sign of the dividend
    ("ABS(-3.5)", Decimal("3.5")),
    ("MAX(1, 5, 3)", Decimal(5)),
    ("MIN(1, -5, 3)", Decimal(-5)),
    ("SQRT(16)", Decimal(4)),
    ("SQRT(2)", _approx("1.414213562373095")),
    ("EXP(0)", Decimal(1)),
    ("EXP(1)", _approx("2.718281828459045")),
    ("LN(1)", Decimal(0)),
    ("LN(10)", _approx("2.302585092994046")),
    ("LOG(100)", Decimal(2)),
    ("LOG(0.001)", Decimal(-3)),
    ("ABS({!$Record.Missing})", None),  # a blank number gives a blank result
    ("ROUND({!$Record.Empty}, 2)", None),
    ("MAX(1, {!$Record.Missing})", None),
]

DATES = [
    ("DATE(2005, 1, 2)", dt.date(2005, 1, 2)),
    ("ADDMONTHS(DATE(2019, 1, 1), 3)", dt.date(2019, 4, 1)),
    ("ADDMONTHS(DATE(2020, 1, 31), 1)", dt.date(2020, 2, 29)),
    ("ADDMONTHS(DATE(2019, 1, 31), 1)", dt.date(2019, 2, 28)),
    ("ADDMONTHS(DATE(2020, 1, 30), 1)", dt.date(2020, 2, 29)),
    ("ADDMONTHS(DATE(2019, 2, 28), 1)", dt.date(2019, 3, 31)),  # the last day of a month stays the last day
    ("ADDMONTHS(DATE(2020, 2, 28), 1)", dt.date(2020, 3, 28)),
    ("ADDMONTHS(DATE(2020, 2, 29), 12)", dt.date(2021, 2, 28)),
    ("ADDMONTHS(DATE(2020, 3, 31), -1)", dt.date(2020, 2, 29)),
    ("ADDMONTHS(DATE(2020, 11, 15), 3)", dt.date(2021, 2, 15)),
    ("ADDMONTHS({!$Record.CloseDate}, 1)", dt.date(2024, 3, 31)),
    ("YEAR(DATE(2024, 2, 29))", Decimal(2024)),
    ("MONTH({!$Record.CloseDate})", Decimal(2)),
    ("DAY({!$Record.CloseDate})", Decimal(29)),
    ("WEEKDAY(DATE(2024, 6, 2))", Decimal(1)),  # Sunday
    ("WEEKDAY(DATE(2024, 6, 3))", Decimal(2)),  # Monday
    ("WEEKDAY(DATE(2024, 6, 8))", Decimal(7)),  # Saturday
    ("ISOWEEK(DATE(2021, 1, 3))", Decimal(53)),
    ("ISOYEAR(DATE(2021, 1, 3))", Decimal(2020)),
    ("ISOWEEK(DATE(2019, 12, 30))", Decimal(1)),
    ("ISOYEAR(DATE(2019, 12, 30))", Decimal(2020)),
    ("DATEVALUE('2005-11-15')", dt.date(2005, 11, 15)),
    ("DATEVALUE(DATETIMEVALUE('2005-11-15 17:00:00'))", dt.date(2005, 11, 15)),
    ("DATEVALUE({!$Record.Stamp})", dt.date(2024, 2, 29)),
    ("DATETIMEVALUE('2005-11-15 17:00:00')", dt.datetime(2005, 11, 15, 17, 0, tzinfo=UTC)),
    ("DATETIMEVALUE(DATE(2005, 11, 15))", dt.datetime(2005, 11, 15, tzinfo=UTC)),
    ("TIMEVALUE('17:30:45.125')", dt.time(17, 30, 45, 125000)),
    ("TIMEVALUE(DATETIMEVALUE('2005-11-15 17:00:00'))", dt.time(17, 0)),
    ("HOUR(TIMEVALUE('17:30:45.125'))", Decimal(17)),
    ("MINUTE(TIMEVALUE('17:30:45.125'))", Decimal(30)),
    ("SECOND(TIMEVALUE('17:30:45.125'))", Decimal(45)),
    ("MILLISECOND(TIMEVALUE('17:30:45.125'))", Decimal(125)),
    ("HOUR({!$Record.Clock})", Decimal(17)),
    ("UNIXTIMESTAMP(DATE(1970, 1, 2))", Decimal(86400)),
    ("UNIXTIMESTAMP(DATETIMEVALUE('2016-03-07 12:34:31'))", Decimal(1457354071)),
    ("UNIXTIMESTAMP(TIMEVALUE('01:00:30'))", Decimal(3630)),
    ("FROMUNIXTIME(1457354071)", dt.datetime(2016, 3, 7, 12, 34, 31, tzinfo=UTC)),
    ("TODAY()", dt.date(2024, 6, 2)),
    ("NOW()", NOW),
    ("TIMENOW()", dt.time(9, 15, 30)),
    ("DATE(2020, 2, 28) + 1", dt.date(2020, 2, 29)),
    # Date and date/time arithmetic (the operators' documented behaviour): days between two dates, the fraction
    # of a day between two date/times, a date moved by whole days only.
    ("DATE(2024, 3, 1) - DATE(2024, 1, 1)", Decimal(60)),
    ("DATETIMEVALUE('2024-01-02 00:00:00') - DATETIMEVALUE('2024-01-01 12:00:00')", Decimal("0.5")),
    ("DATETIMEVALUE('2024-01-01 12:00:00') + 0.25", dt.datetime(2024, 1, 1, 18, 0, tzinfo=UTC)),
    ("DATE(2024, 1, 10) - 1.5", dt.date(2024, 1, 9)),
    ("DATE(2024, 1, 10) + -0.5", dt.date(2024, 1, 10)),
    ("1 + DATE(2024, 1, 10)", dt.date(2024, 1, 11)),
    ("'at ' & DATETIMEVALUE('2024-01-02 03:04:05')", "at 2024-01-02 03:04:05Z"),
    ("YEAR({!$Record.Missing})", None),
    ("ADDMONTHS({!$Record.Empty}, 1)", None),
]

#: Record fields are text: a number or date field compares and matches as the value it holds.
TYPED_COMPARISONS = [
    ("{!$Record.Amount} > 100", True),
    ("{!$Record.Amount} = 250", True),
    ("'10' < 9", False),  # text against a number compares as numbers
    ("'10' < '9'", True),  # text against text compares as text
    ("VALUE({!$Record.Amount}) >= 250.00", True),
    ("CASE({!$Record.Amount}, 250, 'match', 'no match')", "match"),
    ("LEN({!$Record.Name}) = 9", True),
    ("{!$Record.CloseDate} < DATE(2024, 3, 1)", True),
    ("{!$Record.CloseDate} = TEXT(DATE(2024, 2, 29))", True),
    ("TEXT(VALUE({!$Record.Amount}) + 1)", "251"),
    ("TIMEVALUE('08:00:00') < TIMEVALUE({!$Record.Clock})", True),
    ("DATETIMEVALUE({!$Record.Stamp}) > NOW()", False),
]

FAMILIES = {"logical": LOGICAL, "text": TEXT, "math": MATH, "dates": DATES, "typed": TYPED_COMPARISONS}


def _check(expr, expected):
    got = _eval(expr)
    if expected is None or isinstance(expected, bool):
        assert got is expected
    else:
        assert got == expected
        if not isinstance(expected, type(pytest.approx(0))):
            assert type(got) is type(expected)


@pytest.mark.parametrize("expr,expected", LOGICAL, ids=_ids(LOGICAL))
def test_logical_functions(expr, expected):
    _check(expr, expected)


@pytest.mark.parametrize("expr,expected", TEXT, ids=_ids(TEXT))
def test_text_functions(expr, expected):
    _check(expr, expected)


@pytest.mark.parametrize("expr,expected", MATH, ids=_ids(MATH))
def test_math_functions(expr, expected):
    _check(expr, expected)


@pytest.mark.parametrize("expr,expected", DATES, ids=_ids(DATES))
def test_date_and_time_functions(expr, expected):
    _check(expr, expected)


@pytest.mark.parametrize("expr,expected", TYPED_COMPARISONS, ids=_ids(TYPED_COMPARISONS))
def test_record_text_compares_as_the_typed_value_it_holds(expr, expected):
    _check(expr, expected)


def test_context_functions_follow_the_trigger_context():
    values = {"$Record.Stage": "Closed Won"}
    prior = {"$Record.Stage": "Open"}.get
    assert _eval("ISCHANGED({!$Record.Stage})", values, prior=prior) is True
    assert _eval("PRIORVALUE({!$Record.Stage})", values, prior=prior) == "Open"
    assert _eval("ISCHANGED({!$Record.Stage})", values, prior=prior, is_new=True) is False
    assert _eval("PRIORVALUE({!$Record.Stage})", values, prior=prior, is_new=True) == "Closed Won"
    assert _eval("ISNEW()", is_new=True) is True
    assert CONTEXT_FUNCTIONS == {"NOW", "TODAY", "TIMENOW", "ISNEW", "ISCHANGED", "PRIORVALUE"}
    with pytest.raises(FormulaRuntimeError, match="clock"):
        evaluate(parse_formula("TODAY()"), Env(resolve={}.get))


def test_every_library_function_has_documented_rows():
    """A function added to the library without a table row fails here."""
    tested = {name for rows in FAMILIES.values() for expr, _ in rows for name in functions_used(parse_formula(expr))}
    tested |= {"ISCHANGED", "PRIORVALUE", "ISNEW"}  # test_context_functions_follow_the_trigger_context
    assert tested == set(FUNCTIONS)


@pytest.mark.parametrize("expr,code,detail", [
    ("DATE(2020, 1)", "formula_arity", "DATE takes 3..3 arguments, got 2"),
    ("ADDMONTHS(DATE(2020, 1, 1))", "formula_arity", "ADDMONTHS takes 2..2 arguments, got 1"),
    ("FIND('a')", "formula_arity", "FIND takes 2..3 arguments, got 1"),
    ("LPAD('a', 1, 'b', 'c')", "formula_arity", "LPAD takes 2..3 arguments, got 4"),
    ("TRUNC()", "formula_arity", "TRUNC takes 1..2 arguments, got 0"),
    ("TODAY(1)", "formula_arity", "TODAY takes 0..0 arguments, got 1"),
    ("CASE(1, 1, 'a', 2, 'b')", "formula_arity", "CASE takes 4..n arguments (an even number), got 5"),
    ("POWER(2, 3)", "unknown_function", "POWER"),  # the reference has the ^ operator, no POWER function
    ("datetime(2020, 1, 1, 0, 0, 0)", "unknown_function", "datetime"),
    ("IF(true, REGEX('a', 'a'), false)", "unknown_function", "REGEX"),
], ids=lambda v: v if isinstance(v, str) and "(" in v else None)
def test_arity_and_unknown_functions_are_refused_at_parse_time(expr, code, detail):
    with pytest.raises(FormulaError) as exc:
        parse_formula(expr)
    assert (exc.value.code, exc.value.detail) == (code, detail)


@pytest.mark.parametrize("expr,message", [
    ("DATE(2019, 2, 29)", "DATE(2019, 2, 29) is not a date"),
    ("DATE(2020, 13, 1)", "DATE(2020, 13, 1) is not a date"),
    ("SQRT(-1)", "SQRT of a negative number"),
    ("LN(0)", "LN of a number that is not positive"),
    ("LOG(-10)", "LOG of a number that is not positive"),
    ("MOD(1, 0)", "division by zero"),
    ("VALUE('abc')", "VALUE: not a number"),
    ("CHR(0)", "CHR: invalid code point 0"),
    ("DAY(NOW())", "DAY takes a date, got a date/time"),
    ("DAY('soon')", "DAY takes a date"),
    ("HOUR('25:00')", "HOUR takes a time"),
    ("DATEVALUE('2020-02-30')", "not a date"),
    ("DATETIMEVALUE('yesterday')", "DATETIMEVALUE: not a date/time"),
    ("ADDMONTHS(DATE(9999, 12, 1), 1)", "ADDMONTHS: year 10000 is out of range"),
    ("FROMUNIXTIME(999999999999999999)", "FROMUNIXTIME"),
    ("EXP(10000000)", "EXP: Overflow"),
    ("ROUND(1, 100)", "ROUND: InvalidOperation"),
    ("(-8) ^ 0.5", "-8 ^ 0.5 has no value"),
    ("DATE(2024, 1, 2) - DATETIMEVALUE('2024-01-01 00:00:00')", "a date and a date/time do not subtract"),
], ids=lambda v: v if isinstance(v, str) and "(" in v else None)
def test_bad_values_are_runtime_errors_naming_the_problem(expr, message):
    with pytest.raises(FormulaRuntimeError) as exc:
        _eval(expr)
    assert message in str(exc.value)


# --- through the compiler ----------------------------------------------------------
def _renewal_flow(expression: str) -> bytes:
    from . import flowxml as fx

    formula = (f"<formulas><name>Renewal</name><dataType>Date</dataType>"
               f"<expression>{expression}</expression></formulas>")
    return fx.flow(fx.variable("months", data_type="Number"), fx.variable("renewal", data_type="Date"), formula,
                   fx.assignment("Set_Renewal", None,
                                 [("renewal", "Assign", "<elementReference>Renewal</elementReference>")]),
                   start=fx.start("Set_Renewal"))


@pytest.mark.parametrize("expression,code,detail", [
    ("POWER({!months}, 2)", "unknown_function:POWER", "function POWER is not implemented by the expression evaluator"),
    ("ADDMONTHS(DATE(2020, 1, 31))", "formula_arity", "ADDMONTHS takes 2..2 arguments, got 1"),
    ("CASE({!months}, 1, DATE(2020, 1, 1))", "formula_arity", "CASE takes 4..n arguments (an even number), got 3"),
], ids=["unknown_function", "wrong_arity", "case_without_default"])
def test_a_formula_the_library_cannot_run_is_a_compile_refusal_naming_it(expression, code, detail):
    from .test_plans import _analyze

    result = _analyze(_renewal_flow(expression))
    assert result.rejected
    assert [(d.code, d.element, d.message) for d in result.errors] == [(code, "Renewal", detail)]


def test_a_compiled_formula_runs_with_the_library_semantics():
    from nexusflow.flows.interpreter import run_graph

    from .test_plans import _compile

    plan = _compile(_renewal_flow("ADDMONTHS(DATE(2020, 1, 31), {!months})"))
    assert plan.payload["formulas"]["Renewal"][:2] == ["call", "ADDMONTHS"]
    step = plan.payload["steps"][0]
    out = run_graph(plan_payload=plan.payload, graph=step["graph"], entry=step["entry_element"], record={},
                    object_name=None, now=NOW, reader=None, state={"vars": {"months": "1"}})
    assert out.state["vars"]["renewal"] == "2020-02-29"


@pytest.mark.parametrize("first", ["nexusflow.flows.formula", "nexusflow.flows.formula_functions"])
def test_the_library_loads_whichever_module_is_imported_first(first):
    import subprocess
    import sys

    code = (f"import {first}\nfrom nexusflow.flows.formula import FUNCTIONS, CONTEXT_FUNCTIONS\n"
            "print(len(FUNCTIONS), 'ADDMONTHS' in FUNCTIONS, sorted(CONTEXT_FUNCTIONS)[0])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(len(FUNCTIONS)), "True", "ISCHANGED"]
