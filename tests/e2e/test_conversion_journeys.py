"""``manage.py journeys``: the HubSpot lead-conversion journeys end to end (packs/hubspot/conversion_journeys.py).

Each journey runs through the command itself (its own databases, the CRM
sandbox process, gunicorn, ``run_workers`` processes, signed webhooks over
HTTP) and the test reads the JSON report: what the provider saw and every
check. Seed 000 names the journeys; seed 002 "Retry And Recovery Semantics".
"""
import pytest

from tests.e2e.journey_support import CONTACTS, run_journey

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])


def _one_contact_converged(report: dict) -> dict:
    """One contact N at the provider, created by NexusFlow's only POST; every PATCH went to N."""
    provider = report["provider"]
    [contact] = provider["contacts"]
    remote_id = contact["id"]
    assert provider["seeded_by_journey"] == 0
    routes = provider["requests_by_route"]
    assert routes[f"POST {CONTACTS}"] == 1
    assert set(routes) == {f"POST {CONTACTS}", f"PATCH {CONTACTS}/{remote_id}"}
    assert (contact["create_requests"], contact["conflict_requests"], contact["archived"]) == (1, 0, False)
    return contact


def test_bi_conv_01_a_converted_lead_keeps_its_remote_contact_and_both_directions_follow_the_contact():
    report = run_journey("bi-conv-01")
    contact = _one_contact_converged(report)
    assert contact["properties"] == {"email": "ada.byron@example.com", "firstname": "Augusta", "lastname": "King",
                                     "lifecyclestage": "customer"}
    checks = {check["check"] for check in report["checks"]}
    assert {"the conversion made no provider request", "the lead's push link is retired",
            "the contact's push link is active on N", "a later webhook about N applied to the contact",
            "the contact edit PATCHed N"} <= checks


def test_post_convert_contact_storm_conflicts_are_retryable_and_everything_converges_on_one_contact():
    report = run_journey("post-convert-contact-storm")
    contact = _one_contact_converged(report)
    assert contact["properties"]["lifecyclestage"] == "customer"
    assert report["provider"]["operator_conflicts"]["merge"] >= 1
    checks = {check["check"] for check in report["checks"]}
    assert {"the conversion racing the lead's PATCH answered 409", "... with code owner_outbound_pending",
            "the merge racing the contact's in-flight pushes got a retryable 409",
            "every mutation finally succeeded",
            "the provider's contact N equals the local contact's mapped fields"} <= checks
