"""Golden plans over the real corpus (seed 004 sections 7.3 and 22.1; issue #7 "Evidence").

``fixtures/golden_plans.json`` pins, per corpus file, the plan digest, profile
and step keys of a compiled flow, or the reason codes of a rejected one. The
digests cover every section 7.3 input, so they change when the compiler
version, the shipped catalog, the metadata view or the flow changes: then
regenerate with ``NEXUS_REGEN_GOLDEN=1`` and review the diff.

Each golden flow is also recompiled after :func:`flowxml.reformat` (other
indentation, other canvas coordinates, top-level elements reordered): the
plan digest must stay byte-identical.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from nexusflow.flows.binding import flow_runtime_binding
from nexusflow.flows.catalog import catalog_current
from nexusflow.flows.compiler import analyze_flow
from nexusflow.flows.inventory import CHECK_ORG, flow_api_name_of
from nexusflow.records.metadata import current_view

from .conftest import CORPUS
from .flowxml import reformat

GOLDEN = Path(__file__).with_name("fixtures") / "golden_plans.json"
FILES = sorted(CORPUS.glob("*.flow-meta.xml"))

#: Every manifest category is represented (MANIFEST.tsv columns).
CATEGORIES = {
    "before-save": ["Breed_Name_Update_Flow", "PMT_Task_Before_Automation", "Populate_Vehicle_Range",
                    "Tour_Request_Set_Realtor"],
    "after-save": ["TTS_Update_Tenant_Contact_on_Change", "Animal_Animal_Create_Update_Trigger"],
    "loops": ["Adopter_Match_clean_up_Subflow", "Location_Change_Unit_Status_SubFlow",
              "AIM_FilterExistingIncidentRelatedItems", "Issue_Bulk_Resort_Credits"],
    "subflows": ["TTS_Update_Tenant_Contact_on_Change", "TTS_Tenant_Contact_Scheduled_Actions"],
    "actionCalls": ["Adopter_Match_clean_up_Subflow", "Send_WebPush_notification_on_new_vehicle"],
    "waits": ["Wait_3_Days"],
    "screens rejected": ["AIM_SendCoreEmail", "PMT_Mass_update_Task_Status", "Flow_Launcher"],
    "pure autolaunched": ["TrackShipment", "TTS_Tenant_Contact_Set_IsCurrent_Field"],
}


def _context():
    view = current_view()
    catalog = catalog_current(binding=flow_runtime_binding(org_id=CHECK_ORG, metadata_view_digest=view.digest))
    subflows = {flow_api_name_of(p): p.read_bytes() for p in FILES}
    return view, catalog, subflows


def _golden_of(source: bytes, name: str, view, catalog, subflows) -> dict:
    result = analyze_flow(source=source, flow_api_name=name, catalog=catalog, view=view, subflows=subflows,
                          schema="open")
    if result.rejected:
        return {"profile": None, "reasons": sorted({d.code for d in result.errors})}
    return {"profile": result.profile, "plan_digest": result.plan.plan_digest,
            "step_keys": [s["key"] for s in result.plan.steps]}


def _compute() -> dict:
    view, catalog, subflows = _context()
    return {flow_api_name_of(p): _golden_of(p.read_bytes(), flow_api_name_of(p), view, catalog, subflows)
            for p in FILES}


def test_golden_plan_digests_cover_every_manifest_category():
    computed = _compute()
    if os.environ.get("NEXUS_REGEN_GOLDEN") == "1":
        GOLDEN.write_text(json.dumps(computed, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    assert computed == golden
    compiled = [n for n, g in golden.items() if g["profile"]]
    assert len(compiled) >= 10, compiled
    for category, names in CATEGORIES.items():
        assert set(names) <= set(golden), category
    assert {golden[n]["profile"] for n in compiled} == {"embedded_before_save", "bounded_atomic",
                                                        "durable_orchestration"}
    assert "unsupported_element:screens" in golden["AIM_SendCoreEmail"]["reasons"]


@pytest.mark.parametrize("name", sorted({n for names in CATEGORIES.values() for n in names}))
def test_stable_step_keys_and_plan_digest_across_non_semantic_formatting(name):
    view, catalog, subflows = _context()
    path = next(p for p in FILES if flow_api_name_of(p) == name)
    source = path.read_bytes()
    original = _golden_of(source, name, view, catalog, subflows)
    assert original == json.loads(GOLDEN.read_text(encoding="utf-8"))[name]
    for variant in (reformat(source), reformat(source, indent="  ", reverse=False, move=-40),
                    reformat(reformat(source), indent="    ", move=7)):
        assert variant != source
        assert _golden_of(variant, name, view, catalog, subflows) == original
    # A subflow reformatted in its own file does not change its caller's plan either.
    reformatted_subflows = {k: reformat(v) for k, v in subflows.items()}
    assert _golden_of(source, name, view, catalog, reformatted_subflows) == original


def test_deterministic_plan_from_identical_inputs():
    """Same inputs, same plan digest: twice in this process and once in a fresh interpreter
    with another hash seed (set and dict ordering cannot leak into the digest)."""
    here = _compute()
    assert here == _compute()
    env = {**os.environ, "PYTHONHASHSEED": "12345", "DJANGO_SETTINGS_MODULE": "nexusflow.settings"}
    out = subprocess.run(
        [sys.executable, "manage.py", "flows", "inventory", str(CORPUS), "--json", "--detail"],
        cwd=settings.BASE_DIR, env=env, capture_output=True, text=True, check=True, timeout=300,
    ).stdout
    other = {row["flow"]: row["plan_digest"] for row in json.loads(out)}
    assert other == {n: g.get("plan_digest") for n, g in here.items()}
    assert sum(1 for d in other.values() if d) >= 10
