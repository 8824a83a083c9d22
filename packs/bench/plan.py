"""The hot-account capacity plan: its file format, loading, and the verdict of each budget (no database).

A plan (``packs/bench/plans/hot_account.json``) declares the offered
workload of one account's transaction mix per operation class
(:data:`OPERATION_CLASSES`), the forecast peak and headroom it must cover,
and the budgets a run is judged against. :func:`load_plan` reads and checks
a plan (JSON Schema :data:`PLAN_SCHEMA`, then the cross-field rules) and
raises :class:`PlanError` with every problem of a bad one;
:func:`budget_verdicts` judges a run's figures. The runner is
:mod:`packs.bench.hot_account`; the method and this machine's figures are in
``docs/scaling.md``. Seed 003, "State machines" (the AccountServingGate
capacity test), proof S003-RP-08.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

#: Plan file format id (``"format"`` in the file).
PLAN_FORMAT = "nexusflow.capacity-plan.v1"
#: Classes the runner offers itself: at a rate (open-loop arrivals) or a count spread over the window.
DRIVEN_CLASSES = ("admission", "replay_admission", "outbound_authoring", "credential_revocation", "halt")
#: Classes the driven ones cause (worker processes do them); their offered units follow their drivers.
DERIVED_CLASSES = ("materialization", "execution_claim", "flow_step_claim", "permit_acquisition", "settlement")
#: Every operation class of seed 003's hot-account transaction mix, in report order.
OPERATION_CLASSES = ("admission", "replay_admission", "materialization", "execution_claim", "flow_step_claim",
                     "outbound_authoring", "permit_acquisition", "settlement", "credential_revocation", "halt")
#: Which drivers a derived class may follow (one unit of a driver offers one unit, or for Flow steps some units).
FOLLOWABLE = {"materialization": {"admission", "outbound_authoring"},
              "execution_claim": {"admission", "outbound_authoring"},
              "flow_step_claim": {"outbound_authoring"},
              "permit_acquisition": {"outbound_authoring"},
              "settlement": {"outbound_authoring"}}
#: Class budgets: figure -> direction (``at_least`` or ``at_most``).
CLASS_BUDGETS = {"throughput_per_second_at_least": "at_least", "completed_at_least": "at_least",
                 "p95_ms_at_most": "at_most", "p99_ms_at_most": "at_most", "starvation_ms_at_most": "at_most"}

_POSITIVE = {"type": "number", "exclusiveMinimum": 0}
_NON_NEGATIVE = {"type": "number", "minimum": 0}
_CLASS_BUDGET = {
    "type": "object", "additionalProperties": False,
    "properties": {name: _NON_NEGATIVE for name in CLASS_BUDGETS},
    "required": ["p95_ms_at_most", "p99_ms_at_most", "starvation_ms_at_most"],
}
#: The plan's JSON Schema (draft 2020-12); :func:`load_plan` adds the rules a schema cannot say.
PLAN_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object", "additionalProperties": False,
    "required": ["format", "name", "service", "accounts", "workload", "budgets"],
    "properties": {
        "format": {"const": PLAN_FORMAT},
        "name": {"type": "string", "pattern": "^[a-z0-9_]{1,40}$"},
        "description": {"type": "string"},
        "service": {"type": "string", "minLength": 1},
        "accounts": {
            "type": "object", "additionalProperties": False, "required": ["inbound", "outbound"],
            "properties": {"inbound": {"type": "string", "minLength": 1},
                           "outbound": {"type": "string", "minLength": 1}},
        },
        "forecast": {
            "type": "object", "additionalProperties": False, "required": ["headroom", "peak_per_second"],
            "properties": {
                "headroom": {"type": "number", "minimum": 1},
                "peak_per_second": {"type": "object", "propertyNames": {"enum": list(DRIVEN_CLASSES)},
                                    "additionalProperties": _POSITIVE},
            },
        },
        "workload": {
            "type": "object", "additionalProperties": False,
            "required": ["duration_seconds", "workers_per_role", "senders", "warm_contacts", "classes"],
            "properties": {
                "duration_seconds": {"type": "number", "exclusiveMinimum": 0, "maximum": 600},
                "workers_per_role": {"type": "integer", "minimum": 1, "maximum": 4},
                "senders": {"type": "integer", "minimum": 1, "maximum": 16},
                "warm_contacts": {"type": "integer", "minimum": 0, "maximum": 5000},
                "drain_timeout_seconds": {"type": "number", "exclusiveMinimum": 0, "maximum": 600},
                # InnoDB refreshes INNODB_LOCK_WAITS only when it was not read for 100 ms.
                "gate_lock_sample_ms": {"type": "number", "minimum": 110, "maximum": 1000},
                "gate_probe_per_second": {"type": "number", "exclusiveMinimum": 0, "maximum": 100},
                "classes": {
                    "type": "object", "additionalProperties": False,
                    "required": list(OPERATION_CLASSES),
                    "properties": {
                        **{name: {"type": "object", "additionalProperties": False,
                                  "properties": {"rate_per_second": _POSITIVE,
                                                 "count": {"type": "integer", "minimum": 1}}}
                           for name in ("admission", "replay_admission", "outbound_authoring")},
                        "halt": {"type": "object", "additionalProperties": False,
                                 "properties": {"rate_per_second": _POSITIVE, "count": {"type": "integer", "minimum": 1},
                                                "after_drain": {"type": "integer", "minimum": 0}}},
                        "credential_revocation": {
                            "type": "object", "additionalProperties": False,
                            "properties": {"rate_per_second": _POSITIVE, "count": {"type": "integer", "minimum": 1},
                                           "hold_seconds": _NON_NEGATIVE}},
                        **{name: {"type": "object", "additionalProperties": False, "required": ["follows"],
                                  "properties": {"follows": {"type": "array", "minItems": 1, "uniqueItems": True,
                                                             "items": {"type": "string"}}}}
                           for name in DERIVED_CLASSES},
                    },
                },
            },
        },
        "budgets": {
            "type": "object", "additionalProperties": False,
            "required": ["classes", "gate_lock_wait", "deadlocks_at_most", "retries_at_most"],
            "properties": {
                "classes": {"type": "object", "additionalProperties": False, "required": list(OPERATION_CLASSES),
                            "properties": {name: _CLASS_BUDGET for name in OPERATION_CLASSES}},
                "gate_lock_wait": {"type": "object", "additionalProperties": False,
                                   "required": ["p95_ms_at_most", "p99_ms_at_most"],
                                   "properties": {"p95_ms_at_most": _NON_NEGATIVE, "p99_ms_at_most": _NON_NEGATIVE}},
                "deadlocks_at_most": {"type": "integer", "minimum": 0},
                "retries_at_most": {"type": "integer", "minimum": 0},
            },
        },
    },
}


class PlanError(Exception):
    """The plan file cannot be used; ``problems`` lists every reason, each naming where in the file."""

    def __init__(self, path: str, problems: list[str]):
        self.path, self.problems = path, problems
        super().__init__(f"capacity plan {path} is not usable:\n" + "\n".join(f"  - {p}" for p in problems))


def _where(parts) -> str:
    return "/".join(str(p) for p in parts) or "(the plan)"


def _schema_problems(document: Any) -> list[str]:
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(PLAN_SCHEMA)
    errors = sorted(validator.iter_errors(document), key=lambda e: (list(map(str, e.absolute_path)), e.message))
    return [f"{_where(e.absolute_path)}: {e.message}" for e in errors]


def _rule_problems(plan: dict[str, Any], base: Path) -> list[str]:
    problems = []
    if not (base / plan["service"]).is_file():
        problems.append(f"service: {plan['service']} is not a file (paths are relative to the repository)")
    workload, classes = plan["workload"], plan["workload"]["classes"]
    for name in DRIVEN_CLASSES:
        given = [k for k in ("rate_per_second", "count") if k in classes[name]]
        if len(given) != 1:
            problems.append(f"workload/classes/{name}: give exactly one of rate_per_second or count "
                            f"(found {given or 'neither'})")
    for name in DERIVED_CLASSES:
        wrong = sorted(set(classes[name]["follows"]) - FOLLOWABLE[name])
        if wrong:
            problems.append(f"workload/classes/{name}/follows: {wrong} cannot drive {name} "
                            f"(it follows {sorted(FOLLOWABLE[name])})")
    for name in OPERATION_CLASSES:
        budget = plan["budgets"]["classes"][name]
        has = [k for k in ("throughput_per_second_at_least", "completed_at_least") if k in budget]
        if len(has) != 1:
            problems.append(f"budgets/classes/{name}: give exactly one of throughput_per_second_at_least or "
                            f"completed_at_least (found {has or 'neither'})")
        if budget["p95_ms_at_most"] > budget["p99_ms_at_most"]:
            problems.append(f"budgets/classes/{name}: p95_ms_at_most {budget['p95_ms_at_most']} exceeds "
                            f"p99_ms_at_most {budget['p99_ms_at_most']}")
    gate = plan["budgets"]["gate_lock_wait"]
    if gate["p95_ms_at_most"] > gate["p99_ms_at_most"]:
        problems.append(f"budgets/gate_lock_wait: p95_ms_at_most {gate['p95_ms_at_most']} exceeds "
                        f"p99_ms_at_most {gate['p99_ms_at_most']}")
    forecast = plan.get("forecast")
    if forecast:
        for name, peak in forecast["peak_per_second"].items():
            offered = offered_per_second(plan, name) if not problems else None
            if offered is not None and offered < peak * forecast["headroom"]:
                problems.append(f"workload/classes/{name}: offers {offered:g}/s, below the forecast peak "
                                f"{peak:g}/s x headroom {forecast['headroom']:g} = {peak * forecast['headroom']:g}/s")
    if plan["accounts"]["inbound"] == plan["accounts"]["outbound"]:
        problems.append("accounts: inbound and outbound name the same account; the service has one of each")
    if workload["warm_contacts"] < _offered_units(plan, "outbound_authoring") and not problems:
        problems.append(f"workload/warm_contacts: {workload['warm_contacts']} contacts cannot carry "
                        f"{_offered_units(plan, 'outbound_authoring')} outbound_authoring units (one each)")
    return problems


def window_units(plan: dict[str, Any], name: str) -> int:
    """The units driven class ``name`` is offered within the window (``count``, or ``floor(rate x duration)``).

    Raises ``KeyError`` for a class that is not driven.
    """
    spec, duration = plan["workload"]["classes"][name], plan["workload"]["duration_seconds"]
    if "count" in spec:
        return int(spec["count"])
    return int(math.floor(spec["rate_per_second"] * duration))


def _offered_units(plan: dict[str, Any], name: str) -> int:
    return window_units(plan, name) + int(plan["workload"]["classes"][name].get("after_drain", 0))


def offered_per_second(plan: dict[str, Any], name: str) -> float:
    """The offered rate of class ``name`` in units/s over the plan's window (a derived class: its drivers' sum).

    A ``count`` class offers ``count / duration_seconds``. Raises ``KeyError`` for an unknown class.
    """
    spec, duration = plan["workload"]["classes"][name], plan["workload"]["duration_seconds"]
    if "follows" in spec:
        return sum(offered_per_second(plan, driver) for driver in spec["follows"])
    return spec["rate_per_second"] if "rate_per_second" in spec else spec["count"] / duration


def offered_units(plan: dict[str, Any], name: str) -> int:
    """The units class ``name`` is offered in one run (a derived class: its drivers' sum; Flow steps per run vary).

    A ``halt`` class's ``after_drain`` units (halts once the window's work drained) are included.

    Raises ``KeyError`` for an unknown class.
    """
    spec = plan["workload"]["classes"][name]
    if "follows" in spec:
        return sum(offered_units(plan, driver) for driver in spec["follows"])
    return _offered_units(plan, name)


def parse_plan(document: Any, *, path: str = "<plan>", base: Path | None = None) -> dict[str, Any]:
    """Check a plan already parsed from JSON; return it with defaults filled in.

    Args:
        document: the parsed JSON value.
        path: how messages name the file.
        base: the directory ``service`` is relative to (the repository root).

    Raises:
        PlanError: the document breaks :data:`PLAN_SCHEMA` or a rule of :func:`load_plan`; every problem is listed.
    """
    problems = _schema_problems(document)
    if problems:
        raise PlanError(path, problems)
    plan = json.loads(json.dumps(document))
    plan["workload"].setdefault("drain_timeout_seconds", 120.0)
    plan["workload"].setdefault("gate_lock_sample_ms", 150.0)
    plan["workload"].setdefault("gate_probe_per_second", 10.0)
    plan["workload"]["classes"]["credential_revocation"].setdefault("hold_seconds", 1.0)
    plan["workload"]["classes"]["halt"].setdefault("after_drain", 0)
    problems = _rule_problems(plan, base or Path.cwd())
    if problems:
        raise PlanError(path, problems)
    return plan


def load_plan(path: str | Path, *, base: Path | None = None) -> dict[str, Any]:
    """Read and check the capacity plan at ``path``; return it (defaults filled in).

    Beyond :data:`PLAN_SCHEMA`: each driven class gives exactly one of ``rate_per_second``/``count``; a
    derived class follows only the drivers that cause it (:data:`FOLLOWABLE`); each class budget gives exactly
    one throughput bound and p95 <= p99; the offered rate of each forecast class covers its peak x headroom;
    the warm contacts cover the outbound units; ``service`` exists under ``base``.

    Raises:
        PlanError: the file is missing, not UTF-8 JSON, or breaks the schema or a rule (all problems listed).

    Seed 003, "State machines" (the hot-account capacity test's frozen plan).
    """
    shown = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PlanError(shown, [f"cannot read it: {exc}"]) from exc
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PlanError(shown, [f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"]) from exc
    return parse_plan(document, path=shown, base=base)


def _judge(value: float | None, direction: str, bound: float, reason: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {direction: bound, "value": value}
    if value is None:
        return {**out, "verdict": "not measured", "met": None, "gap": None,
                "reason": reason or "not measured in this run"}
    gap = max(0.0, bound - value) if direction == "at_least" else max(0.0, value - bound)
    met = gap == 0.0 and not math.isnan(value)
    return {**out, "verdict": "met" if met else "missed", "met": met, "gap": gap}


def budget_verdicts(plan: dict[str, Any], figures: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Judge a run's ``figures`` against the plan's budgets; one verdict per budget.

    ``figures`` has ``classes`` (class -> ``{"completed", "per_second", "p95_ms", "p99_ms",
    "starvation_ms"}``, any value ``None`` when not measured), ``gate_lock_wait`` (``{"p95_ms", "p99_ms"}``),
    ``deadlocks`` and ``retries`` (``{"total": n, ...}``). Returns ``"<class>.<budget>"``,
    ``"gate_lock_wait.<budget>"``, ``"deadlocks_at_most"`` and ``"retries_at_most"`` -> ``{"at_least" or
    "at_most": bound, "value", "verdict": "met" | "missed" | "not measured", "met", "gap"}``; the gap is how
    far the value is on the wrong side (0.0 when met). A missing figure is ``not measured``, never met.
    Raises nothing.
    """
    figure_of = {"throughput_per_second_at_least": "per_second", "completed_at_least": "completed",
                 "p95_ms_at_most": "p95_ms", "p99_ms_at_most": "p99_ms", "starvation_ms_at_most": "starvation_ms"}
    out: dict[str, dict[str, Any]] = {}
    measured = figures.get("classes") or {}
    for name in OPERATION_CLASSES:
        have = measured.get(name) or {}
        for budget, bound in plan["budgets"]["classes"][name].items():
            out[f"{name}.{budget}"] = _judge(have.get(figure_of[budget]), CLASS_BUDGETS[budget], bound,
                                             have.get("reason"))
    gate = figures.get("gate_lock_wait") or {}
    for budget, bound in plan["budgets"]["gate_lock_wait"].items():
        out[f"gate_lock_wait.{budget}"] = _judge(gate.get(budget.replace("_at_most", "")), "at_most", bound)
    out["deadlocks_at_most"] = _judge(figures.get("deadlocks"), "at_most", plan["budgets"]["deadlocks_at_most"])
    retries = figures.get("retries") or {}
    out["retries_at_most"] = _judge(retries.get("total"), "at_most", plan["budgets"]["retries_at_most"])
    return out


__all__ = ["CLASS_BUDGETS", "DERIVED_CLASSES", "DRIVEN_CLASSES", "FOLLOWABLE", "OPERATION_CLASSES", "PLAN_FORMAT",
           "PLAN_SCHEMA", "PlanError", "budget_verdicts", "load_plan", "offered_per_second", "offered_units",
           "parse_plan", "window_units"]
