"""Formula and merge-field expressions of Flow metadata (seed 004 section 7.2 steps 1-2).

:func:`parse_formula` turns an expression such as
``IF(ISBLANK({!Prefix}), {!$Record.Name}, {!Prefix} + '-' + {!$Record.Name})``
into a JSON AST; :func:`references` lists the merge fields it reads and
:func:`evaluate` computes it against a resolver. :func:`parse_template`
splits text-template bodies into literal text and merge fields.

AST nodes (JSON lists): ``["lit", kind, text]`` (kind ``num``/``str``/``bool``/``null``),
``["ref", "a.b.c"]``, ``["call", NAME, [args]]``, ``["bin", op, left, right]``,
``["un", op, operand]``.

Operators: ``+ - * / ^ &`` (``&`` and ``+`` on text concatenate), comparison
``= == != <> < > <= >=``, logical ``&& || !``. Functions are the closed set
:data:`FUNCTIONS`, implemented in :mod:`.formula_functions`; any other name is
a :class:`FormulaError` (``unknown_function``, detail: the name) at compile
time, never a runtime surprise, and so is a wrong argument count
(``formula_arity``). Numbers are ``Decimal``, dates ``date``, date/times
timezone-aware ``datetime`` in UTC, times ``time``; ``NOW()`` and ``TODAY()``
read the clock passed in by the caller (datetime arithmetic adds days).
"""
from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from .formula_values import (  # noqa: F401 - the value rules are part of this module's interface
    FUNCTIONS,
    Call,
    Env,
    FormulaRuntimeError,
    Function,
    _blank,
    _bool,
    _equal,
    _is_number,
    _num,
    _text,
)

MAX_EXPRESSION_CHARS = 20_000
MAX_DEPTH = 64


class FormulaError(Exception):
    """An expression cannot be parsed or names an unknown function; ``code`` is stable."""

    def __init__(self, code: str, detail: str):
        self.code, self.detail = code, detail
        super().__init__(f"{code}: {detail}")


_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<merge>\{!\s*[^{}]*?\s*\})
  | (?P<num>\d+(?:\.\d+)?|\.\d+)
  | (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
  | (?P<op>&&|\|\||==|!=|<>|<=|>=|[-+*/^&=<>!(),])
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
""", re.VERBOSE)
_REF = re.compile(r"^\$?[A-Za-z_][A-Za-z0-9_]*(?:\.\$?[A-Za-z_][A-Za-z0-9_]*)*$")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "'": "'", "\\": "\\"}


@dataclass(frozen=True)
class _Tok:
    kind: str
    text: str
    pos: int


def _tokens(source: str) -> list[_Tok]:
    out: list[_Tok] = []
    pos = 0
    while pos < len(source):
        m = _TOKEN.match(source, pos)
        if m is None:
            raise FormulaError("formula_syntax", f"unexpected character {source[pos]!r} at {pos}")
        kind = m.lastgroup or ""
        if kind != "ws":
            out.append(_Tok(kind, m.group(), pos))
        pos = m.end()
    return out


def _unquote(text: str) -> str:
    body = text[1:-1]
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), body)


def merge_reference(text: str) -> str:
    """``{!a.b}`` -> ``a.b``.

    Raises:
        FormulaError: ``formula_reference`` when the path is not a dotted name.
    """
    ref = text[2:-1].strip()
    if not _REF.match(ref):
        raise FormulaError("formula_reference", f"invalid merge field {text!r}")
    return ref


# Binding powers: higher binds tighter.
_BINARY = {"||": 10, "&&": 20, "=": 30, "==": 30, "!=": 30, "<>": 30, "<": 40, ">": 40, "<=": 40, ">=": 40,
           "+": 50, "-": 50, "&": 50, "*": 60, "/": 60, "^": 70}


class _Parser:
    def __init__(self, tokens: list[_Tok]):
        self.toks, self.i = tokens, 0

    def peek(self) -> _Tok | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self) -> _Tok:
        tok = self.peek()
        if tok is None:
            raise FormulaError("formula_syntax", "unexpected end of expression")
        self.i += 1
        return tok

    def expect(self, text: str) -> None:
        tok = self.take()
        if tok.text != text:
            raise FormulaError("formula_syntax", f"expected {text!r} at {tok.pos}, found {tok.text!r}")

    def expr(self, min_bp: int = 0, depth: int = 0) -> list:
        if depth > MAX_DEPTH:
            raise FormulaError("formula_syntax", "expression nests too deeply")
        left = self.prefix(depth)
        while True:
            tok = self.peek()
            if tok is None or tok.kind != "op" or tok.text not in _BINARY:
                return left
            bp = _BINARY[tok.text]
            if bp <= min_bp and not (tok.text == "^" and bp == min_bp):
                return left
            self.take()
            right = self.expr(bp if tok.text != "^" else bp - 1, depth + 1)
            op = {"==": "=", "<>": "!="}.get(tok.text, tok.text)
            left = ["bin", op, left, right]

    def prefix(self, depth: int) -> list:
        tok = self.take()
        if tok.kind == "num":
            return ["lit", "num", tok.text]
        if tok.kind == "str":
            return ["lit", "str", _unquote(tok.text)]
        if tok.kind == "merge":
            return ["ref", merge_reference(tok.text)]
        if tok.kind == "op" and tok.text == "(":
            inner = self.expr(0, depth + 1)
            self.expect(")")
            return inner
        if tok.kind == "op" and tok.text in ("-", "+", "!"):
            return ["un", tok.text, self.expr(65, depth + 1)]
        if tok.kind == "name":
            upper = tok.text.upper()
            nxt = self.peek()
            if nxt is not None and nxt.text == "(":
                self.take()
                if upper not in FUNCTIONS:
                    raise FormulaError("unknown_function", tok.text)
                args: list = []
                if self.peek() is not None and self.peek().text == ")":
                    self.take()
                else:
                    while True:
                        args.append(self.expr(0, depth + 1))
                        sep = self.take()
                        if sep.text == ")":
                            break
                        if sep.text != ",":
                            raise FormulaError("formula_syntax", f"expected ',' or ')' at {sep.pos}")
                fn = FUNCTIONS[upper]
                lo, hi = fn.min_args, fn.max_args
                even = " (an even number)" if fn.even_args else ""
                if len(args) < lo or (hi is not None and len(args) > hi) or (fn.even_args and len(args) % 2):
                    raise FormulaError("formula_arity", f"{upper} takes {lo}..{hi if hi is not None else 'n'} "
                                                        f"arguments{even}, got {len(args)}")
                return ["call", upper, args]
            if upper in ("TRUE", "FALSE"):
                return ["lit", "bool", upper.lower()]
            if upper == "NULL":
                return ["lit", "null", ""]
            raise FormulaError("formula_reference", f"bare name {tok.text!r}: references are written {{!{tok.text}}}")
        raise FormulaError("formula_syntax", f"unexpected {tok.text!r} at {tok.pos}")


def parse_formula(source: str) -> list:
    """Parse one expression into its JSON AST.

    Raises:
        FormulaError: ``formula_syntax``, ``formula_reference``, ``formula_arity``
            or ``unknown_function`` (detail: the function name as written).
    """
    if not isinstance(source, str) or not source.strip():
        raise FormulaError("formula_syntax", "empty expression")
    if len(source) > MAX_EXPRESSION_CHARS:
        raise FormulaError("formula_syntax", f"longer than {MAX_EXPRESSION_CHARS} characters")
    parser = _Parser(_tokens(source))
    ast = parser.expr()
    if parser.peek() is not None:
        tok = parser.peek()
        raise FormulaError("formula_syntax", f"unexpected {tok.text!r} at {tok.pos}")
    return ast


def parse_template(text: str) -> list:
    """Split a text template into ``["text", s]`` and ``["ref", path]`` parts.

    Raises:
        FormulaError: ``formula_reference`` for a malformed merge field.
    """
    parts: list = []
    pos = 0
    for m in re.finditer(r"\{![^{}]*\}", text):
        if m.start() > pos:
            parts.append(["text", text[pos:m.start()]])
        parts.append(["ref", merge_reference(m.group())])
        pos = m.end()
    if pos < len(text):
        parts.append(["text", text[pos:]])
    return parts


def references(ast: list) -> list[str]:
    """Every merge-field path an AST (or template parts list) reads, sorted, unique."""
    found: set[str] = set()

    def walk(node: Any) -> None:
        if not isinstance(node, list) or not node:
            return
        if node[0] == "ref":
            found.add(node[1])
        elif node[0] == "call":
            for a in node[2]:
                walk(a)
        elif node[0] == "bin":
            walk(node[2])
            walk(node[3])
        elif node[0] == "un":
            walk(node[2])
        elif all(isinstance(p, list) for p in node):
            for p in node:
                walk(p)

    walk(ast)
    return sorted(found)


def functions_used(ast: list) -> list[str]:
    """Function names an AST calls, sorted, unique."""
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, list) and node and node[0] == "call":
            found.add(node[1])
            for a in node[2]:
                walk(a)
        elif isinstance(node, list) and node and node[0] == "bin":
            walk(node[2])
            walk(node[3])
        elif isinstance(node, list) and node and node[0] == "un":
            walk(node[2])

    walk(ast)
    return sorted(found)


# --- evaluation ------------------------------------------------------------------
def _add(a: Any, b: Any) -> Any:
    if isinstance(a, str) or isinstance(b, str):
        return _text(a) + _text(b)
    if a is None or b is None:
        return None
    if isinstance(a, (dt.datetime, dt.date)):
        return _shift(a, _num(b))
    if isinstance(b, (dt.datetime, dt.date)):
        return _shift(b, _num(a))
    return _num(a) + _num(b)


def _shift(when: dt.date, days: Decimal) -> dt.date:
    """A date/time moved by ``days``: a date/time by the fraction too (``NOW() + 0.5`` is 12 hours later), a
    date by whole days only, the fraction dropped toward zero (``DATE(2024,1,10) - 1.5`` is 2024-01-09)."""
    if isinstance(when, dt.datetime):
        return when + dt.timedelta(days=float(days))
    return when + dt.timedelta(days=int(days))


def _difference(a: Any, b: Any) -> Any:
    """``a - b``: a date/time minus a number of days, or two dates (whole days) or two date/times (days with
    their fraction) as the number of days between them."""
    if isinstance(a, (dt.datetime, dt.date)) and isinstance(b, (dt.datetime, dt.date)):
        if isinstance(a, dt.datetime) != isinstance(b, dt.datetime):
            raise FormulaRuntimeError("a date and a date/time do not subtract; convert one with DATEVALUE or "
                                      "DATETIMEVALUE")
        if isinstance(a, dt.datetime):
            seconds = Decimal(str((a - b).total_seconds()))
            return seconds / Decimal(86400)
        return Decimal((a - b).days)
    if isinstance(a, (dt.datetime, dt.date)):
        return _shift(a, -_num(b))
    return _num(a) - _num(b)


def _power(base: Any, exponent: Any) -> Decimal:
    """``base ^ exponent``; a fractional exponent of a negative base has no real value (a runtime error)."""
    base, exponent = _num(base), _num(exponent)
    try:
        if exponent == exponent.to_integral_value():
            return base ** int(exponent)
        return base ** exponent
    except (InvalidOperation, ZeroDivisionError, OverflowError) as exc:
        raise FormulaRuntimeError(f"{base} ^ {exponent} has no value") from exc


def _compare(op: str, a: Any, b: Any) -> bool:
    if op == "=":
        return _equal(a, b)
    if op == "!=":
        return not _equal(a, b)
    if a is None or b is None:
        return False
    # Record fields are stored as text: a number field's text compares with a number as the number it holds.
    if isinstance(a, str) and _is_number(b):
        a = _num(a)
    elif isinstance(b, str) and _is_number(a):
        b = _num(b)
    # A date field's ISO text compares with a date ($Flow.CurrentDate) as the date it holds.
    if isinstance(a, str) and isinstance(b, dt.date):
        a = _iso_date(a, like=b)
    elif isinstance(b, str) and isinstance(a, dt.date):
        b = _iso_date(b, like=a)
    if not isinstance(a, (str, dt.date, dt.time)):
        a = _num(a)
    if not isinstance(b, (str, dt.date, dt.time)):
        b = _num(b)
    try:
        return {"<": a < b, ">": a > b, "<=": a <= b, ">=": a >= b}[op]
    except TypeError:
        raise FormulaRuntimeError(f"cannot compare {a!r} and {b!r}") from None


def _iso_date(text: str, *, like: dt.date) -> dt.date:
    """``text`` as a date (or datetime when ``like`` is one); unparsable text cannot be compared."""
    try:
        if isinstance(like, dt.datetime):
            return dt.datetime.fromisoformat(text)
        return dt.date.fromisoformat(text)
    except ValueError:
        raise FormulaRuntimeError(f"cannot compare {text!r} with a date") from None


def evaluate(ast: list, env: Env) -> Any:
    """Evaluate an AST; text is ``str``, numbers ``Decimal``, booleans ``bool``, null ``None``.

    Raises:
        FormulaRuntimeError: a value of the wrong type or a division by zero.
    """
    tag = ast[0]
    if tag == "lit":
        kind, text = ast[1], ast[2]
        return {"num": lambda: Decimal(text), "str": lambda: text, "bool": lambda: text == "true",
                "null": lambda: None}[kind]()
    if tag == "ref":
        return env.resolve(ast[1])
    if tag == "un":
        v = evaluate(ast[2], env)
        if ast[1] == "!":
            return not _bool(v)
        return -_num(v) if ast[1] == "-" else _num(v)
    if tag == "bin":
        op = ast[1]
        if op == "&&":
            return _bool(evaluate(ast[2], env)) and _bool(evaluate(ast[3], env))
        if op == "||":
            return _bool(evaluate(ast[2], env)) or _bool(evaluate(ast[3], env))
        a, b = evaluate(ast[2], env), evaluate(ast[3], env)
        if op in ("=", "!=", "<", ">", "<=", ">="):
            return _compare(op, a, b)
        if op == "&":
            return _text(a) + _text(b)
        if op == "+":
            return _add(a, b)
        if a is None or b is None:
            return None
        if op == "-":
            return _difference(a, b)
        if op == "*":
            return _num(a) * _num(b)
        if op == "/":
            if _num(b) == 0:
                raise FormulaRuntimeError("division by zero")
            return _num(a) / _num(b)
        if op == "^":
            return _power(a, b)
    if tag == "call":
        return _call(ast[1], ast[2], env)
    raise FormulaRuntimeError(f"unknown node {tag!r}")


def _call(name: str, args: list, env: Env) -> Any:
    fn = FUNCTIONS.get(name)
    if fn is None:
        raise FormulaRuntimeError(f"no evaluator for {name}")
    call = Call(name, args, env, evaluate)
    if fn.lazy:
        return fn.impl(call)
    values = [call.arg(i) for i in range(len(args))]
    try:
        return fn.impl(*values)
    except ArithmeticError as exc:
        raise FormulaRuntimeError(f"{name}: {type(exc).__name__}") from None


def __getattr__(name: str) -> Any:
    # CONTEXT_FUNCTIONS lives with the library (imported last, below).
    if name == "CONTEXT_FUNCTIONS":
        return formula_functions.CONTEXT_FUNCTIONS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# The library registers itself into FUNCTIONS; it imports this module's value rules.
from . import formula_functions
