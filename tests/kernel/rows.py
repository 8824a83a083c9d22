"""Build one valid row of any GuardedModel, in any state, for store-level tests.

The builder reads the model's own field definitions: required text gets a
fresh canonical token, integers a fresh positive number, JSON an empty object,
times the DB clock, and every required foreign key a parent row built the same
way in the same org. Nullable and defaulted fields keep their defaults, so a
row is the smallest one the schema accepts.
"""
from __future__ import annotations

import itertools
from typing import Any

from django.db import models

from nexusflow.kernel.clock import db_now
from nexusflow.kernel.models import insert

_counter = itertools.count(1)


def _fresh(field: models.Field) -> Any:
    n = next(_counter)
    if field.choices:
        return field.choices[0][0]
    if isinstance(field, models.BooleanField):
        return False
    if isinstance(field, (models.IntegerField, models.DecimalField, models.FloatField)):
        return 1_000_000 + n
    if isinstance(field, models.DateTimeField):
        return db_now()
    if isinstance(field, models.JSONField):
        return {}
    if isinstance(field, models.BinaryField):
        return f"bytes-{n}".encode()
    if isinstance(field, (models.CharField, models.TextField)):
        token = f"t{n}"
        return token if not field.max_length else token[: field.max_length]
    raise TypeError(f"rows.make: no generator for {type(field).__name__} {field.name}")


#: Rows whose CHECK constraints need one of several nullable columns set:
#: the smallest value that satisfies them.
CHECK_DEFAULTS = {
    "connectors.ReceiptAdmissionKey": {"v1_tombstone": {"protocol": "v1"}},
}


def make(model, *, org_id: str, **values):
    """Insert and return one ``model`` row in ``org_id`` with ``values`` applied, in any state.

    Raises:
        TypeError: a required field of a kind the builder does not know.
    """
    for name, value in CHECK_DEFAULTS.get(model._meta.label, {}).items():
        if not any(k in values for k in (name, "receipt", "receipt_id")):
            values[name] = value
    for field in model._meta.concrete_fields:
        if field.primary_key or field.name in values or field.attname in values:
            continue
        if field.name == "org_id":
            values["org_id"] = org_id
        elif field.is_relation:
            if field.null:
                continue
            values[field.name] = make(field.related_model, org_id=org_id)
        elif field.has_default() or field.null or getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False):
            continue
        elif isinstance(field, (models.CharField, models.TextField)) and field.blank:
            continue
        else:
            values[field.name] = _fresh(field)
    return insert(model, allow_any_state=True, **values)


class RowBuilder:
    """Rows of any stored machine in a chosen state, for one org.

    Flow rows reference a compiled plan through composite keys, so they come
    from the Flow tests' own builder; every other model from :func:`make`.
    """

    def __init__(self, org_id: str):
        self.org_id = org_id
        self._flow_rows = None

    def row(self, store, state: str):
        """Insert one row of ``store.model`` in ``state`` (version 1)."""
        name = store.machine.name
        if name.startswith("flows."):
            from nexusflow.kernel.scope import OrgScope
            from tests.flows.rows import ROW_FACTORY, Rows

            if self._flow_rows is None:
                self._flow_rows = Rows(OrgScope(self.org_id))
            return getattr(self._flow_rows, ROW_FACTORY[name])(state)
        extra = {}
        if state in store.machine.reason_required:
            extra["reason_code"] = reason_for(store.machine)  # the CHECK constraint wants a code here
        return make(store.model, org_id=self.org_id, state=state, version=1, **extra)


def reason_for(machine) -> str:
    """A registered reason code that rows of ``machine`` may carry (owned by one of its reason owners)."""
    from nexusflow.kernel.reasons import load_all_reasons

    return next(code for code, reason in sorted(load_all_reasons().items()) if reason.owner in machine.reason_owners)
