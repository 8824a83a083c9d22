"""Flow compiler: normalized Flow metadata -> immutable, profile-aware plan (seed 004 sections 7 and 9).

:func:`analyze_flow` runs the section 7.2 algorithm and never raises: it
returns an :class:`Analysis` with the selected profile or the rejection
reasons, the unknown capabilities, the loop and fan-out proof, the step count
and the migration cohort (section 20.7). :func:`compile_flow` is the same
analysis for activation: it returns the :class:`CompiledPlan` or raises
:class:`CompileError` with every blocking diagnostic.

Pipeline (:mod:`.pipeline`, passes over one :class:`~.context.CompileContext`):
front end (:mod:`nexusflow.flows.frontend`) -> the document, its resources
and its start (:mod:`.document`) -> resolve elements, actions and subflows
through the sealed catalog (:mod:`.elements`) -> references
(:mod:`.references`) -> control-flow graph with success, fault, wait and
terminal edges, cycle detection, loop and fan-out bounds (:mod:`.graph`) ->
capability annotation from catalog entries, propagated through subflows and
loops, and profile selection (Embedded Before-Save, Bounded Atomic, Durable
Orchestration; a requested profile that cannot be proven is a rejection)
(:mod:`.profile`) -> step grouping with each external effect expanded to one
``EffectSubmit`` -> ``EffectCompletion`` pair (section 7.5) and plan identity
over every section 7.3 input (:mod:`.plan`). The vocabulary (versions,
profiles, bounds, step kinds, diagnostic families) is :mod:`.constants`.

Diagnostic codes are ``<family>`` or ``<family>:<detail>`` with the family in
:data:`DIAGNOSTIC_FAMILIES`; ``element`` names the element (for a transitive
blocker, the path ``Flow > element > Subflow > element``). The compiler reads
no tenant record and no runtime traffic. Evaluating normalized conditions at
run time is :mod:`nexusflow.flows.conditions`.
"""
from ..errors import CompileError, Diagnostic
from .constants import (
    ATOMIC_MAX_READS,
    ATOMIC_MAX_WRITES,
    COMPILER_VERSION,
    DEFAULT_PLAN_BOUNDS,
    DIAGNOSTIC_FAMILIES,
    EMBEDDED_MAX_READS,
    KIND_CURRENT_READ,
    KIND_DEPENDENCY_WAIT,
    KIND_EFFECT_COMPLETION,
    KIND_EFFECT_SUBMIT,
    KIND_EMBEDDED,
    KIND_EXPLICIT_FAULT,
    KIND_MUTATION,
    KIND_PURE_COMPUTE,
    KIND_SNAPSHOT_READ,
    KIND_TERMINAL,
    MAX_STEPS,
    MAX_SUBFLOW_DEPTH,
    PAYLOAD_SCHEMA,
    POLICY_VERSION,
    PROFILE_ATOMIC,
    PROFILE_DURABLE,
    PROFILE_EMBEDDED,
    PROFILES,
    SCHEDULED_STEP_PREFIX,
    STEP_KINDS,
    TERMINAL_STEP_KEY,
    PlanBounds,
)
from .context import Analysis, CompiledPlan
from .pipeline import analyze_flow, compile_flow
from .plan import trigger_binding_digest_of, validate_effect_pairs
from .values import normalize_value, parse_logic

__all__ = [
    "ATOMIC_MAX_READS", "ATOMIC_MAX_WRITES", "COMPILER_VERSION", "DEFAULT_PLAN_BOUNDS",
    "DIAGNOSTIC_FAMILIES", "PlanBounds",
    "EMBEDDED_MAX_READS", "KIND_CURRENT_READ", "KIND_DEPENDENCY_WAIT", "KIND_EFFECT_COMPLETION",
    "KIND_EFFECT_SUBMIT", "KIND_EMBEDDED", "KIND_EXPLICIT_FAULT", "KIND_MUTATION", "KIND_PURE_COMPUTE",
    "KIND_SNAPSHOT_READ", "KIND_TERMINAL", "MAX_STEPS", "MAX_SUBFLOW_DEPTH", "PAYLOAD_SCHEMA", "POLICY_VERSION",
    "PROFILE_ATOMIC", "PROFILE_DURABLE", "PROFILE_EMBEDDED", "PROFILES", "SCHEDULED_STEP_PREFIX", "STEP_KINDS", "TERMINAL_STEP_KEY",
    "Analysis", "CompileError", "CompiledPlan", "Diagnostic", "analyze_flow", "compile_flow", "normalize_value",
    "parse_logic", "trigger_binding_digest_of", "validate_effect_pairs",
]
