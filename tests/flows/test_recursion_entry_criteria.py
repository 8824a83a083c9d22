"""A Flow that updates its own trigger record, gated by an ``IsChanged`` entry condition on another field,
runs once per outside change: its own write-back changes only the field it sets, which does not meet the
condition, so the re-save admits no run (issue "The Flow language real flows use", evidence: the recursion
test "with and without an ISCHANGED condition"; without one, tests/flows/test_resaves.py runs the chain to
the recursion bound).
"""
from __future__ import annotations

import pytest

from nexusflow.flows import transitions as t
from nexusflow.flows.models import FlowRun
from nexusflow.flows.services import flow_deploy
from nexusflow.records.models import Record

from . import flowxml as fx
from .conftest import run_until_idle, save_record, update_record

pytestmark = pytest.mark.django_db(transaction=True)

EMAIL_CHANGED = ("<filterLogic>and</filterLogic><filters><field>email</field><operator>IsChanged</operator>"
                 "<value><booleanValue>true</booleanValue></value></filters>")


def _stamp_on_email_change() -> bytes:
    stamp = ("<recordUpdates><name>Stamp</name><label>Stamp</label><locationX>1</locationX><locationY>2</locationY>"
             "<inputAssignments><field>lastname</field><value><stringValue>Seen</stringValue></value>"
             "</inputAssignments><inputReference>$Record</inputReference></recordUpdates>")
    return fx.flow(stamp, start=fx.start("Stamp", trigger="RecordAfterSave", rtt="Update", filters=EMAIL_CHANGED))


def test_an_ischanged_gated_self_update_runs_once_per_outside_change(org):
    flow_deploy(org=org, source=_stamp_on_email_change(), flow_api_name="Stamp_On_Email_Change")
    contact = save_record(org, {"email": "a@example.com", "lastname": "Lee"})
    update_record(org, contact, {"lastname": "Ng"})  # not the gated field: no run
    run_until_idle()
    assert not FlowRun.objects.filter(org_id=org.org_id).exists()
    for n, email in enumerate(("b@example.com", "c@example.com"), start=1):
        update_record(org, Record.objects.get(pk=contact.pk), {"email": email})
        run_until_idle()
        runs = FlowRun.objects.filter(org_id=org.org_id).order_by("id")
        # One run per outside change; the write-back's re-save (lastname only) admitted none.
        assert [(r.save_depth, r.state) for r in runs] == [(0, t.RUN_SUCCEEDED)] * n
        stored = Record.objects.get(pk=contact.pk)
        assert stored.fields["lastname"] == "Seen"
        update_record(org, stored, {"lastname": "Reset"})  # an outside change of the other field: no run
        run_until_idle()
        assert FlowRun.objects.filter(org_id=org.org_id).count() == n
