"""Stateful models are guarded and every ORM write path refuses (ARCHITECTURE.md section 6, "State changes").

Statically: every model with a ``state`` field derives from ``GuardedModel``
and has exactly one ``CasStore`` whose machine is ``"<app_label>.<Model>"``.
At runtime: a real row of every ``GuardedModel``, inserted through its store
(or :func:`nexusflow.kernel.models.insert` for immutable rows), refuses
``save()``, ``delete()`` and the queryset writers.
"""
from __future__ import annotations

from unittest import mock

import pytest
from django.apps import apps
from django.db import models
from django.test.utils import isolate_apps

import connectors.store
import cutover.store  # noqa: F401  (registers its CasStore subclasses)
import nexusflow.flows.store  # noqa: F401  (registers its CasStore subclasses)
import runtime_outbox.store  # noqa: F401  (registers its CasStore subclasses)
from nexusflow.kernel.clock import db_now
from nexusflow.kernel.errors import ImmutableRow
from nexusflow.kernel.models import GuardedModel, insert
from nexusflow.kernel.store import STORES, CasStore
from tests.guardrails import all_subclasses, check_stateful_models

GUARDED = sorted((m for m in apps.get_models() if issubclass(m, GuardedModel)), key=lambda m: m._meta.label)
STATEFUL = [m for m in GUARDED if "state" in {f.name for f in m._meta.concrete_fields}]


def _stores() -> list[type[CasStore]]:
    return all_subclasses(CasStore)


# --- the static rule -------------------------------------------------------------
def test_every_stateful_model_is_guarded_and_has_one_cas_store():
    violations = check_stateful_models(apps.get_models(), _stores())
    assert not violations, "\n".join(map(str, violations))


def test_the_stateful_set_is_the_expected_one():
    labels = {m._meta.label for m in STATEFUL}
    assert {"connectors.AccountServingGate", "connectors.DispatchPermit", "flows.FlowRun",
            "runtime_outbox.OutboxMessage", "cutover.CutoverDecision"} <= labels
    assert len(STATEFUL) == len({s.model for s in _stores()} & set(STATEFUL))


@isolate_apps("tests")
def test_a_stateful_model_outside_the_kernel_discipline_is_caught():
    class LooseThing(models.Model):
        org_id = models.CharField(max_length=64)
        state = models.CharField(max_length=16)

        class Meta:
            app_label = "tests"

    class GuardedThing(GuardedModel):
        org_id = models.CharField(max_length=64)
        state = models.CharField(max_length=16)

        class Meta:
            app_label = "tests"

    class Stateless(models.Model):
        name = models.CharField(max_length=16)

        class Meta:
            app_label = "tests"

    # Throwaway stores register in the kernel's store registry; keep them out of the real one.
    with mock.patch.dict(STORES, {}, clear=True):
        class WrongNameStore(CasStore):
            model = GuardedThing
            machine = connectors.store.AccountServingGateStore.machine

    found = {(v.path, v.detail) for v in check_stateful_models([LooseThing, GuardedThing, Stateless],
                                                                [WrongNameStore])}
    assert found == {
        ("tests.LooseThing", "does not derive from GuardedModel"),
        ("tests.LooseThing", "has 0 CasStore subclasses ()"),
        ("tests.GuardedThing", "WrongNameStore.machine.name is 'connectors.AccountServingGate'"),
    }

    with mock.patch.dict(STORES, {}, clear=True):
        class SecondStore(CasStore):
            model = GuardedThing
            machine = WrongNameStore.machine

        # The registry itself refuses a second store for one machine at import time.
        with pytest.raises(TypeError, match="already has store"):
            class ThirdStore(CasStore):
                model = GuardedThing
                machine = WrongNameStore.machine

    found = {v.detail for v in check_stateful_models([GuardedThing], [WrongNameStore, SecondStore])}
    assert "has 2 CasStore subclasses (WrongNameStore, SecondStore)" in found


# --- the runtime rule against real rows ---------------------------------------------
def _value(field: models.Field, made: dict):
    """A valid value for a required column; a required FK gets a real parent row."""
    if field.is_relation:
        return _row(field.related_model, made)
    if isinstance(field, (models.DateTimeField, models.DateField)):
        return db_now()
    if isinstance(field, models.BooleanField):
        return False
    if isinstance(field, (models.IntegerField, models.DecimalField, models.FloatField)):
        return 1
    if isinstance(field, models.JSONField):
        return {}
    if isinstance(field, models.BinaryField):
        return b"x"
    # One row per table, so unique keys never collide; one shared value keeps the
    # composite scope foreign keys (org, installation, capability, digest) consistent.
    return "k"


def _row(model: type[GuardedModel], made: dict) -> GuardedModel:
    """Insert one row of ``model`` the way the app does: its CasStore for a stateful row, else ``insert``."""
    if model in made:
        return made[model]
    values = {}
    for field in model._meta.concrete_fields:
        if field.primary_key or field.has_default() or field.null or getattr(field, "auto_now_add", False) \
                or getattr(field, "auto_now", False) or field.name == "state" \
                or (field.name == "version" and isinstance(field, models.IntegerField)):  # the CAS version
            continue
        values[field.name] = _value(field, made)
    from tests.kernel.rows import CHECK_DEFAULTS

    for name, value in CHECK_DEFAULTS.get(model._meta.label, {}).items():
        values.setdefault(name, value)
    store = next((s for s in _stores() if s.model is model), None)
    if store is not None:
        row = store.create(state=sorted(store.machine.initial)[0], **values)
    else:
        row = insert(model, **values)
    made[model] = row
    return row


def _loaded(model):
    row = _row(model, {})
    return model.objects.get(org_id=row.org_id, pk=row.pk) if hasattr(row, "org_id") else model.objects.get(pk=row.pk)


WRITES = {
    "save": lambda m, row: row.save(),
    "delete": lambda m, row: row.delete(),
    "queryset_update": lambda m, row: m.objects.filter(pk=row.pk).update(pk=row.pk),
    "queryset_delete": lambda m, row: m.objects.filter(pk=row.pk).delete(),
    "bulk_create": lambda m, row: m.objects.bulk_create([m()]),
    "bulk_update": lambda m, row: m.objects.bulk_update([row], fields=[row._meta.concrete_fields[1].name]),
    "get_or_create": lambda m, row: m.objects.get_or_create(pk=row.pk),
    "update_or_create": lambda m, row: m.objects.update_or_create(pk=row.pk, defaults={}),
    "manager_create": lambda m, row: m.objects.create(),
}


@pytest.mark.django_db(transaction=True, databases=["default", "control"])
@pytest.mark.parametrize("model", GUARDED, ids=lambda m: m._meta.label)
def test_every_guarded_row_refuses_every_orm_write(model):
    row = _loaded(model)
    before = {f.attname: getattr(row, f.attname) for f in model._meta.concrete_fields}
    refused = []
    for name, write in WRITES.items():
        try:
            write(model, row)
        except ImmutableRow:
            refused.append(name)
    assert refused == list(WRITES), f"{model._meta.label} accepted {sorted(set(WRITES) - set(refused))}"
    again = model.objects.get(pk=row.pk)
    assert {f.attname: getattr(again, f.attname) for f in model._meta.concrete_fields} == before
    assert model.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_calling_save_on_a_loaded_stateful_row_raises():
    """The deliberate breakage of the Model.save rule: a service that saves a loaded row."""
    gate = _loaded(apps.get_model("connectors", "AccountServingGate"))
    gate.state = "v2_serving"
    with pytest.raises(ImmutableRow, match=r"AccountServingGate.save\(\) outside its store"):
        gate.save()
    assert type(gate).objects.get(org_id=gate.org_id, pk=gate.pk).state == "v1_serving"
