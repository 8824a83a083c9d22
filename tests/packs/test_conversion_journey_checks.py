"""The conversion journeys prove "the conversion made no provider request" by correlation, not by a time window.

Real MariaDB, the real egress adapter and the CRM objects sandbox over HTTP
(in-process): the provider's request log (method, path, SHA-256 of the exact
body) is attributed to the push attempts that sent each request, and a
request counts against the conversion unless it belongs to an intent the
conversion's owner check found terminal. Seed 000 "Transfer" (the move makes
no provider call; unfinished owner work refuses it, retryable).
"""
from __future__ import annotations

import httpx
import pytest

from nexusflow.kernel.scope import OrgScope
from nexusflow.records.models import Record
from nexusflow.records.transfer import OwnerWorkPending, record_convert
from packs.hubspot.conversion_journeys import (
    check_converted,
    conversion_fact,
    intents_since,
    requests_of,
    requests_since,
)
from packs.hubspot.crm_sandbox import CONTACTS_PATH
from packs.hubspot.journeys import Crm
from packs.journeys import Harness
from tests.conftest import HUBSPOT_TOKEN, ORG, drain
from tests.records.transfer_helpers import CONTACT_CONTRACT, LEAD_CONTRACT, author, fresh, links, pushed, serve

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

NO_REQUEST = "the conversion made no provider request"
NO_INTENT = "the conversion authored no outbound intent"


@pytest.fixture
def crm(billing_sandbox, hubspot_crm_sandbox):
    serve(billing_sandbox.base_url, hubspot_crm_sandbox.base_url)
    return hubspot_crm_sandbox


def convert(lead: Record):
    return record_convert(org=OrgScope(ORG), transfer_id=f"convert-{lead.record_key}", source_object="Lead",
                          source_key=lead.record_key, target_object="Contact", target_key=None, actor="ops")


def requests(sandbox) -> int:
    return sandbox.state()["requests"]


def harness(sandbox, tmp_path) -> Harness:
    """A journey harness whose provider side is the in-process sandbox (no processes started)."""
    h = Harness(name="checks", run_dir=tmp_path, env={}, databases=("", ""), say=lambda *a: None)
    h.values["crm"] = Crm(h, base_url=sandbox.base_url, token=HUBSPOT_TOKEN, webhook_secret=b"", ingress={})
    return h


def verdicts(h: Harness) -> dict[str, tuple[bool, str]]:
    return {check.name: (check.ok, check.detail) for check in h.checks}


def test_a_held_earlier_push_landing_while_the_conversion_retries_is_not_counted_against_it(crm, tmp_path):
    lead = pushed("Lead", "ada@x.io", LEAD_CONTRACT, status="open")
    (link,) = links(lead)
    remote_id = link.remote_id
    earlier = author(fresh(lead), LEAD_CONTRACT)  # a lead save whose PATCH has not reached the provider yet
    with pytest.raises(OwnerWorkPending):  # the conversion racing it answers 409 owner_outbound_pending
        convert(lead)
    window_opened = requests(crm)  # where a count "around the conversion" starts
    drain()  # the earlier save's PATCH reaches the provider now, inside that window
    result = convert(lead)

    # A window count sees one provider request during the conversion: it is not the conversion's.
    assert requests(crm) == window_opened + 1
    h = harness(crm, tmp_path)
    attributed = h.values["crm"].attributed()
    assert requests_of(attributed, int(earlier.pk)) == [f"PATCH {CONTACTS_PATH}/{remote_id}"]
    check_converted(h, lead.record_key, result.target_record_key, remote_id)
    checks = verdicts(h)
    assert checks[NO_REQUEST] == (True, "") and checks[NO_INTENT] == (True, "")


def test_a_request_made_after_the_conversion_or_by_no_push_attempt_counts_against_it(crm, tmp_path):
    lead = pushed("Lead", "bo@x.io", LEAD_CONTRACT, status="open")
    (link,) = links(lead)
    remote_id = link.remote_id
    result = convert(lead)
    h = harness(crm, tmp_path)
    provider = h.values["crm"]
    provider.seed_contact(email="someone.else@x.io")  # the journey's own request: never the conversion's
    check_converted(h, lead.record_key, result.target_record_key, remote_id)
    assert verdicts(h)[NO_REQUEST] == (True, "") and verdicts(h)[NO_INTENT] == (True, "")

    # An intent authored after the conversion (as one it caused would be) and its PATCH of N...
    contact = Record.objects.get(org_id=ORG, object_name="Contact", record_key=result.target_record_key)
    later = author(contact, CONTACT_CONTRACT)
    drain()
    # ... and a request no push attempt sent.
    stray = httpx.patch(f"{crm.base_url}{CONTACTS_PATH}/{remote_id}", content=b'{"properties":{"phone":"1"}}',
                        headers={"Authorization": f"Bearer {HUBSPOT_TOKEN}", "Content-Type": "application/json"})
    assert stray.status_code == 200

    transfer = conversion_fact(lead.record_key)
    attributed = provider.attributed()
    since = requests_since(attributed, transfer)
    assert [(entry["method"], entry["path"]) for entry in since] == [("PATCH", f"{CONTACTS_PATH}/{remote_id}")] * 2
    assert [a.command_id for a in attributed if a.request in since] == [int(later.pk), None]
    assert intents_since(transfer) == [(int(later.pk), "Contact", contact.record_key)]
    h.checks.clear()
    check_converted(h, lead.record_key, result.target_record_key, remote_id)
    checks = verdicts(h)
    assert checks[NO_REQUEST][0] is False and checks[NO_INTENT][0] is False
