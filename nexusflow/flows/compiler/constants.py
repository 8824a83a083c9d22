"""The compiler's vocabulary: versions, profiles, policy bounds, step kinds, diagnostic families, metadata tables.

Plain data of ``POLICY_VERSION`` / ``COMPILER_VERSION`` (seed 004 sections 7,
9.1, 9.2, 16.3 and 20.7); every pass reads it, none writes it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

COMPILER_VERSION = "flows.compiler.v2"
POLICY_VERSION = "flows.policy.v2"
PAYLOAD_SCHEMA = "flows.plan-payload.v2"

PROFILE_EMBEDDED = "embedded_before_save"
PROFILE_ATOMIC = "bounded_atomic"
PROFILE_DURABLE = "durable_orchestration"
PROFILES = (PROFILE_EMBEDDED, PROFILE_ATOMIC, PROFILE_DURABLE)

# Policy bounds of POLICY_VERSION (seed 004 sections 9.1, 9.2 and 16.3).
MAX_STEPS = 200
ATOMIC_MAX_READS = 10
ATOMIC_MAX_WRITES = 10
EMBEDDED_MAX_READS = 5
MAX_SUBFLOW_DEPTH = 8


@dataclass(frozen=True)
class PlanBounds:
    """The plan-eligibility bounds a compilation applies (seed 004 sections 9.2 and 16.3): the reads and
    writes a Bounded Atomic plan may declare, and ``version``, the policy version they come from (a plan
    records it as its ``policy_version``; a changed bound is a new plan)."""

    atomic_max_reads: int = ATOMIC_MAX_READS
    atomic_max_writes: int = ATOMIC_MAX_WRITES

    @property
    def version(self) -> str:
        """``POLICY_VERSION`` for its own bounds, else ``POLICY_VERSION+r<reads>w<writes>``: a function of the
        bounds alone, so equal bounds compile equal plans wherever they are set."""
        if (self.atomic_max_reads, self.atomic_max_writes) == (ATOMIC_MAX_READS, ATOMIC_MAX_WRITES):
            return POLICY_VERSION
        return f"{POLICY_VERSION}+r{self.atomic_max_reads}w{self.atomic_max_writes}"


#: The bounds of ``POLICY_VERSION`` itself.
DEFAULT_PLAN_BOUNDS = PlanBounds()

# Step kinds (seed 004 section 7.5).
KIND_EMBEDDED = "EmbeddedTransform"
KIND_PURE_COMPUTE = "PureCompute"
KIND_CURRENT_READ = "CurrentRead"
KIND_SNAPSHOT_READ = "VerifiedSnapshotRead"
KIND_MUTATION = "BoundedMutation"
#: Key prefix of the first step of a scheduled path's run (its wait for the path's time).
SCHEDULED_STEP_PREFIX = "scheduled:"
KIND_DEPENDENCY_WAIT = "DependencyWait"
KIND_EFFECT_SUBMIT = "EffectSubmit"
KIND_EFFECT_COMPLETION = "EffectCompletion"
KIND_EXPLICIT_FAULT = "ExplicitFault"
KIND_TERMINAL = "Terminal"
STEP_KINDS = frozenset({
    KIND_EMBEDDED, KIND_PURE_COMPUTE, KIND_CURRENT_READ, KIND_SNAPSHOT_READ, KIND_MUTATION, KIND_DEPENDENCY_WAIT,
    KIND_EFFECT_SUBMIT, KIND_EFFECT_COMPLETION, KIND_EXPLICIT_FAULT, KIND_TERMINAL,
})
TERMINAL_STEP_KEY = "end"

# Closed set of diagnostic families: every code is "<family>" or "<family>:<detail>".
DIAGNOSTIC_FAMILIES = frozenset({
    "xml_too_large", "xml_forbidden_declaration", "xml_malformed", "not_a_flow", "invalid_flow_api_name",
    "binding_mismatch", "unsupported_process_type", "missing_start", "unsupported_start",
    "unsupported_trigger_type", "unsupported_record_trigger_type", "unknown_object", "unknown_field",
    "unsupported_operator", "unsupported_value", "unsupported_filter_logic", "unsupported_condition_logic",
    "unsupported_element", "missing_element_name", "invalid_element_name", "duplicate_element",
    "unresolved_reference", "unreachable_element", "cycle_detected", "unknown_action", "unknown_capability",
    "capability_not_executable", "missing_action_input", "invalid_action_input", "unexpected_action_input",
    "unsupported_reference", "invalid_decision", "invalid_effect_pair", "too_many_steps", "compiler_internal_error",
    "formula_syntax", "formula_reference", "formula_arity", "unknown_function", "unresolved_packaging_token",
    "recursive_subflow", "unknown_subflow", "subflow_rejected", "subflow_too_deep", "before_save_unsafe",
    "unsafe_atomic_request", "unsafe_profile_request", "invalid_profile_request", "unsupported_wait_event",
    "invalid_loop", "engine_unsupported",
})

SUPPORTED_PROCESS_TYPES = {"AutoLaunchedFlow"}
PROCESS_TYPE_REASONS = {
    "Flow": "screen flow: runs interactively with a user, not on the durable executor",
    "Workflow": "legacy Process Builder process: migrate it to a record-triggered flow",
    "InvocableProcess": "legacy invocable process: migrate it to an autolaunched flow",
    "Orchestrator": "orchestration: interactive stages and steps are not compiled",
    "PromptFlow": "prompt template flow: invoked by a generative capability, not by records",
}
#: Interactive or foreign elements: parsed, never compiled.
REJECTED_ELEMENTS = {
    "screens": "interactive screen", "orchestratedStages": "orchestration stage", "stages": "interactive stage",
    "steps": "legacy step element", "apexPluginCalls": "legacy plugin call", "customErrors": "custom error",
    "recordRollbacks": "record rollback", "transforms": "transform element",
}
#: Resource kinds that are referenced, not executed.
RESOURCE_KINDS = ("variables", "constants", "formulas", "textTemplates", "choices", "dynamicChoiceSets")
#: Executable element kinds and the built-in catalog entry each resolves to.
ELEMENT_ENTRY = {
    "assignments": "element:assignments", "decisions": "element:decisions", "loops": "element:loops",
    "collectionProcessors": "element:collectionProcessors", "recordLookups": "element:recordLookups",
    "recordCreates": "element:recordCreates", "recordUpdates": "element:recordUpdates",
    "recordDeletes": "element:recordDeletes", "waits": "element:waits",
}
STEP_PREFIX = {
    "assignments": "assign", "decisions": "decide", "loops": "loop", "collectionProcessors": "collect",
    "recordLookups": "read", "recordCreates": "write", "recordUpdates": "write", "recordDeletes": "write",
    "waits": "wait", "subflows": "subflow", "actionCalls": "call",
}
GLOBAL_ROOTS = frozenset({
    "$Record", "$Record__Prior", "$Flow", "$User", "$Setup", "$Label", "$Api", "$Organization", "$Profile",
    "$Permission", "$System", "$GlobalConstant", "$UserRole", "$CustomMetadata",
})
RECORD_TRIGGER_TYPES = {"Create", "Update", "CreateAndUpdate", "Delete"}
TRIGGER_TYPES = {"RecordBeforeSave", "RecordAfterSave", "RecordBeforeDelete", "Scheduled", "PlatformEvent"}
OPERATORS = frozenset({
    "EqualTo", "NotEqualTo", "IsNull", "GreaterThan", "GreaterThanOrEqualTo", "LessThan", "LessThanOrEqualTo",
    "Contains", "StartsWith", "EndsWith", "IsChanged", "In", "NotIn", "IsBlank", "IsEmpty", "WasSet",
})
ASSIGNMENT_OPERATORS = frozenset({
    "Assign", "Add", "Subtract", "AddItem", "AddAtStart", "RemoveAll", "RemoveFirst", "RemoveAfterFirst",
    "RemoveBeforeFirst", "RemoveUncommon", "RemovePosition", "AssignCount", "Multiply", "Divide",
})
VALUE_KINDS = frozenset({"stringValue", "booleanValue", "numberValue", "dateValue", "dateTimeValue",
                         "elementReference", "formulaExpression", "apexValue", "sobjectValue"})
NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,79}$")
REF_RE = re.compile(r"^\$?[A-Za-z_][A-Za-z0-9_]*(?:\.\$?[A-Za-z_][A-Za-z0-9_]*)*$")
PACKAGING_TOKEN = "%%%"
RECORD_ID_REF = "$Record.Id"
STRUCTURAL_ELEMENT_KEYS = frozenset({"name", "label", "description", "__duplicated__"})

# 20.7 cohorts
COHORT_METADATA_ONLY = 1
COHORT_PURE_AUTOLAUNCHED = 2
COHORT_EMBEDDED = 3
COHORT_SMALL_ATOMIC = 4
COHORT_TIME_WAITS = 5
COHORT_PRODUCER_WAITS = 6
COHORT_EXTERNAL_EFFECTS = 7
COHORT_LARGE_COMPLEX = 8
