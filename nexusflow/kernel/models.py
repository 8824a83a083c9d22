"""Model bases that only stores can write (CONVENTIONS.md "Persistence").

``GuardedModel.save()``/``delete()`` and the queryset writers ``update()``,
``delete()``, ``bulk_create()``, ``bulk_update()``, ``get_or_create()`` and
``update_or_create()`` raise :class:`ImmutableRow`. A store inserts through :func:`insert` and
changes state only through :class:`nexusflow.kernel.store.CasStore`.

Every ``GuardedModel`` has a typed primary key (:class:`TypedIdField`): its
``id``, and every foreign key column pointing at it, read back as the model's
own id class (``Execution.Id``), see :mod:`nexusflow.kernel.ids`.
"""
from __future__ import annotations

import functools

from django.db import models

from .errors import ImmutableRow, InvalidIdentity
from .ids import TypedId, id_class_for, require_id
from .logs import current_trace_id
from .rows import row_shape
from .store_registry import load_all_stores


class _TypedIdConversion:
    """Read values as the field's ``id_class``; refuse another model's id in lookups, before SQL."""

    def from_db_value(self, value, expression, connection):
        return value if value is None else self.id_class(value)

    def to_python(self, value):
        if isinstance(value, TypedId) and type(value) is not self.id_class:
            raise InvalidIdentity(f"{self.model._meta.label}.{self.name}: expected a "
                                  f"{self.id_class.__name__}, got {value!r}")
        value = super().to_python(value)
        if value is None or isinstance(value, self.id_class):
            return value
        return self.id_class(value)

    def get_prep_value(self, value):
        if isinstance(value, TypedId) and self.id_class is not None and type(value) is not self.id_class:
            raise InvalidIdentity(f"{self.model._meta.label}.{self.name}: expected a "
                                  f"{self.id_class.__name__}, got {value!r}")
        return super().get_prep_value(value)


class TypedIdField(_TypedIdConversion, models.BigAutoField):
    """A ``BIGINT AUTO_INCREMENT`` primary key whose values are the model's id class.

    Values read from the database (the row's pk, and foreign key columns that
    target it, since Django applies the target field's converters to them) and
    values cleaned by :meth:`to_python` are ``<Model>Id`` instances. Lookups
    refuse an id of another model (``InvalidIdentity``) before SQL runs; the
    column and its bound parameters stay plain integers.

    Seed 003, "Identity rules".
    """

    description = "Typed big (8 byte) auto-incrementing primary key"
    id_class: type[TypedId] | None = None

    def contribute_to_class(self, cls, name, **kwargs):
        super().contribute_to_class(cls, name, **kwargs)
        if cls._meta.abstract:
            return
        self.id_class = id_class_for(cls)
        if "Id" not in cls.__dict__:
            cls.Id = self.id_class



class TypedIdReference(_TypedIdConversion, models.BigIntegerField):
    """A ``BIGINT`` column holding the typed id of a row another authority owns.

    For references that deliberately carry no database foreign key (the row
    lives in another authority's tables or in another database), e.g.
    ``TypedIdReference(to="flows.FlowRun")``. Reads return ``FlowRunId``;
    lookups, :func:`insert` and CAS fences/set fields refuse an id of another
    model before SQL. The column type is unchanged from ``BigIntegerField``.

    Seed 003, "Identity rules".
    """

    description = "Typed id of a row in another table (no database foreign key)"

    def __init__(self, *args, to: str, **kwargs):
        self.to = to
        super().__init__(*args, **kwargs)

    @property
    def id_class(self) -> type[TypedId]:
        return id_class_for(self.to)

    def deconstruct(self):
        name, path, args, kwargs = super().deconstruct()
        kwargs["to"] = self.to
        return name, path, args, kwargs



class GuardedQuerySet(models.QuerySet):
    """A queryset that reads but never writes: every ORM write path raises ImmutableRow."""

    def update(self, **kwargs):
        raise ImmutableRow(f"{self.model.__name__}: bulk update outside its store")

    def delete(self):
        raise ImmutableRow(f"{self.model.__name__}: delete outside its store")

    def bulk_create(self, *args, **kwargs):
        raise ImmutableRow(f"{self.model.__name__}: bulk_create outside its store")

    def bulk_update(self, *args, **kwargs):
        raise ImmutableRow(f"{self.model.__name__}: bulk_update outside its store")

    def get_or_create(self, *args, **kwargs):
        # May insert: a store inserts through ``insert`` after its own existence check.
        raise ImmutableRow(f"{self.model.__name__}: get_or_create outside its store")

    def update_or_create(self, *args, **kwargs):
        raise ImmutableRow(f"{self.model.__name__}: update_or_create outside its store")

    # The private writers Django's own helpers call (reverse-FK add/remove, Model.save's update path).
    def _update(self, values):
        raise ImmutableRow(f"{self.model.__name__}: update outside its store")

    def _raw_delete(self, using):
        raise ImmutableRow(f"{self.model.__name__}: delete outside its store")

    def _insert(self, objs, *args, **kwargs):
        # Reached by Model.save_base, also when called unbound (fixtures, deserializers):
        # only rows handed over by ``insert`` may pass.
        if not all(getattr(obj, "_nexus_store_insert", False) for obj in objs):
            raise ImmutableRow(f"{self.model.__name__}: insert outside its store")
        return super()._insert(objs, *args, **kwargs)


class GuardedModel(models.Model):
    """A row written only through its app's store, identified by a typed id."""

    id = TypedIdField(primary_key=True)

    objects = GuardedQuerySet.as_manager()

    class Meta:
        abstract = True
        # Django's internal writers (related managers, deletion) use the base
        # manager; it is the guarded one too.
        base_manager_name = "objects"

    def save(self, *args, **kwargs):
        if not (self._state.adding and getattr(self, "_nexus_store_insert", False)):
            raise ImmutableRow(f"{type(self).__name__}.save() outside its store")
        kwargs["force_insert"] = True
        super().save(*args, **kwargs)

    def save_base(self, *args, **kwargs):
        # save_base is what save(), fixtures and deserializers reach: guard it too.
        if not (self._state.adding and getattr(self, "_nexus_store_insert", False)):
            raise ImmutableRow(f"{type(self).__name__}.save_base() outside its store")
        try:
            super().save_base(*args, **kwargs)
        finally:
            self._nexus_store_insert = False

    def delete(self, *args, **kwargs):
        raise ImmutableRow(f"{type(self).__name__}.delete() is not allowed")


def typed_id_fields(model_cls) -> list[tuple[models.Field, type[TypedId]]]:
    """List ``(field, id class)`` for the model's columns that hold a typed id.

    That is its own ``TypedIdField`` primary key, every concrete foreign key
    whose target is one, and every :class:`TypedIdReference`.
    ``field.attname``/``field.column`` name the column.
    """
    out = []
    for field in model_cls._meta.concrete_fields:
        target = field.target_field if field.is_relation else field
        if isinstance(target, TypedIdField) and target.id_class is not None:
            out.append((field, target.id_class))
        elif isinstance(field, TypedIdReference):
            out.append((field, field.id_class))
    return out


@functools.cache
def _insert_checks(model_cls) -> tuple[tuple[models.Field, ...], tuple[tuple[models.Field, type[TypedId]], ...]]:
    """The columns :func:`insert` canonicalises (identity fields) and checks (typed ids) for one model, found once
    per process (a model's fields do not change while it runs)."""
    from .identity import IdentityField

    return (tuple(f for f in model_cls._meta.concrete_fields if isinstance(f, IdentityField)),
            tuple(typed_id_fields(model_cls)))


def insert(model_cls, *, allow_any_state: bool = False, **values):
    """Insert one row of a :class:`GuardedModel` and return it.

    Args:
        model_cls: the GuardedModel class.
        allow_any_state: insert a stateful row in a non-initial state; only
            test fixtures that build rows in a chosen state pass it (a
            guardrail test keeps it out of application code).
        values: field values; foreign keys may be given as related objects or
            as ``<field>_id`` values.

    Returns:
        The saved instance: its ``pk`` and every foreign key ``<field>_id``
        hold the target model's typed id.

    Raises:
        InvalidIdentity: a foreign key, a typed reference or an explicit
            ``id`` was given an id of another model, a bool or a non-positive
            int; a parent row object of another org; or an identity column
            (:class:`IdentityField`) holds a
            non-canonical key (surrounding whitespace, control characters,
            invalid UTF-8, not NFC, over-length, or empty/null where the column
            does not allow it). All before SQL.
        IllegalTransition: a stateful row in a state that is not initial for
            its machine (unless ``allow_any_state``).
        ReasonRequired / UnknownReasonCode: a reason-required state without a
            registered ``reason_code``, or an unregistered code.
        ImmutableRow: ``model_cls`` is not written this way.

    Seed 003, "Identity rules": keys are validated before insert, then
    compared byte for byte.
    """
    store = load_all_stores().get(f"{model_cls._meta.app_label}.{model_cls.__name__}")
    obj = model_cls(**values)
    org_id = getattr(obj, "org_id", None)
    for name, value in values.items():
        # A parent row handed over as an object must belong to the same org (trusted scope).
        parent_org = getattr(value, "org_id", None) if isinstance(value, models.Model) else None
        if org_id is not None and parent_org is not None and parent_org != org_id:
            raise InvalidIdentity(f"{model_cls.__name__}.{name}: parent row of org {parent_org!r}, "
                                  f"not {org_id!r}")
    if store is not None:
        # The state the row will really have: the given one or the column default.
        if not allow_any_state:
            store.machine.assert_initial(obj.state)
        store.assert_reason(obj.state, {"reason_code": getattr(obj, "reason_code", "")})
    identity_fields, typed_fields = _insert_checks(model_cls)
    for field in identity_fields:
        # bytes are decoded here: what is stored is exactly the validated text.
        setattr(obj, field.attname, field.canonical(getattr(obj, field.attname)))
    for field, id_cls in typed_fields:
        value = getattr(obj, field.attname)
        if value is not None:
            setattr(obj, field.attname, require_id(value, id_cls, field=f"{model_cls.__name__}.{field.attname}"))
    if "trace_id" not in values and _traced(model_cls):
        obj.trace_id = current_trace_id()  # the admitting request's or the durable work's trace (logs.py)
    using = model_cls.objects.db
    meta = model_cls._meta
    if meta.parents or meta.proxy or obj.pk is not None:
        obj._nexus_store_insert = True
        obj.save(using=using)
    else:
        # One INSERT built once per model (nexusflow.kernel.rows): what save(force_insert=True) sends, no
        # insert query compiled per row.
        row_shape(model_cls, using).insert(obj)
    return obj


def trace_id_field():
    """The ``trace_id`` column of a row that starts or carries durable work (a receipt, an execution, a Flow
    run, an intent, a remote effect): the W3C trace id (32 hex) of the request or durable work that inserted
    it, set by :func:`insert` (:func:`nexusflow.kernel.logs.current_trace_id`), so the workers that later run
    it log under the same trace; empty when none was open."""
    from .identity import IdentityField

    return IdentityField(max_length=32, blank=True, default="", help_text="W3C trace id of the work that "
                         "inserted this row (correlation only; empty: none).")


@functools.cache
def _traced(model_cls) -> bool:
    return any(f.name == "trace_id" for f in model_cls._meta.concrete_fields)


def reason_code_field():
    """The ``reason_code`` column: a registered code from ``<app>/reasons.py``, or empty."""
    return models.CharField(max_length=64, blank=True, default="",
                            help_text="Closed reason code (see the owning app's reasons.py); empty unless halted.")


def reason_code_constraint(machine, *, name: str) -> models.CheckConstraint:
    """A CHECK that rows in ``machine.reason_required`` states carry a non-empty ``reason_code``.

    Args:
        machine: the model's :class:`nexusflow.kernel.transitions.StateMachine`.
        name: the constraint name (unique in the database).

    Seed 003, "Operational liveness and maintenance admission".
    """
    return models.CheckConstraint(
        condition=~models.Q(state__in=sorted(machine.reason_required)) | ~models.Q(reason_code=""), name=name)
