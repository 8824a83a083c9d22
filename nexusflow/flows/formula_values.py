"""The values formulas compute with, and the function library's registry (seed 004 section 7.2).

Shared by the parser and evaluator (:mod:`.formula`) and the function library (:mod:`.formula_functions`),
which registers itself into :data:`FUNCTIONS`: text is ``str``, numbers ``Decimal``, booleans ``bool``,
dates ``date``/``datetime``/``time``, null ``None``.
"""
from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any


class FormulaRuntimeError(Exception):
    """Evaluation failed on a value (division by zero, wrong type)."""


@dataclass(frozen=True)
class Function:
    """One entry of the function library: arity and implementation.

    ``impl`` receives the evaluated argument values, or the :class:`Call` itself
    when ``lazy`` (it then evaluates only the arguments it needs: ``IF``, ``CASE``,
    ``BLANKVALUE``, the context functions). ``even_args``: the argument count
    must also be even (``CASE``: subject, value/result pairs, default).
    """

    name: str
    min_args: int
    max_args: int | None
    impl: Callable[..., Any]
    lazy: bool = False
    context: bool = False
    even_args: bool = False


#: The closed function library, name -> :class:`Function`; filled by ``formula_functions``.
FUNCTIONS: dict[str, Function] = {}

@dataclass(frozen=True)
class Env:
    """What evaluation may read: a reference resolver, the clock and the trigger context."""

    resolve: Callable[[str], Any]
    now: dt.datetime | None = None
    is_new: bool = False
    prior: Callable[[str], Any] | None = None


def _num(v: Any) -> Decimal:
    if isinstance(v, bool) or v is None:
        raise FormulaRuntimeError(f"expected a number, got {v!r}")
    if isinstance(v, Decimal):
        return v
    try:
        return Decimal(str(v))
    except InvalidOperation:
        raise FormulaRuntimeError(f"expected a number, got {v!r}") from None


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float, Decimal)) and not isinstance(v, bool)


def _text(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, Decimal):
        return format(v.normalize(), "f") if v == v.to_integral_value() else str(v)
    if isinstance(v, dt.datetime):  # as TEXT() writes a date/time: UTC, "YYYY-MM-DD HH:MM:SSZ"
        utc = v.astimezone(dt.UTC) if v.tzinfo else v
        return utc.strftime("%Y-%m-%d %H:%M:%SZ")
    return str(v)


def _blank(v: Any) -> bool:
    return v is None or (isinstance(v, str) and v == "")


def _bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if v is None:
        return False
    raise FormulaRuntimeError(f"expected a boolean, got {v!r}")


def _equal(a: Any, b: Any) -> bool:
    if _blank(a) and _blank(b):
        return True
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or a == b
    if isinstance(a, (int, float, Decimal)) or isinstance(b, (int, float, Decimal)):
        try:
            return _num(a) == _num(b)
        except FormulaRuntimeError:
            return False
    return a == b


@dataclass(frozen=True)
class Call:
    """One function call being evaluated: what a lazy implementation reads."""

    name: str
    args: list
    env: Env
    #: ``evaluate(ast, env)`` of :mod:`.formula` (the evaluator that made this call).
    evaluator: Callable[[list, Env], Any]

    def arg(self, i: int) -> Any:
        """The value of argument ``i`` (0-based), evaluated now."""
        return self.evaluator(self.args[i], self.env)
