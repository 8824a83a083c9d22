"""The function library of Flow formulas (seed 004 section 7.2 steps 1-2).

Each function registers into :data:`.formula_values.FUNCTIONS` with its arity and its
implementation; the parser refuses any other name (``unknown_function``) and
a wrong argument count (``formula_arity``) at compile time. The semantics are
those of the Flow formula language's operator and function reference:

- logical: ``AND OR NOT IF CASE ISBLANK ISNULL BLANKVALUE NULLVALUE ISNUMBER
  ISPICKVAL`` and the trigger-context ``ISNEW ISCHANGED PRIORVALUE``;
- text: ``TEXT VALUE LEN UPPER LOWER TRIM LEFT RIGHT MID CONTAINS BEGINS
  SUBSTITUTE FIND LPAD RPAD INCLUDES REVERSE INITCAP ASCII CHR``;
- math: ``ABS ROUND TRUNC FLOOR CEILING MFLOOR MCEILING MOD MAX MIN SQRT EXP
  LN LOG``;
- date and time: ``TODAY NOW TIMENOW DATE DATEVALUE DATETIMEVALUE TIMEVALUE
  ADDMONTHS YEAR MONTH DAY WEEKDAY ISOWEEK ISOYEAR HOUR MINUTE SECOND
  MILLISECOND UNIXTIMESTAMP FROMUNIXTIME``.

Value rules: a blank argument (null or ``""``) of a math or date function
gives a blank result, as the language's "treat blank fields as blanks" does;
text functions read a blank as ``""``. Record fields arrive as text, so a date
argument may be ISO text (``2020-01-31``), a date/time ISO text
(``2020-01-31 17:00:00`` or ``2020-01-31T17:00:00Z``, UTC when no offset) and
a time ``17:30:45.125``. Date/times are timezone-aware UTC (``NOW()`` is the
database clock). A value of the wrong type or out of range (``DATE(2019, 2,
29)``, ``SQRT(-1)``) raises :class:`.formula_values.FormulaRuntimeError`.
"""
from __future__ import annotations

import calendar
import datetime as dt
import re
from collections.abc import Callable
from decimal import ROUND_CEILING, ROUND_DOWN, ROUND_FLOOR, ROUND_HALF_UP, ROUND_UP, Decimal
from types import EllipsisType
from typing import Any

from .formula_values import FUNCTIONS, Call, FormulaRuntimeError, Function, _blank, _bool, _equal, _num, _text

_NUMBER_TEXT = re.compile(r"^\s*[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?\s*$")
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
#: An optional argument that was not given (``LPAD``'s pad).
_ABSENT = object()


def _register(name: str, lo: int, hi: int | None | EllipsisType = ..., *, lazy: bool = False,
              context: bool = False, blank_out: bool = False,
              even_args: bool = False) -> Callable[[Callable], Callable]:
    """Register the decorated implementation as ``name`` taking ``lo..hi`` arguments.

    ``hi``: ``...`` for exactly ``lo``, None for any number. ``blank_out``: a
    blank argument gives a blank result without calling the implementation.
    """
    def deco(impl: Callable) -> Callable:
        def blank_safe(*values: Any) -> Any:
            return None if any(_blank(v) for v in values) else impl(*values)

        FUNCTIONS[name] = Function(name=name, min_args=lo, max_args=lo if hi is ... else hi,
                                   impl=blank_safe if blank_out else impl, lazy=lazy, context=context,
                                   even_args=even_args)
        return impl
    return deco


def _int(v: Any) -> int:
    """A whole-number argument (a count, a position, digits): the number truncated toward zero."""
    return int(_num(v))


def _whole(v: Decimal) -> Decimal:
    return Decimal(int(v))


def _date(v: Any, fn: str) -> dt.date:
    if isinstance(v, dt.datetime):
        raise FormulaRuntimeError(f"{fn} takes a date, got a date/time (use DATEVALUE)")
    if isinstance(v, dt.date):
        return v
    if isinstance(v, str):
        try:
            return dt.date.fromisoformat(v.strip())
        except ValueError:
            pass
    raise FormulaRuntimeError(f"{fn} takes a date, got {v!r}")


def _datetime(v: Any, fn: str) -> dt.datetime:
    if isinstance(v, dt.datetime):
        return v.replace(tzinfo=dt.UTC) if v.tzinfo is None else v.astimezone(dt.UTC)
    if isinstance(v, str):
        try:
            parsed = dt.datetime.fromisoformat(v.strip())
        except ValueError:
            raise FormulaRuntimeError(f"{fn}: not a date/time: {v!r}") from None
        return _datetime(parsed, fn)
    raise FormulaRuntimeError(f"{fn} takes a date/time, got {v!r}")


def _time(v: Any, fn: str) -> dt.time:
    if isinstance(v, dt.time):
        return v
    if isinstance(v, str):
        try:
            return dt.time.fromisoformat(v.strip().removesuffix("Z"))
        except ValueError:
            pass
    raise FormulaRuntimeError(f"{fn} takes a time, got {v!r}")


# --- logical ---------------------------------------------------------------------
@_register("IF", 3, lazy=True)
def _if(call: Call) -> Any:
    """``IF(test, then, else)``: only the chosen branch is evaluated."""
    return call.arg(1) if _bool(call.arg(0)) else call.arg(2)


@_register("AND", 1, None, lazy=True)
def _and(call: Call) -> bool:
    """``AND(a, b, ...)``: true when every argument is; stops at the first false."""
    return all(_bool(call.arg(i)) for i in range(len(call.args)))


@_register("OR", 1, None, lazy=True)
def _or(call: Call) -> bool:
    """``OR(a, b, ...)``: true when any argument is; stops at the first true."""
    return any(_bool(call.arg(i)) for i in range(len(call.args)))


@_register("NOT", 1)
def _not(v: Any) -> bool:
    return not _bool(v)


@_register("ISBLANK", 1)
@_register("ISNULL", 1)
def _isblank(v: Any) -> bool:
    """True for null and for empty text."""
    return _blank(v)


@_register("BLANKVALUE", 2, lazy=True)
@_register("NULLVALUE", 2, lazy=True)
def _blankvalue(call: Call) -> Any:
    """``BLANKVALUE(value, substitute)``: the substitute is evaluated only for a blank value."""
    v = call.arg(0)
    return call.arg(1) if _blank(v) else v


@_register("CASE", 4, None, lazy=True, even_args=True)
def _case(call: Call) -> Any:
    """``CASE(subject, value1, result1, ..., default)``: the first equal value's result, else the default."""
    subject = call.arg(0)
    last = len(call.args) - 1
    for i in range(1, last, 2):
        if _equal(subject, call.arg(i)):
            return call.arg(i + 1)
    return call.arg(last)


@_register("ISNUMBER", 1)
def _isnumber(v: Any) -> bool:
    """``ISNUMBER("12.5")`` is true; blank or any other text is false."""
    if isinstance(v, (int, Decimal)) and not isinstance(v, bool):
        return True
    return isinstance(v, str) and bool(_NUMBER_TEXT.match(v))


@_register("ISPICKVAL", 2)
def _ispickval(field: Any, literal: Any) -> bool:
    """``ISPICKVAL(picklist, "Value")``: the picklist's value is exactly the text."""
    return _text(field) == _text(literal)


@_register("ISNEW", 0, lazy=True, context=True)
def _isnew(call: Call) -> bool:
    return call.env.is_new


@_register("ISCHANGED", 1, lazy=True, context=True)
@_register("PRIORVALUE", 1, lazy=True, context=True)
def _prior(call: Call) -> Any:
    """The Flow language's rules: on a record being created ISCHANGED is false and PRIORVALUE is the
    field's current value; on an update both compare with the value the triggering save replaced."""
    env = call.env
    if call.args[0][0] != "ref" or env.prior is None:
        raise FormulaRuntimeError(f"{call.name} needs a field reference and the prior record")
    if env.is_new:
        return False if call.name == "ISCHANGED" else call.arg(0)
    prior = env.prior(call.args[0][1])
    return prior if call.name == "PRIORVALUE" else not _equal(prior, call.arg(0))


# --- text ------------------------------------------------------------------------
@_register("TEXT", 1)
def _to_text(v: Any) -> str:
    """Text of a value: a date ``2005-11-15``, a date/time ``2005-11-15 17:00:00Z`` (UTC), a time
    ``17:30:45.125Z``."""
    if isinstance(v, dt.datetime):
        return _datetime(v, "TEXT").strftime("%Y-%m-%d %H:%M:%SZ")
    if isinstance(v, dt.time):
        return v.strftime("%H:%M:%S.") + f"{v.microsecond // 1000:03d}Z"
    return _text(v)


@_register("VALUE", 1)
def _value(v: Any) -> Decimal | None:
    """``VALUE("3.14")`` is 3.14; blank gives blank; text that is not a number is an error."""
    if _blank(v):
        return None
    if isinstance(v, str) and not _NUMBER_TEXT.match(v):
        raise FormulaRuntimeError(f"VALUE: not a number: {v!r}")
    return _num(v)


@_register("LEN", 1)
def _len(v: Any) -> Decimal:
    return Decimal(len(_text(v)))


@_register("UPPER", 1)
def _upper(v: Any) -> str:
    return _text(v).upper()


@_register("LOWER", 1)
def _lower(v: Any) -> str:
    return _text(v).lower()


@_register("TRIM", 1)
def _trim(v: Any) -> str:
    """Leading and trailing spaces removed."""
    return _text(v).strip()


@_register("LEFT", 2)
def _left(v: Any, n: Any) -> str:
    """The first ``n`` characters; ``n`` below zero is zero."""
    return _text(v)[: max(_int(n), 0)]


@_register("RIGHT", 2)
def _right(v: Any, n: Any) -> str:
    count = max(_int(n), 0)
    return _text(v)[-count:] if count else ""


@_register("MID", 3)
def _mid(v: Any, start: Any, n: Any) -> str:
    """``MID(text, start, count)``: ``start`` is 1-based."""
    first = max(_int(start), 1) - 1
    return _text(v)[first:first + max(_int(n), 0)]


@_register("CONTAINS", 2)
def _contains(text: Any, part: Any) -> bool:
    return _text(part) in _text(text)


@_register("BEGINS", 2)
def _begins(text: Any, prefix: Any) -> bool:
    return _text(text).startswith(_text(prefix))


@_register("SUBSTITUTE", 3)
def _substitute(text: Any, old: Any, new: Any) -> str:
    return _text(text).replace(_text(old), _text(new))


@_register("FIND", 2, 3)
def _find(search: Any, text: Any, start: Any = 1) -> Decimal:
    """``FIND(search, text[, start])``: the 1-based position of ``search`` at or after ``start``, 0 when absent,
    when ``search`` is blank or when ``start`` is below 1."""
    needle, hay, first = _text(search), _text(text), _int(start) if not _blank(start) else 1
    if not needle or first < 1:
        return Decimal(0)
    return Decimal(hay.find(needle, first - 1) + 1)


def _pad(text: Any, length: Any, pad: Any, *, left: bool) -> str:
    body, width = _text(text), max(_int(length), 0)
    fill = " " if pad is _ABSENT else _text(pad)
    if len(body) >= width or not fill:
        return body[:width]
    padding = (fill * (width // len(fill) + 1))[: width - len(body)]
    return padding + body if left else body + padding


@_register("LPAD", 2, 3)
def _lpad(text: Any, length: Any, pad: Any = _ABSENT) -> str:
    """``LPAD(text, length[, pad])``: ``pad`` (default a space) repeated on the left up to ``length``
    characters; a longer text is cut to its first ``length`` characters."""
    return _pad(text, length, pad, left=True)


@_register("RPAD", 2, 3)
def _rpad(text: Any, length: Any, pad: Any = _ABSENT) -> str:
    """``RPAD(text, length[, pad])``: as LPAD, padding on the right."""
    return _pad(text, length, pad, left=False)


@_register("INCLUDES", 2)
def _includes(field: Any, literal: Any) -> bool:
    """``INCLUDES(multiselect, "Value")``: the ``;``-separated selection holds the value."""
    wanted = _text(literal)
    return bool(wanted) and wanted in _text(field).split(";")


@_register("REVERSE", 1)
def _reverse(v: Any) -> str:
    return _text(v)[::-1]


@_register("INITCAP", 1)
def _initcap(v: Any) -> str:
    """Lower case with the first letter of each whitespace-separated word in upper case."""
    return re.sub(r"(^|\s)(\S)", lambda m: m.group(1) + m.group(2).upper(), _text(v).lower())


@_register("ASCII", 1)
def _ascii(v: Any) -> Decimal | None:
    """The code point of the first character; blank for blank text."""
    text = _text(v)
    return Decimal(ord(text[0])) if text else None


@_register("CHR", 1, blank_out=True)
def _chr(v: Any) -> str:
    """The character of a code point; 0, a surrogate or a value past U+10FFFF is an error."""
    code = _int(v)
    if not 0 < code <= 0x10FFFF or 0xD800 <= code <= 0xDFFF:
        raise FormulaRuntimeError(f"CHR: invalid code point {code}")
    return chr(code)


# --- math ------------------------------------------------------------------------
@_register("ABS", 1, blank_out=True)
def _abs(v: Any) -> Decimal:
    return abs(_num(v))


@_register("ROUND", 2, blank_out=True)
def _round(v: Any, digits: Any) -> Decimal:
    """``ROUND(number, digits)``: half away from zero; negative digits round left of the point."""
    places = _int(digits)
    rounded = _num(v).quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP)
    return rounded if places >= 0 else _whole(rounded)


@_register("TRUNC", 1, 2, blank_out=True)
def _trunc(v: Any, digits: Any = 0) -> Decimal:
    """``TRUNC(number[, digits])``: the digits after ``digits`` dropped, toward zero."""
    places = _int(digits)
    cut = _num(v).quantize(Decimal(1).scaleb(-places), rounding=ROUND_DOWN)
    return cut if places >= 0 else _whole(cut)


@_register("FLOOR", 1, blank_out=True)
def _floor(v: Any) -> Decimal:
    """Down to an integer, toward zero for a negative number: ``FLOOR(-2.5)`` is -2."""
    return _whole(_num(v).to_integral_value(rounding=ROUND_DOWN))


@_register("CEILING", 1, blank_out=True)
def _ceiling(v: Any) -> Decimal:
    """Up to an integer, away from zero for a negative number: ``CEILING(-2.5)`` is -3."""
    return _whole(_num(v).to_integral_value(rounding=ROUND_UP))


@_register("MFLOOR", 1, blank_out=True)
def _mfloor(v: Any) -> Decimal:
    """The mathematical floor: ``MFLOOR(-2.5)`` is -3."""
    return _whole(_num(v).to_integral_value(rounding=ROUND_FLOOR))


@_register("MCEILING", 1, blank_out=True)
def _mceiling(v: Any) -> Decimal:
    """The mathematical ceiling: ``MCEILING(-2.5)`` is -2."""
    return _whole(_num(v).to_integral_value(rounding=ROUND_CEILING))


@_register("MOD", 2, blank_out=True)
def _mod(v: Any, divisor: Any) -> Decimal:
    """The remainder, with the sign of the dividend; a zero divisor is an error."""
    d = _num(divisor)
    if d == 0:
        raise FormulaRuntimeError("division by zero")
    return _num(v) % d


@_register("MAX", 1, None, blank_out=True)
def _max(*values: Any) -> Decimal:
    return max(_num(v) for v in values)


@_register("MIN", 1, None, blank_out=True)
def _min(*values: Any) -> Decimal:
    return min(_num(v) for v in values)


@_register("SQRT", 1, blank_out=True)
def _sqrt(v: Any) -> Decimal:
    """The positive square root; a negative number is an error."""
    n = _num(v)
    if n < 0:
        raise FormulaRuntimeError(f"SQRT of a negative number {n}")
    return n.sqrt()


@_register("EXP", 1, blank_out=True)
def _exp(v: Any) -> Decimal:
    """e raised to the number."""
    return _num(v).exp()


def _positive(v: Any, fn: str) -> Decimal:
    n = _num(v)
    if n <= 0:
        raise FormulaRuntimeError(f"{fn} of a number that is not positive: {n}")
    return n


@_register("LN", 1, blank_out=True)
def _ln(v: Any) -> Decimal:
    """The natural logarithm; zero or a negative number is an error."""
    return _positive(v, "LN").ln()


@_register("LOG", 1, blank_out=True)
def _log(v: Any) -> Decimal:
    """The base-10 logarithm; zero or a negative number is an error."""
    return _positive(v, "LOG").log10()


# --- date and time ---------------------------------------------------------------
def _clock(call: Call) -> dt.datetime:
    if call.env.now is None:
        raise FormulaRuntimeError(f"{call.name}() needs the run clock")
    return call.env.now


@_register("NOW", 0, lazy=True, context=True)
def _now(call: Call) -> dt.datetime:
    return _clock(call)


@_register("TODAY", 0, lazy=True, context=True)
def _today(call: Call) -> dt.date:
    return _clock(call).date()


@_register("TIMENOW", 0, lazy=True, context=True)
def _timenow(call: Call) -> dt.time:
    """The clock's time of day in UTC."""
    return _datetime(_clock(call), "TIMENOW").time()


@_register("DATE", 3, blank_out=True)
def _make_date(year: Any, month: Any, day: Any) -> dt.date:
    """``DATE(2005, 1, 2)``; a date that does not exist (``DATE(2019, 2, 29)``) is an error."""
    y, m, d = _int(year), _int(month), _int(day)
    try:
        return dt.date(y, m, d)
    except ValueError:
        raise FormulaRuntimeError(f"DATE({y}, {m}, {d}) is not a date") from None


@_register("DATEVALUE", 1, blank_out=True)
def _datevalue(v: Any) -> dt.date:
    """The date of a date/time (UTC) or of text ``2005-11-15`` / ``2005-11-15 17:00:00``."""
    if isinstance(v, dt.datetime):
        return _datetime(v, "DATEVALUE").date()
    if isinstance(v, dt.date):
        return v
    text = _text(v).strip()
    try:
        return dt.date.fromisoformat(text) if len(text) == 10 else _datetime(text, "DATEVALUE").date()
    except (ValueError, FormulaRuntimeError):
        raise FormulaRuntimeError(f"not a date: {v!r}") from None


@_register("DATETIMEVALUE", 1, blank_out=True)
def _datetimevalue(v: Any) -> dt.datetime:
    """A date/time (UTC) from text ``2005-11-15 17:00:00`` or a date (its midnight UTC)."""
    if isinstance(v, dt.date) and not isinstance(v, dt.datetime):
        return dt.datetime.combine(v, dt.time(), tzinfo=dt.UTC)
    return _datetime(v, "DATETIMEVALUE")


@_register("TIMEVALUE", 1, blank_out=True)
def _timevalue(v: Any) -> dt.time:
    """A time from text ``17:30:45.125`` or from a date/time (its UTC time of day)."""
    if isinstance(v, dt.datetime):
        return _datetime(v, "TIMEVALUE").time()
    return _time(v, "TIMEVALUE")


@_register("ADDMONTHS", 2, blank_out=True)
def _addmonths(v: Any, months: Any) -> dt.date:
    """``ADDMONTHS(date, n)``: n months later (earlier when negative). The last day of a month stays the last
    day; a day past the end of the resulting month becomes its last day."""
    start = _date(v, "ADDMONTHS")
    index = start.year * 12 + start.month - 1 + _int(months)
    year, month = divmod(index, 12)
    month += 1
    if not dt.MINYEAR <= year <= dt.MAXYEAR:
        raise FormulaRuntimeError(f"ADDMONTHS: year {year} is out of range")
    last = calendar.monthrange(year, month)[1]
    at_end = start.day == calendar.monthrange(start.year, start.month)[1]
    return dt.date(year, month, last if at_end else min(start.day, last))


@_register("YEAR", 1, blank_out=True)
def _year(v: Any) -> Decimal:
    return Decimal(_date(v, "YEAR").year)


@_register("MONTH", 1, blank_out=True)
def _month(v: Any) -> Decimal:
    """1 for January to 12 for December."""
    return Decimal(_date(v, "MONTH").month)


@_register("DAY", 1, blank_out=True)
def _day(v: Any) -> Decimal:
    return Decimal(_date(v, "DAY").day)


@_register("WEEKDAY", 1, blank_out=True)
def _weekday(v: Any) -> Decimal:
    """1 for Sunday to 7 for Saturday."""
    return Decimal(_date(v, "WEEKDAY").isoweekday() % 7 + 1)


@_register("ISOWEEK", 1, blank_out=True)
def _isoweek(v: Any) -> Decimal:
    """The ISO 8601 week number, 1 to 53; weeks start on Monday."""
    return Decimal(_date(v, "ISOWEEK").isocalendar().week)


@_register("ISOYEAR", 1, blank_out=True)
def _isoyear(v: Any) -> Decimal:
    """The ISO 8601 week-numbering year (``ISOYEAR(DATE(2021, 1, 3))`` is 2020)."""
    return Decimal(_date(v, "ISOYEAR").isocalendar().year)


@_register("HOUR", 1, blank_out=True)
def _hour(v: Any) -> Decimal:
    """0 to 23 of a time."""
    return Decimal(_time(v, "HOUR").hour)


@_register("MINUTE", 1, blank_out=True)
def _minute(v: Any) -> Decimal:
    return Decimal(_time(v, "MINUTE").minute)


@_register("SECOND", 1, blank_out=True)
def _second(v: Any) -> Decimal:
    return Decimal(_time(v, "SECOND").second)


@_register("MILLISECOND", 1, blank_out=True)
def _millisecond(v: Any) -> Decimal:
    return Decimal(_time(v, "MILLISECOND").microsecond // 1000)


@_register("UNIXTIMESTAMP", 1, blank_out=True)
def _unixtimestamp(v: Any) -> Decimal:
    """Seconds since 1970-01-01 00:00:00 UTC of a date/time or a date (its midnight UTC); of a time, the
    seconds since midnight."""
    if isinstance(v, dt.time):
        return Decimal(v.hour * 3600 + v.minute * 60 + v.second)
    if isinstance(v, dt.date) and not isinstance(v, dt.datetime):
        v = dt.datetime.combine(v, dt.time(), tzinfo=dt.UTC)
    elif isinstance(v, str) and len(v.strip()) == 10:
        v = dt.datetime.combine(_date(v, "UNIXTIMESTAMP"), dt.time(), tzinfo=dt.UTC)
    delta = _datetime(v, "UNIXTIMESTAMP") - _EPOCH
    return Decimal(delta.days * 86400 + delta.seconds)


@_register("FROMUNIXTIME", 1, blank_out=True)
def _fromunixtime(v: Any) -> dt.datetime:
    """The UTC date/time that is the given number of seconds after 1970-01-01 00:00:00 UTC."""
    try:
        return _EPOCH + dt.timedelta(seconds=int(_num(v)))
    except OverflowError:
        raise FormulaRuntimeError(f"FROMUNIXTIME: {v!r} is out of range") from None


#: Functions whose value depends on the clock or the trigger context, not only on inputs.
CONTEXT_FUNCTIONS = frozenset(name for name, fn in FUNCTIONS.items() if fn.context)
