"""The compiler pipeline: :func:`analyze_flow` and :func:`compile_flow` (seed 004 sections 7.2 and 20.4).

Runs the passes in the section 7.2 order over one
:class:`~.context.CompileContext`; a pass that leaves an error stops the
pipeline at the next checkpoint. The compile contract: findings, never a crash.
"""
from __future__ import annotations

from collections.abc import Mapping

from nexusflow.records.metadata import MetadataView

from ..catalog import CatalogSnapshot
from ..errors import CompileError, Diagnostic
from ..frontend import FrontEndError, parse_flow_document
from .constants import COHORT_METADATA_ONLY, DEFAULT_PLAN_BOUNDS, MAX_STEPS, NAME_RE, REJECTED_ELEMENTS, PlanBounds
from .context import Analysis, CompileContext, CompiledPlan, _Abort
from .document import check_packaging_tokens, check_process_type, collect_resources, read_start
from .elements import resolve_elements
from .graph import annotate_loops, build_graph
from .plan import build_plan, group_steps, validate_effect_pairs
from .profile import cohort_of, propagate_capabilities, select_profile
from .references import check_references


def _analyze(*, source: bytes | str, flow_api_name: str, catalog: CatalogSnapshot, view: MetadataView,
             subflows: Mapping[str, bytes] | None, requested_profile: str | None, schema: str,
             stack: tuple[str, ...], bounds: PlanBounds = DEFAULT_PLAN_BOUNDS) -> Analysis:
    """Run every pass over one Flow and return its :class:`Analysis`; never raises."""
    ctx = CompileContext(source=source, flow_api_name=flow_api_name, catalog=catalog, view=view,
                         subflows=subflows or {}, option_profile=requested_profile, schema=schema,
                         stack=stack, analyze=_analyze, bounds=bounds)
    try:
        _run_passes(ctx)
    except _Abort:
        pass
    except FrontEndError as exc:
        ctx.diag(exc.code, exc.element, exc.detail)
    except Exception as exc:  # the compile contract: findings, never a crash
        ctx.diag("compiler_internal_error", None, f"{type(exc).__name__}: {exc}")
    if ctx.failed():
        ctx.analysis.plan = None
        ctx.analysis.profile = None
        ctx.analysis.cohort = COHORT_METADATA_ONLY
        ctx.analysis.fan_out = "unproven"
        # Estimated step boundaries of a rejected flow: one per executable element,
        # two per external effect, plus the terminal step.
        executable = [n for n in ctx.nodes.values() if n.kind not in REJECTED_ELEMENTS]
        effects = sum(1 for n in executable if n.entry is not None and n.entry.kind == "effect")
        ctx.analysis.steps = len(executable) + effects + 1 if executable else 0
    return ctx.analysis


def _run_passes(ctx: CompileContext) -> None:
    """The section 7.2 passes in order; :class:`~.context._Abort` at the first checkpoint after an error."""
    if not isinstance(ctx.flow_api_name, str) or not NAME_RE.match(ctx.flow_api_name):
        ctx.diag("invalid_flow_api_name", None, "flow API name must start with a letter, use only letters, "
                 "digits and '_', and be at most 80 characters")
    if ctx.catalog.binding.metadata_view_digest != ctx.view.digest:
        ctx.diag("binding_mismatch", None, "catalog generation is bound to another metadata view")
    ctx.abort_if_failed()
    ctx.doc = parse_flow_document(ctx.source)
    for code, element, detail in ctx.doc.findings:
        ctx.diag(code, element, detail)
    data = ctx.doc.data
    check_packaging_tokens(ctx, data)
    check_process_type(ctx, data)
    collect_resources(ctx)
    read_start(ctx, data)
    resolve_elements(ctx)
    check_references(ctx)
    ctx.abort_if_failed()
    order = build_graph(ctx)
    ctx.abort_if_failed()
    annotate_loops(ctx, order)
    propagate_capabilities(ctx)
    ctx.abort_if_failed()
    profile = select_profile(ctx)
    ctx.abort_if_failed()
    steps, edges = group_steps(ctx, order, profile)
    for finding in validate_effect_pairs(steps, edges):
        ctx.diag(finding.code, finding.element, finding.message)
    if len(steps) > MAX_STEPS:
        ctx.diag("too_many_steps", None, f"{len(steps)} steps exceed the bound of {MAX_STEPS}")
    ctx.abort_if_failed()
    ctx.analysis.plan = build_plan(ctx, profile, steps, edges)
    ctx.analysis.profile = profile
    ctx.analysis.steps = len(steps)
    ctx.analysis.cohort = cohort_of(ctx, profile)


def analyze_flow(*, source: bytes | str, flow_api_name: str, catalog: CatalogSnapshot, view: MetadataView,
                 subflows: Mapping[str, bytes] | None = None, requested_profile: str | None = None,
                 schema: str = "strict", bounds: PlanBounds = DEFAULT_PLAN_BOUNDS) -> Analysis:
    """Run the compiler and return its findings; never raises (seed 004 sections 7.2 and 20.4).

    Args:
        source: the ``.flow-meta.xml`` bytes.
        flow_api_name: the Flow's API name.
        catalog: the sealed capability-catalog snapshot of the plan's binding.
        view: the exact RuntimeMetadataView the binding names.
        subflows: API name -> source of every flow a subflow element may call.
        requested_profile: a profile requested by the caller (``bounded_atomic``
            = RunAtomically); the document's own request applies otherwise.
        schema: ``"strict"`` checks objects and trigger fields against ``view``;
            ``"open"`` (compile-only inventory of foreign metadata) does not.
        bounds: the plan-eligibility bounds of the runtime policy in force (default: those of
            ``POLICY_VERSION``); a subflow compiles under the same bounds.

    Returns:
        The :class:`Analysis`; ``plan`` is set only when nothing blocks.
    """
    return _analyze(source=source, flow_api_name=flow_api_name, catalog=catalog, view=view, subflows=subflows,
                    requested_profile=requested_profile, schema=schema, stack=(), bounds=bounds)


def compile_flow(*, source: bytes | str, flow_api_name: str, catalog: CatalogSnapshot, view: MetadataView,
                 subflows: Mapping[str, bytes] | None = None, requested_profile: str | None = None,
                 schema: str = "strict", bounds: PlanBounds = DEFAULT_PLAN_BOUNDS) -> CompiledPlan:
    """Compile one Flow metadata document against a sealed catalog and metadata view (seed 004 section 7).

    Same arguments as :func:`analyze_flow`.

    Returns:
        The immutable compiled plan; identical inputs give an identical plan
        digest (section 7.3), whatever the XML formatting.

    Raises:
        CompileError: with every blocking diagnostic; no other exception escapes.
    """
    result = analyze_flow(source=source, flow_api_name=flow_api_name, catalog=catalog, view=view,
                          subflows=subflows, requested_profile=requested_profile, schema=schema, bounds=bounds)
    if result.rejected:
        raise CompileError(result.errors or [Diagnostic("compiler_internal_error", None, "no plan")])
    return result.plan
