"""Rows read and inserted by SQL built once per model (nexusflow/kernel/rows.py) are the ORM's rows.

For every stored machine: a row inserted by ``insert`` (the built INSERT) reads back through the ORM with the
same values, and the stores' locking reads and ``first_row`` return instances equal, column by column and type
by type, to what a queryset returns; read with its foreign keys followed (``fetch_joined``, up to three deep),
it and every related row equal what ``select_related`` returns. Filters the built SQL does not cover go through the ORM, and bad values are
refused before SQL as a lookup refuses them.
"""
import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from nexusflow.kernel.errors import InvalidIdentity
from nexusflow.kernel.rows import (
    every_row,
    fetch_joined,
    first_row,
    get_joined,
    get_row,
    row_exists,
    row_max,
    row_shape,
)
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
    assert row_exists(model, pk=row.pk, org_id=ORG) and not row_exists(model, pk=row.pk, org_id="another-org")
    assert row_exists(model, pk__gte=row.pk, org_id=ORG)  # a lookup: the ORM's exists()
    assert [_values(r) for r in every_row(model, org_id=ORG, pk__in=[row.pk])] == [_values(orm)]  # built IN
    assert row_max(model, "version", org_id=ORG, pk=row.pk) == orm.version
    assert row_max(model, "id", org_id=ORG, pk=row.pk) == orm.pk and type(row_max(model, "id", pk=row.pk)) is type(orm.pk)
    assert row_max(model, "version", org_id="another-org") is None
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
    assert shape.where({"pk__gte": row.pk}) is None  # a lookup
    assert shape.where({"pk__in": row.pk}) is None  # ``__in`` one value, not a list: the ORM's to refuse
    assert shape.where({"org_id": None}) is None  # IS NULL, not "= NULL"
    assert shape.where({"no_such_column": 1}) is None
    # ...and the ORM answers them as it always did.
    assert first_row(store.model, pk__gte=row.pk).pk == row.pk
    assert every_row(store.model, org_id=ORG, pk__gte=row.pk)[0].pk == row.pk
    # ``__in`` a list is built, and an empty one matches nothing.
    assert shape.where({"pk__in": [row.pk, row.pk + 1]}) == ("`id` IN (%s, %s)", [row.pk, row.pk + 1])
    assert every_row(store.model, org_id=ORG, pk__in=[]) == []


def _forward_paths(model, depth: int = 3, prefix: str = "", seen: tuple = ()) -> list[str]:
    """Every chain of forward foreign keys from ``model``, up to ``depth`` long, never back into a model on it."""
    out = []
    for field in model._meta.concrete_fields:
        if not (field.many_to_one or field.one_to_one) or field.related_model in seen or field.related_model is model:
            continue
        path = f"{prefix}{field.name}"
        out.append(path)
        if depth > 1:
            out += _forward_paths(field.related_model, depth - 1, f"{path}__", (*seen, model))
    return out


def _followed(instance, path: str):
    """The instances along ``path`` from ``instance`` as cached or read (``None`` past a null key)."""
    out = []
    for name in path.split("__"):
        instance = None if instance is None else getattr(instance, name)
        out.append(None if instance is None else _values(instance))
    return out


@pytest.mark.parametrize("store", _stores(), ids=lambda store: store.machine.name)
def test_every_store_reads_its_related_rows_as_select_related_does(store):
    row = rows.RowBuilder(ORG).row(store, sorted(store.machine.initial)[0])
    model = store.model
    paths = _forward_paths(model)  # none for a model without a foreign key: the model alone, below
    for path in paths:
        orm = model.objects.select_related(path).get(pk=row.pk)
        with CaptureQueriesContext(connection) as queries:
            [built] = fetch_joined(model, [path], {"pk": row.pk, "org_id": ORG})
            followed = _followed(built, path)  # cached by the one read: no query
        assert len(queries.captured_queries) == 1, (path, queries.captured_queries)
        assert _values(built) == _values(orm) and followed == _followed(orm, path), path
    assert _values(get_joined(model, paths, pk=row.pk)) == _values(row)
    assert [_values(r) for r in fetch_joined(model, paths, {"org_id": ORG, "pk": row.pk})] == [_values(row)]


def test_joined_reads_filter_on_related_columns_and_refuse_as_the_orm():
    store = next(s for s in _stores() if s.model.__name__ == "RemoteEffect")
    effect = rows.RowBuilder(ORG).row(store, "prepared")
    command = effect.command
    assert get_joined(store.model, ["command"], org_id=ORG, command__idempotency_key=command.idempotency_key
                      ).pk == effect.pk
    assert fetch_joined(store.model, ["command"], {"org_id": ORG, "command__idempotency_key": "no-such-key"}) == []
    with pytest.raises(store.model.DoesNotExist):
        get_joined(store.model, ["command"], org_id="another-org", pk=effect.pk)
    second = rows.RowBuilder(ORG).row(store, "prepared")
    with pytest.raises(store.model.MultipleObjectsReturned):
        get_joined(store.model, ["command"], org_id=ORG, state="prepared")
    [first] = fetch_joined(store.model, ["command"], {"org_id": ORG, "state": "prepared"}, order="T0.`id`", limit=1)
    assert first.pk == min(effect.pk, second.pk)
    with pytest.raises(InvalidIdentity):
        fetch_joined(store.model, ["command"], {"org_id": " padded"})
    with pytest.raises(ValueError):
        fetch_joined(store.model, ["attempts"], {"pk": effect.pk})  # a reverse relation is not followed here
    # ``__in`` a list is built; an empty one matches nothing; any other lookup goes through the ORM.
    assert [e.pk for e in fetch_joined(store.model, ["command"], {"pk__in": [second.pk, effect.pk]},
                                       order="T0.`id`")] == sorted([effect.pk, second.pk])
    assert fetch_joined(store.model, ["command"], {"org_id": ORG, "state__in": ()}) == []
    assert fetch_joined(store.model, ["command"], {"pk__gt": effect.pk}) is None
    assert get_joined(store.model, ["command"], org_id=ORG, pk__gt=effect.pk).pk == second.pk  # the ORM's
    with pytest.raises(InvalidIdentity):
        fetch_joined(store.model, ["command"], {"org_id__in": [ORG, "nul\x00"]})


def test_the_due_outbox_message_is_the_one_the_orm_query_names():
    import datetime as dt

    from nexusflow.kernel.clock import db_now
    from runtime_outbox.models import OutboxMessage
    from runtime_outbox.selectors import outbox_message_due

    store = next(s for s in _stores() if s.model is OutboxMessage)
    now = db_now()
    builder = rows.RowBuilder(ORG)
    made = {}
    for label, state, due in [("null", "pending", None), ("past", "pending", now - dt.timedelta(seconds=5)),
                              ("early", "pending", now - dt.timedelta(seconds=9)),
                              ("future", "pending", now + dt.timedelta(seconds=30)),
                              ("reconciling", "reconciling", now - dt.timedelta(seconds=1))]:
        row = builder.row(store, state)
        with transaction.atomic():
            store.touch(org_id=ORG, pk=row.pk, state=state, version=row.version, set_fields={"next_attempt_at": due})
        made[label] = row.pk

    def orm(state, at):
        return (OutboxMessage.objects.filter(state=state).exclude(next_attempt_at__gt=at)
                .order_by("next_attempt_at", "id").first())

    for at in (now - dt.timedelta(seconds=60), now, now + dt.timedelta(seconds=60)):
        for state in ("pending", "reconciling", "delivered"):
            built, expected = outbox_message_due(state=state, now=at), orm(state, at)
            assert (built and _values(built)) == (expected and _values(expected)), (state, at)
    assert outbox_message_due(state="pending", now=now).pk == made["null"]  # unset sorts first, as the ORM's
    with transaction.atomic():
        first = store.lock(ORG, made["null"])
        store.transition(org_id=ORG, pk=first.pk, src="pending", dst="delivered", version=first.version,
                         set_fields={"delivered_at": now})
    assert outbox_message_due(state="pending", now=now).pk == made["early"]


def test_the_wake_candidates_are_the_ones_the_orm_query_names():
    from django.db.models import Exists, OuterRef

    from nexusflow.flows import transitions as t
    from nexusflow.flows.models import FlowDependency, FlowWakeSignal
    from nexusflow.flows.selectors import flow_wake_candidates
    from nexusflow.kernel.clock import db_now
    from nexusflow.kernel.models import insert
    from nexusflow.kernel.scope import OrgScope
    from tests.flows.rows import Rows

    made = Rows(OrgScope(ORG))
    versions = iter(range(1, 100))

    def signal_for(dependency, *, key=None, state=t.SIGNAL_UNMATCHED, **scope):
        run = dependency.run
        return insert(FlowWakeSignal, allow_any_state=True, org_id=ORG,
                      app_installation_id=scope.get("app_installation_id", run.app_installation_id),
                      runtime_capability_id=run.runtime_capability_id,
                      binding_digest=scope.get("binding_digest", run.binding_digest), flow_run_id=run.pk,
                      producer_kind=dependency.producer_kind, dependency_key=key or dependency.dependency_key,
                      receipt_id=7, evidence_digest="d" * 64, state=state, version=1, received_at=db_now(),
                      wake_version=next(versions))

    waiting, satisfied = made.dependency(t.DEP_WAITING), made.dependency(t.DEP_SATISFIED)
    expected = [signal_for(waiting), signal_for(waiting)]
    signal_for(waiting, key="43")  # another key of the run
    signal_for(waiting, state=t.SIGNAL_CONSUMED)
    signal_for(waiting, binding_digest="e" * 64)  # another work scope
    signal_for(satisfied)  # its dependency no longer waits
    orm = FlowWakeSignal.objects.filter(state=t.SIGNAL_UNMATCHED).filter(Exists(FlowDependency.objects.filter(
        org_id=OuterRef("org_id"), app_installation_id=OuterRef("app_installation_id"),
        runtime_capability_id=OuterRef("runtime_capability_id"), binding_digest=OuterRef("binding_digest"),
        run_id=OuterRef("flow_run_id"), dependency_key=OuterRef("dependency_key"), state=t.DEP_WAITING))).order_by("id")
    assert [_values(s) for s in flow_wake_candidates(limit=10)] == [_values(s) for s in orm] \
        == [_values(FlowWakeSignal.objects.get(pk=s.pk)) for s in expected]
    assert [s.pk for s in flow_wake_candidates(limit=1)] == [expected[0].pk]


def test_get_row_is_the_orms_get_locked_or_not():
    import MySQLdb
    from django.db import OperationalError

    store = _stores()[0]
    model = store.model
    builder = rows.RowBuilder(ORG)
    first = builder.row(store, sorted(store.machine.initial)[0])
    second = builder.row(store, first.state)
    assert _values(get_row(model, {"org_id": ORG, "pk": first.pk})) == _values(model.objects.get(pk=first.pk))
    with pytest.raises(model.DoesNotExist):
        get_row(model, {"org_id": "another-org", "pk": first.pk})
    with pytest.raises(model.MultipleObjectsReturned):
        get_row(model, {"org_id": ORG, "state": first.state})
    assert get_row(model, {"org_id": ORG, "pk__in": [second.pk]}).pk == second.pk
    assert get_row(model, {"org_id": ORG, "pk__gte": second.pk}).pk == second.pk  # the ORM's lookup
    settings = connection.settings_dict
    other = MySQLdb.connect(host=settings["HOST"], port=int(settings["PORT"] or 3306), user=settings["USER"],
                            password=settings["PASSWORD"], database=settings["NAME"])
    try:
        held = other.cursor()
        held.execute("START TRANSACTION")
        held.execute(f"SELECT id FROM `{model._meta.db_table}` WHERE id = %s FOR UPDATE", [int(first.pk)])
        with transaction.atomic():
            assert get_row(model, {"org_id": ORG, "pk": second.pk}, lock="update_nowait").pk == second.pk
            with pytest.raises(OperationalError):
                get_row(model, {"org_id": ORG, "pk": first.pk}, lock="update_nowait")
        held.execute("ROLLBACK")
        with transaction.atomic():
            assert get_row(model, {"org_id": ORG, "pk": first.pk}, lock="update").pk == first.pk
    finally:
        other.close()


def test_the_waiting_path_runs_of_a_record_are_the_ones_the_orm_query_names():
    from nexusflow.flows import transitions as t
    from nexusflow.flows.models import FlowRun
    from nexusflow.flows.selectors import flow_path_runs_waiting
    from nexusflow.flows.services.wait_resolution import IMMEDIATE_PATH
    from nexusflow.kernel.clock import db_now
    from nexusflow.kernel.models import insert
    from nexusflow.kernel.scope import OrgScope
    from tests.flows.conftest import OBJECT
    from tests.flows.rows import Rows

    plan = Rows(OrgScope(ORG)).plan

    def run(state, version, path, key="rk-1"):
        now = db_now()
        return insert(
            FlowRun, allow_any_state=True, org_id=ORG, app_installation_id=plan.app_installation_id,
            runtime_capability_id=plan.runtime_capability_id, binding_digest=plan.runtime_work_binding_digest,
            plan=plan, plan_digest=plan.plan_digest, execution_profile=plan.execution_profile,
            execution_owner="flow_runtime_v2", state=state, version=1, trigger_object_name=OBJECT, record_key=key,
            record_version=version, created_at=now, updated_at=now, entry_path=path,
            legacy_status=t.legacy_status_of(state))

    expected = [run(t.RUN_WAITING, 1, "Later"), run(t.RUN_WAITING, 2, "Soon")]
    run(t.RUN_WAITING, 3, "Later")  # admitted by the save judged, not an older one
    run(t.RUN_WAITING, 1, IMMEDIATE_PATH)
    run(t.RUN_RUNNABLE, 1, "Other")
    run(t.RUN_WAITING, 1, "Later", key="rk-2")
    built = flow_path_runs_waiting(org_id=ORG, object_name=OBJECT, record_key="rk-1", version_below=3,
                                   immediate_path=IMMEDIATE_PATH)
    orm = (FlowRun.objects.filter(org_id=ORG, trigger_object_name=OBJECT, record_key="rk-1", state=t.RUN_WAITING,
                                  record_version__lt=3).exclude(entry_path=IMMEDIATE_PATH).order_by("id"))
    assert [_values(r) for r in built] == [_values(r) for r in orm] == \
        [_values(FlowRun.objects.get(pk=r.pk)) for r in expected]
