"""``manage.py journeys``: the HubSpot create-409 recovery and lead-conversion journeys end to end.

Each journey runs through the command itself (its own databases, the CRM
sandbox process, gunicorn, ``run_workers`` processes, signed webhooks over
HTTP) and the test reads the JSON report: what the provider saw and every
check. Seed 000 names the journeys; seed 002 "Retry And Recovery Semantics"
(a create is never repeated blindly).
"""
import json

import pytest

from tests.conftest import run_manage, subprocess_env

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

CONTACTS = "/crm/v3/objects/contacts"


def _run(name: str) -> dict:
    result = run_manage(["journeys", "run", name, "--json"], subprocess_env(), timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["journey"] == name and report["ok"] is True
    assert report["checks"] and all(check["ok"] for check in report["checks"]), report["checks"]
    return report


def _one_post_and_patches(report: dict, *, patches: int) -> dict:
    provider = report["provider"]
    [contact] = provider["contacts"]
    existing = contact["id"]
    # One POST seeded the contact at the provider before the journey; NexusFlow sent exactly one more (the 409).
    assert provider["seeded_by_journey"] == 1
    assert provider["requests_by_route"] == {f"POST {CONTACTS}": 2, f"GET {CONTACTS}/{existing}": 1,
                                             f"PATCH {CONTACTS}/{existing}": patches}
    assert (contact["create_requests"], contact["conflict_requests"], contact["update_requests"]) == (1, 1, patches)
    assert contact["archived"] is False
    return contact


def test_out_409_recover_links_the_existing_contact_and_later_edits_patch_it():
    contact = _one_post_and_patches(_run("out-409-recover"), patches=1)
    assert contact["properties"] == {"email": "Ada@Example.com", "firstname": "Ada", "lastname": "King",
                                     "lifecyclestage": "customer"}


def test_out_409_create_frozen_recover_uses_the_frozen_request_and_the_change_follows_as_a_patch():
    report = _run("out-409-create-frozen-recover")
    contact = _one_post_and_patches(report, patches=1)
    assert contact["properties"]["email"] == "grace.hopper@example.com"
    checks = {check["check"] for check in report["checks"]}
    assert {"the create sent the frozen email", "the local record changed after the create was frozen"} <= checks


def test_journeys_list_names_both_and_an_unknown_journey_cannot_run():
    listed = run_manage(["journeys", "list"], subprocess_env(), timeout=60)
    assert listed.returncode == 0
    names = [line.split("\t")[0] for line in listed.stdout.splitlines()]
    assert {"out-409-recover", "out-409-create-frozen-recover", "bi-conv-01", "post-convert-contact-storm",
            "push-after-cooling-off", "push-when-customer"} <= set(names)
    unknown = run_manage(["journeys", "run", "no-such-journey"], subprocess_env(), timeout=60)
    assert unknown.returncode == 2 and "unknown journey" in unknown.stderr and "Traceback" not in unknown.stderr


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
    report = _run("bi-conv-01")
    contact = _one_contact_converged(report)
    assert contact["properties"] == {"email": "ada.byron@example.com", "firstname": "Augusta", "lastname": "King",
                                     "lifecyclestage": "customer"}
    checks = {check["check"] for check in report["checks"]}
    assert {"the conversion made no provider request", "the lead's push link is retired",
            "the contact's push link is active on N", "a later webhook about N applied to the contact",
            "the contact edit PATCHed N"} <= checks


def test_post_convert_contact_storm_conflicts_are_retryable_and_everything_converges_on_one_contact():
    report = _run("post-convert-contact-storm")
    contact = _one_contact_converged(report)
    assert contact["properties"]["lifecyclestage"] == "customer"
    assert report["provider"]["operator_conflicts"]["merge"] >= 1
    checks = {check["check"] for check in report["checks"]}
    assert {"the conversion racing the lead's PATCH answered 409", "... with code owner_outbound_pending",
            "the merge racing the contact's in-flight pushes got a retryable 409",
            "every mutation finally succeeded",
            "the provider's contact N equals the local contact's mapped fields"} <= checks


def test_push_after_cooling_off_waits_twice_through_killed_workers_and_creates_once():
    """Seed 004 section 14 end to end (issue "Flows that wait"): the push waits on the database clock, then on
    the owner's receipt; the flow worker is killed during the first wait, flow and runtime workers during the
    second; one create POST, one contact, one remote effect, the run succeeded."""
    report = _run("push-after-cooling-off")
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
    report = _run("push-when-customer")
    provider = report["provider"]
    [contact] = provider["contacts"]
    assert provider["requests_by_route"] == {f"POST {CONTACTS}": 1}
    assert (contact["create_requests"], contact["properties"]["lifecyclestage"]) == (1, "customer")
    checks = {check["check"] for check in report["checks"]}
    assert {"nothing was pushed while the contact was an opportunity",
            "the run waited on the record, the clock and the receipt; all resolved",
            "the record event resolved on the signal of the save that made the contact a customer"} <= checks
