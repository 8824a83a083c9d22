"""What one compilation produces and works on: :class:`CompiledPlan`, :class:`Analysis`, :class:`CompileContext`.

The passes (:mod:`.document`, :mod:`.elements`, :mod:`.references`,
:mod:`.graph`, :mod:`.profile`, :mod:`.plan`) are functions over one
:class:`CompileContext`; :mod:`.pipeline` runs them in the section 7.2 order.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nexusflow.kernel.digests import PROFILE_V2
from nexusflow.records.metadata import MetadataView

from ..binding import RuntimeWorkBinding
from ..catalog import CatalogEntry, CatalogSnapshot
from ..errors import Diagnostic
from ..frontend import FlowDocument
from .constants import COHORT_METADATA_ONLY, DEFAULT_PLAN_BOUNDS, PlanBounds


@dataclass(frozen=True)
class CompiledPlan:
    """Everything a ``FlowExecutionPlan`` row holds, computed without the database."""

    binding: RuntimeWorkBinding
    flow_api_name: str
    metadata_digest: str
    compiler_version: str
    catalog_generation_id: str
    catalog_digest: str
    trigger_binding_digest: str
    metadata_view_digest: str
    policy_version: str
    execution_profile: str
    payload: dict[str, Any]
    payload_digest: str
    plan_digest: str
    bound_summary: dict[str, Any]
    diagnostic_summary: str
    subflow_plan_digests: dict[str, str] = field(default_factory=dict)
    #: The compiled plans of the subflows it calls, by plan digest (not part of any digest: each child's own
    #: plan digest is, through ``subflow_plan_digests``).
    subflow_plans: dict[str, CompiledPlan] = field(default_factory=dict, compare=False, repr=False)
    digest_profile: str = PROFILE_V2

    @property
    def plan_id(self) -> str:
        return f"plan_{self.plan_digest[:32]}"

    @property
    def trigger(self) -> dict[str, Any]:
        return self.payload["trigger"]

    @property
    def steps(self) -> list[dict[str, Any]]:
        return self.payload["steps"]


@dataclass
class Analysis:
    """The compile-only result of one Flow (seed 004 section 20.4)."""

    flow_api_name: str
    diagnostics: list[Diagnostic]
    plan: CompiledPlan | None = None
    profile: str | None = None
    unknown_capabilities: list[str] = field(default_factory=list)
    loops: list[dict[str, Any]] = field(default_factory=list)
    fan_out: str = "static:1"
    steps: int = 0
    cohort: int = COHORT_METADATA_ONLY
    # transitive facts a calling flow inherits (section 7.2 step 6)
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity == "error"]

    @property
    def rejected(self) -> bool:
        return bool(self.errors) or self.plan is None


class _Abort(Exception):
    """Stop compiling: the collected diagnostics are final."""


@dataclass
class _Node:
    name: str
    kind: str  # element kind ("decisions", "actionCalls", ...)
    body: dict[str, Any]
    edges: list[tuple[str, str | None]] = field(default_factory=list)  # (edge kind, target element)
    entry: CatalogEntry | None = None
    unknown: str | None = None  # unknown capability key
    data: dict[str, Any] = field(default_factory=dict)
    in_loops: list[str] = field(default_factory=list)
    child: Analysis | None = None


@dataclass(eq=False)
class CompileContext:
    """One compilation of one Flow: its inputs, the facts the passes build and the findings so far.

    ``diags`` is the list the :class:`Analysis` returns; ``analyze`` is the
    pipeline itself, which a subflow element calls to compile the flow it names.
    """

    source: bytes | str
    flow_api_name: str
    catalog: CatalogSnapshot
    view: MetadataView
    subflows: Mapping[str, bytes]
    option_profile: str | None
    schema: str
    stack: tuple[str, ...]
    analyze: Callable[..., Analysis]
    #: The plan-eligibility bounds of the runtime policy in force (``DEFAULT_PLAN_BOUNDS`` when none is set).
    bounds: PlanBounds = DEFAULT_PLAN_BOUNDS
    diags: list[Diagnostic] = field(default_factory=list)
    doc: FlowDocument | None = None
    nodes: dict[str, _Node] = field(default_factory=dict)
    resources: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    trigger: dict[str, Any] = field(default_factory=lambda: {"trigger_type": "none"})
    entry_edges: list[tuple[str, str | None]] = field(default_factory=list)
    object_fields: set[str] | None = None
    #: Elements reachable from the start (set by :func:`.graph.annotate_loops`).
    reachable: set[str] = field(default_factory=set)
    analysis: Analysis = field(init=False)

    def __post_init__(self) -> None:
        self.analysis = Analysis(flow_api_name=self.flow_api_name, diagnostics=self.diags)

    def diag(self, code: str, element: str | None = None, message: str = "", severity: str = "error") -> None:
        d = Diagnostic(code, element, message, severity)
        if d not in self.diags:
            self.diags.append(d)

    def failed(self) -> bool:
        return any(d.severity == "error" for d in self.diags)

    def abort_if_failed(self) -> None:
        if self.failed():
            raise _Abort()
