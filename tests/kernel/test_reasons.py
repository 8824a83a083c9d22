"""Closed reason codes (seed 003 "Operational liveness and maintenance admission"; ARCHITECTURE.md section 6).

- every code the code base stores is registered, and every registered code is
  stored somewhere (an AST scan over the project's Python files);
- every evidence path imports to an org-scoped selector that runs against the
  database; every remediation is in the closed kernel registry;
- every code has a severity class (``benign`` / ``attention``) consistent with
  its alert deadline and remediations;
- the CHECK constraints refuse an empty reason in every reason-required state
  and the CAS store refuses such a transition before any SQL.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
from django.apps import apps
from django.db import IntegrityError, connection, transaction
from django.db.models import QuerySet
from django.test.utils import CaptureQueriesContext

from nexusflow.kernel import reasons as kernel_reasons
from nexusflow.kernel.errors import ReasonRequired
from nexusflow.kernel.reasons import (
    ATTENTION,
    BENIGN,
    REMEDIATIONS,
    SEVERITY_CLASSES,
    UnknownReasonCode,
    codes_of_class,
    load_all_reasons,
    register,
    severity_class_of,
)
from nexusflow.kernel.store import CasStore
from nexusflow.kernel.transitions import REGISTRY
from tests.kernel import rows

ROOT = Path(__file__).resolve().parents[2]
SKIP_DIRS = {"tests", "migrations", ".venv", "node_modules", "__pycache__", ".git"}


# --- the scan ------------------------------------------------------------------
def _reason_constants() -> dict[str, dict[str, str]]:
    """``{reasons module: {CONSTANT: code}}`` for every app's ``reasons`` module."""
    import importlib

    registered = set(load_all_reasons())
    out = {}
    for config in apps.get_app_configs():
        try:
            module = importlib.import_module(f"{config.name}.reasons")
        except ModuleNotFoundError:
            continue
        out[module.__name__] = {name: value for name, value in vars(module).items()
                                if name.isupper() and isinstance(value, str) and value in registered}
    return out


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def _resolve(module: str, level: int, current: str) -> str:
    if not level:
        return module
    base = current.split(".")[: -level]
    return ".".join(base + ([module] if module else []))


def _strings(node: ast.AST) -> list[str]:
    """String constants a value expression can evaluate to (literal or either branch of ``a if c else b``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.IfExp):
        return _strings(node.body) + _strings(node.orelse)
    return []


def scan_source(source: str, module: str, constants: dict[str, dict[str, str]]) -> tuple[set[str], set[str]]:
    """Return ``(literal codes, codes referenced through constants)`` used in ``source``.

    Literal uses: ``reason_code="..."`` keyword arguments and ``{"reason_code": "..."}``
    dict entries. Constant uses: ``<reasons module>.NAME`` and names imported
    with ``from <...>.reasons import NAME``.
    """
    tree = ast.parse(source)
    module_aliases: dict[str, str] = {}
    name_imports: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = _resolve(node.module or "", node.level, module)
            for alias in node.names:
                full = f"{base}.{alias.name}" if base else alias.name
                if full in constants:
                    module_aliases[alias.asname or alias.name] = full
                elif base in constants and alias.name in constants[base]:
                    name_imports[alias.asname or alias.name] = constants[base][alias.name]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in constants and alias.asname:
                    module_aliases[alias.asname] = alias.name
    literals: set[str] = set()
    referenced: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "reason_code":
            literals.update(_strings(node.value))
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "reason_code":
                    literals.update(_strings(value))
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            target = module_aliases.get(node.value.id)
            if target is not None:
                if not hasattr(sys.modules[target], node.attr):
                    referenced.add(f"<missing {target}.{node.attr}>")
                elif node.attr in constants[target]:
                    referenced.add(constants[target][node.attr])
        elif isinstance(node, ast.Name) and node.id in name_imports:
            referenced.add(name_imports[node.id])
    literals.discard("")
    return literals, referenced


def scan_project() -> tuple[set[str], set[str]]:
    """Scan every project Python file except tests, migrations and the ``reasons`` modules themselves."""
    constants = _reason_constants()
    literals: set[str] = set()
    referenced: set[str] = set()
    for path in sorted(ROOT.rglob("*.py")):
        if SKIP_DIRS & set(path.relative_to(ROOT).parts) or path.name == "reasons.py":
            continue
        lit, ref = scan_source(path.read_text(), _module_name(path), constants)
        literals |= lit
        referenced |= ref
    return literals, referenced


def test_every_used_code_is_registered_and_every_registered_code_is_used():
    registered = set(load_all_reasons())
    literals, referenced = scan_project()
    used = literals | referenced
    assert used - registered == set(), "reason codes used but not registered"
    assert registered - used == set(), "reason codes registered but never stored"


def test_scan_catches_an_unregistered_code_and_follows_constants():
    constants = _reason_constants()
    snippet = (
        "from connectors import reasons\n"
        "from nexusflow.flows.reasons import EFFECT_NO_EFFECT as NO_EFFECT\n"
        "Store.transition(org_id=o, pk=1, src='a', dst='b', version=1, set_fields={'reason_code': 'made_up_code'})\n"
        "Store.create(state='x', reason_code='unknown' if flag else reasons.RETRY_EXHAUSTED)\n"
        "Store.transition(set_fields={'reason_code': NO_EFFECT})\n"
        "reasons.NOT_A_CODE\n"
    )
    literals, referenced = scan_source(snippet, "connectors.example", constants)
    assert literals == {"made_up_code", "unknown"}
    assert referenced == {"retry_exhausted", "flow_effect_no_effect", "<missing connectors.reasons.NOT_A_CODE>"}
    assert (literals | referenced) - set(load_all_reasons()) == {
        "made_up_code", "unknown", "<missing connectors.reasons.NOT_A_CODE>"}


# --- the registry ----------------------------------------------------------------
def test_every_reason_names_its_owner_remediations_and_alert_deadline():
    reasons = load_all_reasons()
    assert reasons
    for reason in reasons.values():
        config = apps.get_app_config(reason.owner)
        assert reason.evidence.startswith(f"{config.name}.selectors."), reason
        assert isinstance(reason.alert_after_seconds, int) and reason.alert_after_seconds >= 0, reason
        assert reason.remediations and set(reason.remediations) <= set(REMEDIATIONS), reason
    for remediation in REMEDIATIONS.values():
        assert remediation.description.strip(), remediation.id


@pytest.mark.django_db(databases=["default", "control"])
def test_every_evidence_selector_runs_org_scoped_against_the_database():
    for reason in load_all_reasons().values():
        selector = reason.evidence_selector()
        assert callable(selector), reason.evidence
        rows = selector(org_id="org-evidence", reason_code=reason.code)
        assert isinstance(rows, (QuerySet, list)), reason.evidence
        if isinstance(rows, QuerySet):
            assert "org_id" in str(rows.query), f"{reason.evidence} is not org-scoped"
        assert list(rows) == [], reason.evidence


def test_every_reason_has_a_severity_class_consistent_with_its_deadline_and_remediations():
    reasons = load_all_reasons()
    assert SEVERITY_CLASSES == ("benign", "attention")
    for reason in reasons.values():
        assert reason.severity_class in SEVERITY_CLASSES, reason
        if reason.severity_class == BENIGN:
            assert reason.alert_after_seconds == 0, f"benign {reason.code} raises an alert"
        else:
            assert reason.alert_after_seconds > 0, f"attention {reason.code} never alerts"
            assert "none" not in reason.remediations, f"attention {reason.code} offers no remediation"
        if reason.remediations == ("none",):
            assert reason.severity_class == BENIGN, reason.code
    assert codes_of_class(BENIGN) | codes_of_class(ATTENTION) == set(reasons)
    assert not codes_of_class(BENIGN) & codes_of_class(ATTENTION)
    # Classified by meaning: expected, recorded outcomes are benign; what an operator must look at is attention.
    assert codes_of_class(BENIGN) == {"superseded_by_newer_version", "superseded_by_newer_position",
                                      "flow_step_expected_refusal", "flow_trigger_record_deleted"}
    for code in ("retry_exhausted", "response_ambiguous", "mapping_drift", "link_drift", "authority_denied",
                 "operator_quarantine", "create_conflict_identity_mismatch", "source_sequence_gap",
                 "credential_revoked", "flow_effect_quarantined", "cutover_in_progress"):
        assert severity_class_of(code) == ATTENTION, code
    assert severity_class_of("") is None
    with pytest.raises(UnknownReasonCode):
        severity_class_of("not_a_registered_code")
    with pytest.raises(ValueError, match="severity class"):
        codes_of_class("warning")


def test_register_refuses_duplicates_and_malformed_entries(monkeypatch):
    monkeypatch.setattr(kernel_reasons, "REASONS", dict(kernel_reasons.REASONS))
    good = dict(owner="connectors", evidence="connectors.selectors.remote_links_with_reason",
                severity_class=ATTENTION, alert_after_seconds=60, remediations=("operator_reconcile",))
    assert register("test_only_code", **good) == "test_only_code"
    with pytest.raises(ValueError, match="already registered"):
        register("test_only_code", **good)
    with pytest.raises(ValueError, match="already registered"):
        register("retry_exhausted", **{**good, "owner": "flows"})
    for bad in ({"remediations": ()}, {"remediations": ("call_the_vendor",)}, {"remediations": ["none"]},
                {"alert_after_seconds": -1}, {"alert_after_seconds": True}, {"evidence": "RemoteLink.state"},
                {"owner": "not an app"}):
        with pytest.raises(ValueError):
            register("test_other_code", **{**good, **bad})
    without_class = {k: v for k, v in good.items() if k != "severity_class"}
    with pytest.raises(TypeError, match="severity_class"):
        register("test_other_code", **without_class)
    for bad in ({"severity_class": "warning"}, {"severity_class": ""}, {"severity_class": None},
                {"severity_class": BENIGN},  # a benign code raises no alert
                {"severity_class": ATTENTION, "alert_after_seconds": 0},
                {"severity_class": ATTENTION, "remediations": ("none",)}):
        with pytest.raises(ValueError, match="test_other_code"):
            register("test_other_code", **{**good, **bad})
    assert register("test_benign_code", **{**good, "severity_class": BENIGN, "alert_after_seconds": 0,
                                           "remediations": ("none",)}) == "test_benign_code"
    assert kernel_reasons.REASONS["test_benign_code"].severity_class == BENIGN
    with pytest.raises(ValueError):
        register("Bad Code", **good)
    with pytest.raises(UnknownReasonCode):
        kernel_reasons.require("test_other_code")


# --- reason-required states: the store and the CHECK constraints -------------------
def _stores() -> dict[str, type[CasStore]]:
    import importlib

    for config in apps.get_app_configs():
        try:
            importlib.import_module(f"{config.name}.store")
        except ModuleNotFoundError:
            pass
    found: dict[str, type[CasStore]] = {}
    pending = list(CasStore.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if "machine" in vars(cls) and "model" in vars(cls):
            found[cls.machine.name] = cls
    return found


def test_every_reason_required_model_has_the_column_and_its_check():
    stores = _stores()
    required = [m for m in REGISTRY.values() if m.reason_required]
    assert {m.name for m in required} >= {"connectors.RemoteEffect", "flows.FlowRun", "connectors.AccountServingGate"}
    for machine in required:
        if machine.name not in stores:
            continue  # a table-only machine: its model does not exist yet
        model = stores[machine.name].model
        model._meta.get_field("reason_code")
        names = {c.name for c in model._meta.constraints}
        checks = [c for c in model._meta.constraints if c.name.endswith("_reason_chk")]
        assert len(checks) == 1, (machine.name, names)
        assert str(sorted(machine.reason_required)) in str(checks[0].condition), machine.name


@pytest.mark.django_db
def test_the_store_refuses_a_reason_required_transition_before_sql():
    stores = _stores()
    cases = [(name, src, dst) for name, store in sorted(stores.items())
             for src, dst in store.machine.pairs() if dst in store.machine.reason_required]
    assert len(cases) >= 20
    for name, src, dst in cases:
        store = stores[name]
        for set_fields in (None, {}, {"reason_code": ""}, {"reason_code": None}):
            with CaptureQueriesContext(connection) as queries:
                with pytest.raises(ReasonRequired):
                    store.transition(org_id="org-x", pk=1, src=src, dst=dst, version=1, set_fields=set_fields)
            assert len(queries) == 0, (name, src, dst)
        with CaptureQueriesContext(connection) as queries:
            with pytest.raises(UnknownReasonCode):
                store.transition(org_id="org-x", pk=1, src=src, dst=dst, version=1,
                                 set_fields={"reason_code": "not_a_registered_code"})
        assert len(queries) == 0, (name, src, dst)


#: Stateful rows the demo webhook pipeline does not write (its route has no window).
NOT_IN_DEMO_PIPELINE = {"connectors.ProjectionWindow",
                        # The V1 runtime being retired: the V2 demo pipeline writes no V1 row.
                        "connectors.V1Event", "connectors.V1ProviderCall"}


class _Rollback(Exception):
    pass


@pytest.mark.django_db(transaction=True, databases=["default", "control"])
def test_check_constraints_refuse_an_empty_reason_in_every_reason_required_state(client, serving_org):
    from connectors.models import CredentialGenerationDispatchGate, ReceiptComponent
    from packs.hubspot.fixtures.make_demo_webhooks import OUTPUT_PATH
    from packs.hubspot.sender import load_deliveries
    from tests.conftest import drain, hubspot_event, post_signed

    # The demo file's first twelve deliveries write a row of every stateful model the webhook pipeline writes
    # (the rest of the file, six times longer, adds no model); one batch holding a schema-invalid element (an objectId
    # that is not a number, as the demo file holds further on) quarantines a component.
    for delivery in load_deliveries(OUTPUT_PATH)[:12]:
        post_signed(client, delivery.body, sign=delivery.sign)
    malformed = {**hubspot_event(9_000_001, 902, 1000, "email", "abc@example.com"), "objectId": "abc"}
    assert post_signed(client, [hubspot_event(9_000_002, 902, 1000), malformed]).status_code == 202
    drain()
    stores = _stores()
    a_code = next(iter(load_all_reasons()))
    cases = []
    for name, store in sorted(stores.items()):
        for state in sorted(store.machine.reason_required):
            row = store.model.objects.order_by("id").first()
            if row is None and name in NOT_IN_DEMO_PIPELINE:
                row = rows.make(store.model, org_id="org-reasons", state=sorted(store.machine.initial)[0], version=1)
            assert row is not None, f"the pipeline wrote no {name} row"
            cases.append((store.model._meta.db_table, "state", state, row.pk))
    component = ReceiptComponent.objects.filter(disposition="quarantined").first()
    assert component is not None and component.reason_code
    cases.append((ReceiptComponent._meta.db_table, "disposition", "quarantined", component.pk))
    assert {table for table, *_ in cases} >= {CredentialGenerationDispatchGate._meta.db_table,
                                              "flows_flowrun", "flows_flowstepexecution", "flows_flowdependency"}
    for table, column, state, pk in cases:
        with pytest.raises(IntegrityError, match="reason_chk"):
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute(f"UPDATE `{table}` SET `{column}` = %s, `reason_code` = '' WHERE id = %s",
                                   [state, pk])
        # The same row in the same state with a code is accepted, so the refusal above is the reason CHECK.
        with pytest.raises(_Rollback):
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute(f"UPDATE `{table}` SET `{column}` = %s, `reason_code` = %s WHERE id = %s",
                                   [state, a_code, pk])
                    assert cursor.rowcount == 1
                raise _Rollback

