"""Handler bindings this runtime binary can execute, and what its engine generation runs (seed 004 section 8.4).

Handler functions are never serialized. This module publishes, per handler
reference, the implementation version compiled into this binary
(:data:`IN_BINARY_HANDLERS`). At claim the runtime rebuilds the sealed read
view from the persisted ``FlowActionCatalogGeneration`` and accepts a step
only when the plan's pinned entry digest and binding fingerprint equal the
persisted entry *and* the fingerprint recomputed from this binary's own
handler version (:func:`binary_supports`). A mismatch never falls back to a
current registry.

:func:`engine_support_diagnostics` is the activation gate of the current
engine generation: a plan compiles for any profile, but only the shapes the
executor implements today may be activated.
"""
from __future__ import annotations

from typing import Any

from .catalog import CatalogEntry, CatalogSnapshot, binding_fingerprint_of
from .compiler import (
    KIND_EFFECT_COMPLETION,
    KIND_EFFECT_SUBMIT,
    KIND_PURE_COMPUTE,
    KIND_TERMINAL,
    PROFILE_DURABLE,
    Diagnostic,
)

#: handler_ref -> implementation version compiled into this binary.
IN_BINARY_HANDLERS: dict[str, str] = {
    "nexusflow.flows.handlers.decisions": "1",
    "runtime_outbox.services.outbound_command_author": "1",
}
#: Condition operators the executor evaluates on the trigger record alone.
ENGINE_OPERATORS = frozenset({
    "EqualTo", "NotEqualTo", "IsNull", "IsBlank", "GreaterThan", "GreaterThanOrEqualTo", "LessThan",
    "LessThanOrEqualTo", "Contains", "StartsWith", "EndsWith",
})
LITERAL_KINDS = frozenset({"stringValue", "booleanValue", "numberValue"})


def binary_supports(entry: CatalogEntry, handlers: dict[str, str] | None = None) -> bool:
    """True when this binary executes ``entry`` with exactly the pinned binding fingerprint."""
    table = IN_BINARY_HANDLERS if handlers is None else handlers
    version = table.get(entry.handler_ref or "")
    if version is None or version != entry.handler_version:
        return False
    return binding_fingerprint_of(owner_registration_id=entry.owner_registration_id, handler_ref=entry.handler_ref,
                                  handler_version=version,
                                  descriptor_digest=entry.descriptor_digest) == entry.binding_fingerprint


def published_bindings(snapshot: CatalogSnapshot) -> list[tuple[str, str, str, str, str, str]]:
    """The ``(binding digest, generation, action type, handler ref, entry digest, fingerprint)`` tuples
    this binary can execute for one sealed generation (section 8.4)."""
    return sorted(
        (snapshot.binding.digest, snapshot.generation_id, e.action_type, e.handler_ref or "", e.entry_digest,
         e.binding_fingerprint)
        for e in snapshot.entries.values() if binary_supports(e)
    )


def _condition_ok(c: dict[str, Any]) -> bool:
    right = c.get("right", c.get("value"))
    left = c.get("left", "$Record." + str(c.get("field")))
    return (c.get("operator") in ENGINE_OPERATORS and isinstance(left, str) and left.startswith("$Record.")
            and left.count(".") == 1 and (right is None or right.get("kind") in LITERAL_KINDS))


def engine_support_diagnostics(payload: dict[str, Any], snapshot: CatalogSnapshot) -> list[Diagnostic]:
    """What in a compiled plan this engine generation cannot run (empty list: activatable).

    Codes: ``engine_unsupported:<feature>``; ``element`` names the step element.
    """
    out: list[Diagnostic] = []

    def bad(feature: str, element: str | None, detail: str) -> None:
        out.append(Diagnostic(f"engine_unsupported:{feature}", element, detail))

    if payload.get("profile") != PROFILE_DURABLE:
        bad("profile", None, f"the executor runs durable_orchestration plans; this plan is {payload.get('profile')}")
    trigger = payload.get("trigger", {})
    if trigger.get("trigger_type") != "RecordAfterSave":
        bad("trigger", "start", f"admission starts runs on after-save record triggers, not {trigger.get('trigger_type')}")
    if trigger.get("scheduled_paths") or trigger.get("filter_formula") or trigger.get("requires_change"):
        bad("trigger", "start", "scheduled paths, filter formulas and changed-record criteria are not admitted yet")
    for f in trigger.get("filters", []):
        if not _condition_ok(f):
            bad("trigger", "start", f"filter {f.get('field')} {f.get('operator')} is not evaluated at admission")
    for step in payload.get("steps", []):
        kind, element = step.get("kind"), step.get("element")
        if kind == KIND_TERMINAL or kind == KIND_EFFECT_COMPLETION:
            continue
        if kind == KIND_PURE_COMPUTE and step.get("type") == "decisions":
            for rule in step.get("rules", []):
                if rule.get("requires_change") or not all(_condition_ok(c) for c in rule.get("conditions", [])):
                    bad("decision", element, f"rule {rule.get('name')} reads more than trigger-record literals")
            continue
        if kind == KIND_EFFECT_SUBMIT:
            entry = snapshot.entries.get(step.get("action_key"))
            if entry is None or not binary_supports(entry):
                bad("handler", element, f"{step.get('action_key')} has no handler binding in this binary")
            continue
        bad(f"step:{kind}", element, f"the executor has no {kind} handler for {step.get('type', kind)} yet")
    return out
