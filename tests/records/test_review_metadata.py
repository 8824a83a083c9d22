"""Malformed typed-field metadata does not load (docs/operations.md "Typed record fields": a picklist without
values does not load)."""
from __future__ import annotations

import pytest

from nexusflow.records.metadata import load_view
from tests.records.test_typed_fields import INVOICE, _write_view


@pytest.mark.parametrize("values", [[], "Open", ["Open", 3], ["Open", "Open"], [""]])
def test_a_picklist_without_a_list_of_distinct_values_does_not_load(tmp_path, values):
    """An empty list accepted every value but "no value"; a string became its letters; a number or a
    duplicate is not a value a write can give (values are text)."""
    doc = {**INVOICE, "fields": [{"name": "Odd__c", "type": "picklist", "max_length": 10, "values": values}]}
    with pytest.raises(ValueError, match="a picklist field lists its values"):
        load_view(_write_view(tmp_path / "metadata", doc))
