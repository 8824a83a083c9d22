"""Operator commands of the kernel: ``state_graph`` and ``reason_codes``."""
from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command

from connectors.models import ServingEpoch
from connectors.reasons import EPOCH_OWNER_MISMATCH, SUPERSEDED_BY_NEWER_VERSION
from nexusflow.kernel.reasons import load_all_reasons

from . import rows


def _out(*args) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_state_graph_prints_text_dot_and_the_list():
    text = _out("state_graph", "flows.FlowRun")
    assert "Waiting -> CancelRequested, Quarantined, Runnable, TerminalFailed" in text
    assert "reason code required in: Quarantined, TerminalFailed" in text
    dot = _out("state_graph", "connectors.RemoteEffect", "--format", "dot")
    assert '"dispatching" -> "prepared";' in dot
    assert '"uncertain" [style=dashed, color=red, xlabel="reason code"];' in dot
    assert '"finalized" [shape=doublecircle];' in dot
    listing = dict(line.split("\t")[::2] for line in _out("state_graph", "list").splitlines())
    assert listing["connectors.ServingPublicationBarrierSet"] == "connectors.store.ServingPublicationBarrierSetStore"
    assert listing["flows.FlowRun"] == "nexusflow.flows.store.FlowRunStore"
    assert listing["cutover.CutoverDecision"] == "cutover.store.CutoverDecisionStore"
    with pytest.raises(CommandError) as exc:
        call_command("state_graph", "flows.Nope")
    assert exc.value.returncode == 2
    with pytest.raises(CommandError, match="did you mean connectors.RemoteEffect"):
        call_command("state_graph", "RemoteEffect")


def test_reason_codes_lists_every_registered_code():
    listed = json.loads(_out("reason_codes", "--format", "json"))
    assert {r["code"] for r in listed["reasons"]} == set(load_all_reasons())
    assert all(r["remediations"] and r["evidence"] for r in listed["reasons"])
    assert set(listed["remediations"]) >= {rem for r in listed["reasons"] for rem in r["remediations"]}
    assert EPOCH_OWNER_MISMATCH in _out("reason_codes")


def test_reason_codes_shows_the_severity_class_and_filters_by_it():
    reasons = load_all_reasons()
    listed = json.loads(_out("reason_codes", "--format", "json"))
    assert {r["code"]: r["severity_class"] for r in listed["reasons"]} == {
        code: reason.severity_class for code, reason in reasons.items()}
    superseded = next(r for r in listed["reasons"] if r["code"] == SUPERSEDED_BY_NEWER_VERSION)
    assert (superseded["severity_class"], superseded["alert_after_seconds"]) == ("benign", 0)
    text = {line.split()[0]: line.split()[2] for line in _out("reason_codes").splitlines()
            if not line.startswith(" ")}
    assert text[SUPERSEDED_BY_NEWER_VERSION] == "benign" and text[EPOCH_OWNER_MISMATCH] == "attention"
    for name in ("attention", "benign"):
        only = json.loads(_out("reason_codes", "--class", name, "--format", "json"))["reasons"]
        assert only and {r["code"] for r in only} == {c for c, r in reasons.items() if r.severity_class == name}
    attention_text = _out("reason_codes", "--class", "attention")
    assert EPOCH_OWNER_MISMATCH in attention_text and SUPERSEDED_BY_NEWER_VERSION not in attention_text
    with pytest.raises(CommandError, match="--class"):
        call_command("reason_codes", "--class", "severe")
    with pytest.raises(CommandError, match="--class filters the listing") as exc:
        call_command("reason_codes", EPOCH_OWNER_MISMATCH, "--org", "o", "--class", "attention")
    assert exc.value.returncode == 2


@pytest.mark.django_db
def test_reason_codes_reads_the_evidence_of_one_org_only():
    mine = rows.make(ServingEpoch, org_id="evidence-org", state="rejected", version=1,
                     reason_code=EPOCH_OWNER_MISMATCH)
    rows.make(ServingEpoch, org_id="other-org", state="rejected", version=1, reason_code=EPOCH_OWNER_MISMATCH)
    second = rows.make(ServingEpoch, org_id="evidence-org", state="rejected", version=1,
                       reason_code=EPOCH_OWNER_MISMATCH)
    shown = json.loads(_out("reason_codes", EPOCH_OWNER_MISMATCH, "--org", "evidence-org", "--format", "json"))
    assert sorted(r["id"] for r in shown["rows"]) == sorted([mine.pk, second.pk]) and shown["total"] == 2
    assert shown["severity_class"] == "attention"
    text = _out("reason_codes", EPOCH_OWNER_MISMATCH, "--org", "evidence-org")
    assert "2 row(s) for evidence-org" in text and "(connectors, attention)" in text
    assert "2 row(s), showing the first 1 (--limit) for evidence-org" in _out(
        "reason_codes", EPOCH_OWNER_MISMATCH, "--org", "evidence-org", "--limit", "1")


@pytest.mark.parametrize("args", [["no_such_code", "--org", "o"], [EPOCH_OWNER_MISMATCH],
                                  [EPOCH_OWNER_MISMATCH, "--org", " padded"], ["--org", "o"]])
def test_reason_codes_refuses_bad_input_with_exit_code_2(args):
    with pytest.raises(CommandError) as exc:
        call_command("reason_codes", *args)
    assert exc.value.returncode == 2


@pytest.mark.parametrize("limit", ["-1", "0", "many"])
def test_reason_codes_refuses_a_bad_limit(limit):
    with pytest.raises(CommandError, match="limit"):
        call_command("reason_codes", EPOCH_OWNER_MISMATCH, "--org", "o", "--limit", limit)
