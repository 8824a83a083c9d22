"""The REST API fuzz across orgs: another org's operator reads and changes nothing of the org.

By hand for every operation, then in a fuzz run (``st run``, as in
``tests/test_api_schema_fuzz.py``) whose identifiers are all the first org's
(``no_foreign_identifier``, ``tests/api_fuzz_hooks.py``). The set-up is
``tests/api_fuzz_support.py``'s.
"""
from __future__ import annotations

import httpx
import pytest

from connectors.models import ReplayRequest
from nexusflow.records.models import Record
from runtime_outbox.replay_guard import SUPPRESS_EXTERNAL_EFFECTS
from tests.api_fuzz_support import (
    ACCOUNT,
    OTHER_OPERATOR,
    OTHER_ORG,
    PASSWORD,
    REPLAY_ID,
    fuzz_config,
    st_run,
)
from tests.conftest import ORG

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])


def _other(base: str) -> httpx.Client:
    return httpx.Client(base_url=base, auth=(OTHER_OPERATOR, PASSWORD), timeout=10)


def test_another_orgs_operator_reads_and_changes_nothing_of_the_org(web, org_data, tmp_path):
    lead = Record.objects.filter(org_id=ORG, object_name="Lead", is_deleted=False).order_by("id").first()
    run_id = org_data["run_ids"][0]
    edit = {"fields": {"lastname": "Other"}}
    with _other(web) as other:
        answers = {
            "replay": other.get(f"/api/v2/replays/{ACCOUNT}/{REPLAY_ID}/"),
            "replay create": other.post("/api/v2/replays/", json={
                "account_key": ACCOUNT, "replay_id": "fuzz-replay-other", "reason": "cross org",
                "predecessor_event_id": org_data["event_ids"][0], "external_effects": SUPPRESS_EXTERNAL_EFFECTS}),
            "run in the org": other.get(f"/api/v2/flows/orgs/{ORG}/runs/{run_id}/"),
            "run under its own org": other.get(f"/api/v2/flows/orgs/{OTHER_ORG}/runs/{run_id}/"),
            "update": other.patch(f"/api/v2/records/Lead/{lead.record_key}/", json=edit),
            "create in the org": other.post("/api/v2/records/Lead/", json={**edit, "org_id": ORG}),
            "merge": other.post(f"/api/v2/records/Lead/{lead.record_key}/merge/",
                                json={"transfer_id": "fuzz-cross-org", "target_key": org_data["record_keys"][0]}),
            "convert": other.post(f"/api/v2/records/Lead/{lead.record_key}/convert/",
                                  json={"transfer_id": "fuzz-cross-org", "target_object": "Contact"}),
            "delete": other.delete(f"/api/v2/records/Lead/{lead.record_key}/"),
        }
    expected = {"replay": (404, "unknown_account"), "replay create": (404, "unknown_account"),
                "run in the org": (403, "org_not_authorized"), "run under its own org": (404, "flow_run_not_found"),
                "update": (404, "record_not_found"), "create in the org": (403, "org_not_authorized"),
                "merge": (404, "transfer_record_not_found"), "convert": (404, "transfer_record_not_found"),
                "delete": (404, "record_not_found")}
    assert {name: (r.status_code, r.json().get("error")) for name, r in answers.items()} == expected
    # An error may echo the identifier the caller sent, never anything the org holds.
    held = [org_data["replay_digest"], *(value for record in Record.objects.filter(org_id=ORG)
                                          for value in record.fields.values() if value)]
    for name, response in answers.items():
        others = [key for key in org_data["record_keys"] if key not in str(response.request.url)
                  and key not in response.request.content.decode()]
        assert not [value for value in held + others if value in response.text], (name, response.text)
    after = Record.objects.get(pk=lead.pk)
    assert (after.version, after.fields, after.is_deleted) == (lead.version, lead.fields, False)
    assert not ReplayRequest.objects.filter(replay_id="fuzz-replay-other").exists()

    # The fuzz as the other org's operator, every identifier the org's: nothing of the org comes back.
    foreign = [*org_data["record_keys"], REPLAY_ID, org_data["replay_digest"]]
    st_run(web, tmp_path, fuzz_config(org_data, probability=1.0), user=OTHER_OPERATOR,
           session=org_data["sessions"][OTHER_OPERATOR], foreign=foreign)
    assert Record.objects.filter(org_id=ORG, is_deleted=False).count() == len(org_data["record_keys"])
