"""Get Records reads every live record its filters select (seed 004 section 12.2 step 5).

The step's non-locking current reader scans the object in record-key pages until it has the element's
bound of matches or no rows are left; a match far down the object is found, however many rows before it
do not match.
"""
from __future__ import annotations

import pytest

from nexusflow.flows.services.execute import _CurrentReader
from nexusflow.records.models import Record

from .conftest import save_record

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_match_after_many_rows_that_do_not_match_is_found(org, monkeypatch):
    monkeypatch.setattr(_CurrentReader, "PAGE", 4)
    for i in range(23):
        save_record(org, {"email": f"p{i}@example.com", "lastname": "Other"})
    keys = sorted(Record.objects.filter(org_id=org.org_id).values_list("record_key", flat=True))
    last = keys[-1]
    found = _CurrentReader(org.org_id).query("Contact", lambda rec: rec["Id"] == last, limit=1)
    assert [rec["Id"] for rec in found] == [last]
    # The bound: the first `limit` matches in key order, and no more.
    every = _CurrentReader(org.org_id).query("Contact", lambda rec: True, limit=10)
    assert [rec["Id"] for rec in every] == keys[:10]
    assert _CurrentReader(org.org_id).query("Contact", lambda rec: rec["Id"] in keys[3:], limit=100) == [
        {"Id": k, "__object": "Contact", **Record.objects.get(record_key=k).fields} for k in keys[3:]]
