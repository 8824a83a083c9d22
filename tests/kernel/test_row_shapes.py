"""Rows read and inserted by SQL built once per model (nexusflow/kernel/rows.py) are the ORM's rows.

For every stored machine: a row inserted by ``insert`` (the built INSERT) reads back through the ORM with the
same values, and the stores' locking reads and ``first_row`` return instances equal, column by column and type
by type, to what a queryset returns. Filters the built SQL does not cover go through the ORM, and bad values are
refused before SQL as a lookup refuses them.
"""
import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from nexusflow.kernel.errors import InvalidIdentity
from nexusflow.kernel.rows import every_row, first_row, row_shape
from nexusflow.kernel.store import STORES, load_all_stores
from tests.kernel import rows

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

ORG = "row-shapes-org"


def _values(instance) -> list[tuple[str, object, type]]:
    return [(f.attname, getattr(instance, f.attname), type(getattr(instance, f.attname)))
            for f in type(instance)._meta.concrete_fields]


def _stores():
    load_all_stores()
    return sorted(STORES.values(), key=lambda store: store.machine.name)


@pytest.mark.parametrize("store", _stores(), ids=lambda store: store.machine.name)
def test_every_store_reads_and_inserts_the_rows_the_orm_would(store):
    state = sorted(store.machine.initial)[0]
    row = rows.RowBuilder(ORG).row(store, state)
    model = store.model
    assert isinstance(row.pk, model.Id) and row._state.adding is False
    orm = model.objects.get(pk=row.pk)
    # What insert kept on the instance is what the database holds (auto_now stamps, defaults, typed keys).
    assert _values(row) == _values(orm)
    with transaction.atomic(using=store.db()):
        locked = store.lock(ORG, row.pk)
        assert _values(locked) == _values(orm)
        locked_clock, now = store.lock_at_clock(ORG, row.pk)
        assert _values(locked_clock) == _values(orm) and now.tzinfo is not None
        assert [_values(r) for r in store.lock_many(ORG, [row.pk])] == [_values(orm)]
        assert [_values(r) for r in store.lock_all(ORG, id=row.pk)] == [_values(orm)]
        assert _values(store.lock_where(ORG, id=row.pk)) == _values(orm)
    with transaction.atomic(using=store.db()):
        assert _values(store.lock_shared(ORG, row.pk)) == _values(orm)
    assert _values(first_row(model, pk=row.pk, org_id=ORG)) == _values(orm)
    assert [_values(r) for r in every_row(model, org_id=ORG, state=orm.state, pk=row.pk)] == [_values(orm)]


def test_a_missing_row_is_refused_as_the_orm_refuses_it():
    store = _stores()[0]
    row = rows.RowBuilder(ORG).row(store, sorted(store.machine.initial)[0])
    with transaction.atomic(), pytest.raises(store.model.DoesNotExist):
        store.lock("another-org", row.pk)
    with transaction.atomic(), pytest.raises(store.model.DoesNotExist):
        store.lock_shared("another-org", row.pk)
    assert first_row(store.model, org_id="another-org", pk=row.pk) is None
    with transaction.atomic():
        assert store.lock_many("another-org", [row.pk]) == []


@pytest.mark.parametrize("org_id", [" padded", "", "nul\x00"])
def test_a_non_canonical_key_is_refused_before_sql(org_id):
    store = _stores()[0]
    with CaptureQueriesContext(connection) as queries:
        with pytest.raises(InvalidIdentity):
            first_row(store.model, org_id=org_id, pk=1)
        with transaction.atomic(), pytest.raises(InvalidIdentity):
            store.lock(org_id, 1)
    assert not [q for q in queries.captured_queries if store.model._meta.db_table in q["sql"]]


def test_filters_the_built_sql_does_not_cover_go_through_the_orm():
    store = _stores()[0]
    shape = row_shape(store.model)
    row = rows.RowBuilder(ORG).row(store, sorted(store.machine.initial)[0])
    assert shape.where({"pk__in": [row.pk]}) is None  # a lookup
    assert shape.where({"org_id": None}) is None  # IS NULL, not "= NULL"
    assert shape.where({"no_such_column": 1}) is None
    # ...and the ORM answers them as it always did.
    assert first_row(store.model, pk__in=[row.pk]).pk == row.pk
    assert every_row(store.model, org_id=ORG, pk__in=[row.pk])[0].pk == row.pk
