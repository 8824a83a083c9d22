"""``manage.py journeys``: the HubSpot create-409 recovery journeys end to end, and the command's list.

Each journey runs through the command itself (its own databases, the CRM
sandbox process, gunicorn, ``run_workers`` processes, signed webhooks over
HTTP) and the test reads the JSON report: what the provider saw and every
check. Seed 000 names the journeys; seed 002 "Retry And Recovery Semantics"
(a create is never repeated blindly).
"""
import pytest

from tests.conftest import run_manage, subprocess_env
from tests.e2e.journey_support import CONTACTS, run_journey

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])


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
    contact = _one_post_and_patches(run_journey("out-409-recover"), patches=1)
    assert contact["properties"] == {"email": "Ada@Example.com", "firstname": "Ada", "lastname": "King",
                                     "lifecyclestage": "customer"}


def test_out_409_create_frozen_recover_uses_the_frozen_request_and_the_change_follows_as_a_patch():
    report = run_journey("out-409-create-frozen-recover")
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
