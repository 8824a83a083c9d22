"""``manage.py flows inventory`` (seed 004 section 20.4) over the real corpus and over bad input."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from nexusflow.flows.compiler import PROFILES

from .conftest import CORPUS, DEMO_FLOW

FIXTURE = Path(__file__).with_name("fixtures") / "corpus_inventory.json"
KEYS = ["file", "flow", "profile", "rejected", "reasons", "unknown_capabilities", "steps", "cohort", "runs",
        "blockers", "refused_for"]


def _inventory(*args: str) -> str:
    out = io.StringIO()
    call_command("flows", "inventory", *args, stdout=out)
    return out.getvalue()


def test_corpus_inventory_matches_the_committed_fixture(corpus_view):
    """The corpus inventoried against its own metadata (objects and quick actions: fixtures/corpus_metadata)."""
    rows = json.loads(_inventory(str(CORPUS), "--json"))

    def named(row: dict) -> dict:  # the fixture names each file, not where the corpus lies on this machine
        return {**row, "file": Path(row["file"]).name}

    assert [named(r) for r in rows] == json.loads(FIXTURE.read_text(encoding="utf-8"))
    files = sorted(p.name for p in CORPUS.glob("*.flow-meta.xml"))
    assert [Path(r["file"]).name for r in rows] == files
    for row in rows:
        assert list(row) == KEYS
        assert row["rejected"] == (row["profile"] is None)
        assert row["profile"] is None or row["profile"] in PROFILES
        assert row["rejected"] == bool(row["reasons"])  # a rejection always says why
        assert all(set(r) == {"code", "element", "detail"} and r["code"] for r in row["reasons"])
        assert 1 <= row["cohort"] <= 8 and row["steps"] >= 0
        assert row["runs"] == (not row["blockers"]) and (not row["rejected"] or not row["runs"])
        assert all(set(b) == {"code", "element", "detail"} and b["code"] for b in row["blockers"])
    assert {r["profile"] for r in rows} >= set(PROFILES)


def test_each_corpus_file_that_does_not_run_says_why_in_the_classes_the_issue_allows(corpus_view):
    """Refused only for screens (UI), an org's own capability outside the catalog, Orchestrator or Process
    Builder process types, or broken metadata; ``engine`` marks what this engine still lacks."""
    rows = json.loads(_inventory(str(CORPUS), "--json"))
    refused = {r["flow"]: r["refused_for"] for r in rows if not r["runs"]}
    assert all(r["refused_for"] == [] for r in rows if r["runs"])
    assert {c for classes in refused.values() for c in classes} <= {"screens", "org_capability", "process_type",
                                                                    "broken_metadata", "engine"}
    assert not {flow for flow, classes in refused.items() if "engine" in classes}  # nothing left for the engine
    assert refused["Handle_User_Deactivation_auto"] == ["process_type"]
    assert refused["Wait_3_Days"] == ["broken_metadata"]
    assert refused["Flow_Launcher"] == ["org_capability", "screens"]


def test_inventory_human_output_names_profile_proofs_and_reasons():
    text = _inventory(str(CORPUS))
    assert "Breed_Name_Update_Flow: embedded_before_save  cohort=3" in text
    assert "Tour_Request_Set_Realtor: embedded_before_save" in text
    assert "Adopter_Match_clean_up_Subflow: durable_orchestration  cohort=8" in text and "runs: yes" in text
    assert "unsupported_process_type:Orchestrator" in text
    assert " run, " in text.rstrip().splitlines()[-1]
    assert "Loop_Through_Adoption_Match_records=unknown" in text
    assert "unsupported_element:screens [Setup_Email]" in text
    assert text.rstrip().endswith("rejected")


def test_unparsable_and_unreadable_files_are_rejections_not_crashes(tmp_path):
    (tmp_path / "Broken.flow-meta.xml").write_bytes(b"<Flow><start></Flow>")
    (tmp_path / "Entity.flow-meta.xml").write_bytes(b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY e "e">]><Flow/>')
    (tmp_path / "Empty.flow-meta.xml").write_bytes(b"")
    (tmp_path / "Binary.flow-meta.xml").write_bytes(bytes(range(256)))
    (tmp_path / "Good.flow-meta.xml").write_bytes(DEMO_FLOW.read_bytes())
    (tmp_path / "Folder.flow-meta.xml").mkdir()
    rows = {r["flow"]: r for r in json.loads(_inventory(str(tmp_path), "--json"))}
    assert rows["Broken"]["reasons"][0]["code"] == "xml_malformed"
    assert rows["Entity"]["reasons"][0]["code"] == "xml_forbidden_declaration"
    assert rows["Empty"]["rejected"] and rows["Binary"]["rejected"]
    assert rows["Folder"]["reasons"][0]["code"] == "unreadable"
    assert rows["Good"]["profile"] == "durable_orchestration" and rows["Good"]["cohort"] == 7
    with pytest.raises(CommandError) as exc:
        _inventory(str(tmp_path / "missing"))
    assert exc.value.returncode == 2
