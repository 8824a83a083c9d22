"""``manage.py journeys``: the HubSpot journeys whose push waits (packs/hubspot/wait_journeys.py), end to end.

Each journey runs through the command itself (its own databases, the CRM
sandbox process, gunicorn, ``run_workers`` processes it kills and restarts,
signed webhooks over HTTP) and the test reads the JSON report: what the
provider saw and every check. Seed 004 sections 14-14.2.
"""
import pytest

from tests.e2e.journey_support import CONTACTS, run_journey

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])


def test_push_after_cooling_off_waits_twice_through_killed_workers_and_creates_once():
    """Seed 004 section 14 end to end (issue "Flows that wait"): the push waits on the database clock, then on
    the owner's receipt; the flow worker is killed during the first wait, flow and runtime workers during the
    second; one create POST, one contact, one remote effect, the run succeeded."""
    report = run_journey("push-after-cooling-off")
    provider = report["provider"]
    [contact] = provider["contacts"]
    assert provider["requests_by_route"] == {f"POST {CONTACTS}": 1}
    assert (contact["create_requests"], contact["update_requests"], contact["archived"]) == (1, 0, False)
    checks = {check["check"] for check in report["checks"]}
    assert {"the run waited on the clock, then on the receipt; both resolved",
            "the intent was authored only after the cooling-off time resolved"} <= checks


def test_push_when_customer_waits_on_the_record_the_crm_webhook_changes_and_creates_once():
    """Seed 004 sections 14.1-14.2 end to end: the run waits on a record event (producer record.condition) that the
    CRM's webhook meets through the inbound chain, then on the clock and the owner's receipt; the flow worker is
    killed in the record and clock waits; one create POST, one contact, one remote effect."""
    report = run_journey("push-when-customer")
    provider = report["provider"]
    [contact] = provider["contacts"]
    assert provider["requests_by_route"] == {f"POST {CONTACTS}": 1}
    assert (contact["create_requests"], contact["properties"]["lifecyclestage"]) == (1, "customer")
    checks = {check["check"] for check in report["checks"]}
    assert {"nothing was pushed while the contact was an opportunity",
            "the run waited on the record, the clock and the receipt; all resolved",
            "the record event resolved on the signal of the save that made the contact a customer"} <= checks
