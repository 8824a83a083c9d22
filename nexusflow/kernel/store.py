"""The compare-and-swap store base (ARCHITECTURE.md section 6, "State changes").

Every state change is one ``UPDATE ... SET state, version=version+1 ...
WHERE id AND org_id AND state AND version [AND fences]`` whose rowcount is
checked. Transition rules are checked first, before any SQL.
"""
from __future__ import annotations

import datetime as dt
from typing import Any

from django.db import connections, router

from . import locks, reasons
from .clock import db_now_sql
from .errors import IllegalTransition, MultipleRowsUpdated, ReasonRequired, StaleVersion
from .identity import validate_key
from .ids import require_id, sql_param
from .models import insert, typed_id_fields
from .rows import fetch_where, row_shape
from .store_registry import STORES, load_all_stores, register_store  # noqa: F401 (read here by commands and tests)
from .transitions import StateMachine


def _aware(value: dt.datetime) -> dt.datetime:
    """A clock value read as an extra column (the driver's naive UTC ``datetime``) as aware UTC."""
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)


class CasStore:
    """Persistence for one stateful model.

    Subclasses set ``model`` (a GuardedModel with ``id``, ``org_id``,
    ``state`` and ``version`` columns), ``machine`` and ``lock_class``.
    A subclass that sets both ``model`` and ``machine`` is registered in
    :data:`nexusflow.kernel.store_registry.STORES`; a second store for the same
    machine is refused.

    Every method that takes a row id takes it typed: ``pk`` must be the
    model's own id (``model.Id``) or a plain ``int`` from a boundary; an id
    of another model raises :class:`InvalidIdentity` before any SQL (seed 003
    "Identity rules"). Fences and set fields on foreign key columns are
    checked the same way.
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "model" in cls.__dict__ and "machine" in cls.__dict__:
            register_store(cls)

    model: Any
    machine: StateMachine
    lock_class: locks.LockClass
    #: Position inside the lock class's own sub-order; ``lock_label`` names it in errors.
    lock_rank: int = 0
    lock_label: str = ""
    stale_error: type[StaleVersion] = StaleVersion

    # --- reads that lock -------------------------------------------------
    @classmethod
    def _note(cls, org_id: str | None = None, pk: int | None = None, *, nowait: bool = False) -> None:
        """Record this store's lock position (and the row's key when one row is locked): :func:`locks.note`."""
        locks.note(cls.lock_class, cls.db(), rank=cls.lock_rank, label=cls.lock_label,
                   key=None if pk is None else (org_id, int(pk)), nowait=nowait)

    @classmethod
    def _noted_id(cls, org_id: str, pk: int, *, nowait: bool = False) -> int:
        """``pk`` checked as this model's id (:class:`InvalidIdentity` before SQL), its lock noted; the int."""
        pk = int(require_id(pk, cls.model, field=f"{cls.model.__name__} pk"))
        cls._note(org_id, pk, nowait=nowait)
        return pk

    @classmethod
    def _noted_ids(cls, org_id: str, pks) -> list[int]:
        """``pks`` checked as this model's ids, sorted ascending (the key order inside one lock position), the
        lowest noted against what is held and then the highest as held; ``[]`` notes nothing."""
        ids = sorted({int(require_id(pk, cls.model, field=f"{cls.model.__name__} pk")) for pk in pks})
        for pk in (ids[:1] + ids[-1:]):
            cls._note(org_id, pk)
        return ids

    @classmethod
    def _fetch(cls, filters: dict[str, Any], **read) -> list | None:
        """This model's rows matching equality ``filters`` on its write database (``read``: the ``order``,
        ``limit``, ``suffix`` and ``extra`` of :func:`nexusflow.kernel.rows.fetch_where`); ``None`` means the
        caller reads through the ORM."""
        return fetch_where(cls.model, filters, alias=cls.db(), **read)

    @classmethod
    def _one(cls, rows: list, filters: dict[str, Any]):
        if not rows:
            raise cls.model.DoesNotExist(f"{cls.model.__name__} matching {sorted(filters)} does not exist")
        if len(rows) > 1:
            raise cls.model.MultipleObjectsReturned(f"more than one {cls.model.__name__} matches {sorted(filters)}")
        return rows[0]

    @staticmethod
    def _for_update(*, nowait: bool = False, skip_locked: bool = False) -> str:
        return " FOR UPDATE" + (" NOWAIT" if nowait else "") + (" SKIP LOCKED" if skip_locked else "")

    @classmethod
    def lock(cls, org_id: str, pk: int, *, nowait: bool = False):
        """Lock and return one row by ``(org_id, id)``.

        Args:
            pk: the row's ``model.Id`` (or a plain positive ``int``).

        Raises:
            InvalidIdentity: ``pk`` is an id of another model, a bool or not a
                positive int (before SQL).
            Model.DoesNotExist: no such row in that org.
            django.db.OperationalError: ``nowait`` and the row is locked.
        """
        pk = cls._noted_id(org_id, pk, nowait=nowait)
        filters = {"id": pk, "org_id": org_id}
        rows = cls._fetch(filters, suffix=cls._for_update(nowait=nowait))
        if rows is None:
            return cls.model.objects.select_for_update(nowait=nowait).get(org_id=org_id, pk=pk)
        return cls._one(rows, filters)

    @classmethod
    def lock_shared(cls, org_id: str, pk: int):
        """Share-lock and return one row by ``(org_id, id)`` (``LOCK IN SHARE MODE``) until the transaction ends.

        The reader's half of a readers-writer fence: share-lockers of one row run side by side, a writer's
        :meth:`lock` (``FOR UPDATE``) waits for every share-locker already past this read, and a share-lock
        asked for while a writer waits queues behind it (InnoDB grants in order), so a writer is not starved.
        A transaction that share-locked a row must not lock it ``FOR UPDATE`` later (two such readers would
        deadlock on the upgrade). Position in the lock order: as :meth:`lock`.

        Raises:
            InvalidIdentity: as :meth:`lock` (before SQL).
            Model.DoesNotExist: no such row in that org.
        """
        pk = cls._noted_id(org_id, pk)
        return cls._share_locked_one(id=pk, org_id=org_id)

    @classmethod
    def lock_where_shared(cls, org_id: str, **filters):
        """Share-lock and return the one row of ``org_id`` matching ``filters`` (a unique key); see :meth:`lock_shared`.

        Raises:
            Model.DoesNotExist / MultipleObjectsReturned: as ``QuerySet.get``.
            LockOrderViolation: taken after a higher position (mode ``raise``).
        """
        cls._note()
        row = cls._share_locked_one(org_id=org_id, **filters)
        cls._note(org_id, row.pk)
        return row

    @classmethod
    def _share_locked_one(cls, **filters):
        """The one row matching ``filters``, read ``LOCK IN SHARE MODE`` (Django has no share-mode queryset)."""
        rows = cls._fetch(filters, limit=2, suffix=" LOCK IN SHARE MODE")
        if rows is None:
            sql, params = cls.model.objects.using(cls.db()).filter(**filters)[:2].query.sql_with_params()
            rows = list(cls.model.objects.db_manager(cls.db()).raw(f"{sql} LOCK IN SHARE MODE", params))
        return cls._one(rows, filters)

    @classmethod
    def lock_at_clock(cls, org_id: str, pk: int) -> tuple[Any, dt.datetime]:
        """Lock one row like :meth:`lock` and read the database clock in the same statement.

        Returns:
            ``(row, now)``: ``now`` is ``UTC_TIMESTAMP(6)`` of that statement (aware UTC), what
            :func:`nexusflow.kernel.clock.db_now` right before the lock would have read, one round trip fewer.

        Raises:
            as :meth:`lock`.
        """
        pk = cls._noted_id(org_id, pk)
        clock = db_now_sql()
        filters = {"id": pk, "org_id": org_id}
        rows = cls._fetch(filters, suffix=cls._for_update(), extra=f", ({clock.sql}) AS `db_clock_at_lock`",
                          extra_params=tuple(clock.params))
        if rows is None:
            row = cls.model.objects.select_for_update().annotate(db_clock_at_lock=clock).get(org_id=org_id, pk=pk)
            return row, row.db_clock_at_lock
        row, (now,) = cls._one(rows, filters)
        return row, _aware(now)

    @classmethod
    def lock_many(cls, org_id: str, pks, *, skip_locked: bool = False) -> list:
        """Lock the rows ``pks`` of ``org_id`` in one statement, in ascending id order (the canonical key order
        inside one lock position, as in :meth:`lock_all`).

        With ``skip_locked`` (``FOR UPDATE SKIP LOCKED``) a row another transaction holds is left out instead
        of waited for; a missing row (or one of another org) is left out too.

        Raises:
            InvalidIdentity: an id of another model or not a positive int (before SQL).
            LockOrderViolation: taken after a higher position (mode ``raise``).
        """
        ids = cls._noted_ids(org_id, pks)
        if not ids:
            return []
        return [row for row, _ in cls._many(org_id, ids, suffix=cls._for_update(skip_locked=skip_locked))]

    @classmethod
    def lock_many_at_clock(cls, org_id: str, pks, *, skip_locked: bool = False):
        """Lock the rows ``pks`` like :meth:`lock_many` and read the database clock in the same statement.

        Returns:
            ``(rows, now)``: ``now`` is the clock of :func:`nexusflow.kernel.clock.db_now_sql` (aware UTC),
            ``None`` when no row was locked (nothing to stamp).

        Raises:
            as :meth:`lock_many`.
        """
        ids = cls._noted_ids(org_id, pks)
        if not ids:
            return [], None
        clock = db_now_sql()
        rows = cls._many(org_id, ids, suffix=cls._for_update(skip_locked=skip_locked),
                         extra=f", ({clock.sql}) AS `db_clock_at_lock`", extra_params=tuple(clock.params))
        if not rows:
            return [], None
        return [row for row, _ in rows], _aware(rows[0][1][0])

    @classmethod
    def _many(cls, org_id: str, ids: list[int], *, suffix: str, extra: str = "", extra_params: tuple = ()) -> list:
        """``[(row, extras)]`` of ``org_id`` with id in ``ids`` (checked ints), ascending id, read with ``suffix``."""
        shape = row_shape(cls.model, cls.db())
        built = shape.where({"org_id": org_id})
        if built is None:  # no org: no row
            return []
        org_sql, org_params = built
        marks = ", ".join(["%s"] * len(ids))
        sql = shape.select_sql(f"{org_sql} AND `id` IN ({marks})", extra=extra, suffix=f" ORDER BY `id`{suffix}")
        rows = shape.fetch(sql, [*extra_params, *org_params, *ids], extra_columns=1 if extra else 0)
        return rows if extra else [(row, ()) for row in rows]

    @classmethod
    def lock_where(cls, org_id: str, *, nowait: bool = False, **filters):
        """Lock and return the one row of ``org_id`` matching ``filters`` (a unique key).

        Raises:
            Model.DoesNotExist / MultipleObjectsReturned: as ``QuerySet.get``.
            django.db.OperationalError: ``nowait`` and the row is locked.
            LockOrderViolation: taken after a higher position (mode ``raise``).
        """
        cls._note()
        where = {"org_id": org_id, **filters}
        rows = cls._fetch(where, suffix=cls._for_update(nowait=nowait))
        if rows is None:
            row = cls.model.objects.select_for_update(nowait=nowait).get(org_id=org_id, **filters)
        else:
            row = cls._one(rows, where)
        # The key is known only now: check it against rows of this kind already held.
        cls._note(org_id, row.pk)
        return row

    @classmethod
    def lock_all(cls, org_id: str, **filters) -> list:
        """Lock and return every row of ``org_id`` matching ``filters``, in ascending id order.

        Ascending id is the canonical key order inside one lock position, so
        two transactions locking overlapping sets never wait on each other in
        reverse.

        Raises:
            LockOrderViolation: taken after a higher position (mode ``raise``).
        """
        cls._note()
        rows = cls._fetch({"org_id": org_id, **filters}, order="`id`", suffix=cls._for_update())
        if rows is None:
            rows = list(cls.model.objects.select_for_update().filter(org_id=org_id, **filters).order_by("id"))
        for row in rows[:1] + rows[-1:]:  # the lowest key against what is held, then the highest is held
            cls._note(org_id, row.pk)
        return rows

    @classmethod
    def db(cls) -> str:
        return router.db_for_write(cls.model)

    # --- writes ----------------------------------------------------------
    @classmethod
    def create(cls, **values):
        """Insert a row in one of the machine's initial states.

        Raises:
            IllegalTransition: not an initial state.
            ReasonRequired / UnknownReasonCode: see :meth:`assert_reason`.
        """
        cls.machine.assert_initial(values["state"])
        cls.assert_reason(values["state"], values)
        values.setdefault("version", 1)
        return insert(cls.model, **values)

    @classmethod
    def transition(
        cls,
        *,
        org_id: str,
        pk: int,
        src: str,
        dst: str,
        version: int,
        fences: dict[str, Any] | None = None,
        set_fields: dict[str, Any] | None = None,
    ) -> int:
        """Move one row ``src -> dst`` if it still has ``version`` and ``fences``.

        Args:
            pk: the row's ``model.Id`` (or a plain positive ``int``).
            fences: extra ``column: expected value`` pairs compared in WHERE.
            set_fields: extra ``column: new value`` pairs written with the state.
                Leaving a reason-required state for one that is not clears
                ``reason_code`` unless ``set_fields`` sets it.

        Returns:
            The new version (``version + 1``).

        Raises:
            InvalidIdentity: ``pk``, or a fence/set value on a foreign key
                column, is an id of another model or not a positive int
                (before SQL).
            IllegalTransition: the pair is not listed (before SQL).
            ValueError: ``version`` is not an int, or ``set_fields`` /
                ``fences`` name an unknown column or one the CAS owns
                (``id``, ``org_id``, ``state``, ``version``) (before SQL).
            ReasonRequired / UnknownReasonCode: see :meth:`assert_reason` (before SQL).
            StaleVersion (or ``stale_error``): no row matched.
            MultipleRowsUpdated: more than one row matched.
        """
        pk = require_id(pk, cls.model, field=f"{cls.model.__name__} pk")
        cls.machine.assert_transition(src, dst)
        cls.assert_reason(dst, set_fields or {})
        required = cls.machine.reason_required
        if src in required and dst not in required and "reason_code" not in (set_fields or {}) \
                and "reason_code" in cls._fields_by_column():
            # A row's reason code explains its current halt; leaving the halt clears it
            # (the evidence rows keep the history).
            set_fields = {**(set_fields or {}), "reason_code": ""}
        return cls._cas(org_id=org_id, pk=pk, src=src, dst=dst, version=version, fences=fences, set_fields=set_fields)

    @classmethod
    def assert_reason(cls, state: str, fields: dict[str, Any]) -> None:
        """Refuse a row in ``state`` whose ``fields`` lack the reason it needs.

        Args:
            state: the state being entered.
            fields: the columns written with it (``set_fields`` or insert values).

        Raises:
            ReasonRequired: ``state`` is in the machine's ``reason_required`` and
                ``fields["reason_code"]`` is missing or empty; or a code is
                given for a state that is not halted, or the code's owner is
                not one of the machine's ``reason_owners``.
            UnknownReasonCode: a non-empty ``reason_code`` nobody registered.

        Seed 003, "Operational liveness and maintenance admission".
        """
        code = fields.get("reason_code", "")
        if state in cls.machine.reason_required and not (isinstance(code, str) and code):
            raise ReasonRequired(f"{cls.machine.name}: {state} needs a reason_code")
        if code:
            reasons.require(code)
            if state not in cls.machine.reason_required:
                raise ReasonRequired(f"{cls.machine.name}: {state} is not halted; it carries no reason_code")
            owner = reasons.REASONS[code].owner
            if owner not in cls.machine.reason_owners:
                raise ReasonRequired(f"{cls.machine.name}: {code} belongs to {owner}, not to "
                                     f"{', '.join(sorted(cls.machine.reason_owners))}")

    @classmethod
    def touch(cls, *, org_id: str, pk: int, state: str, version: int,
              fences: dict[str, Any] | None = None, set_fields: dict[str, Any] | None = None) -> int:
        """Change non-state columns under the same CAS guard (state unchanged).

        Raises:
            IllegalTransition: ``state`` is not one of the machine's states (before SQL).
            ValueError / InvalidIdentity: as :meth:`transition` (before SQL).
            ReasonRequired / UnknownReasonCode: ``set_fields`` clears or sets an
                unregistered ``reason_code`` (see :meth:`assert_reason`).
        """
        pk = require_id(pk, cls.model, field=f"{cls.model.__name__} pk")
        if state not in cls.machine.states:
            raise IllegalTransition(f"{cls.machine.name}: {state!r} is not a state")
        if "reason_code" in (set_fields or {}):
            cls.assert_reason(state, set_fields)
        return cls._cas(org_id=org_id, pk=pk, src=state, dst=state, version=version, fences=fences, set_fields=set_fields)

    @classmethod
    def _typed_columns(cls) -> dict[str, Any]:
        """Map each column holding a typed id (pk and foreign keys) to its id class."""
        cached = cls.__dict__.get("_typed_columns_cache")
        if cached is None:
            cached = {field.column: id_cls for field, id_cls in typed_id_fields(cls.model)}
            cls._typed_columns_cache = cached
        return cached

    @classmethod
    def _check_typed_values(cls, values: dict[str, Any] | None) -> None:
        typed = cls._typed_columns()
        for column, value in (values or {}).items():
            if value is not None and column in typed:
                require_id(value, typed[column], field=f"{cls.model.__name__}.{column}")

    @classmethod
    def _check_identity_values(cls, values: dict[str, Any] | None) -> None:
        """Validate every identity column written here, as :func:`insert` does (seed 003 "Identity rules")."""
        from .identity import IdentityField

        for column, value in (values or {}).items():
            field = cls._fields_by_column().get(column)
            if isinstance(field, IdentityField):
                field.canonical(value)

    @classmethod
    def _fields_by_column(cls) -> dict[str, Any]:
        cached = cls.__dict__.get("_fields_by_column_cache")
        if cached is None:
            cached = {f.column: f for f in cls.model._meta.concrete_fields}
            cls._fields_by_column_cache = cached
        return cached

    #: Columns only the CAS itself writes or compares; never in ``set_fields`` or ``fences``.
    CAS_COLUMNS = frozenset({"id", "org_id", "state", "version"})
    #: Columns fixed at insert (e.g. a frozen deadline): refused in ``set_fields``.
    immutable_columns: frozenset[str] = frozenset()

    @classmethod
    def _check_columns(cls, values: dict[str, Any] | None, what: str) -> None:
        """Refuse unknown columns (no SQL is built from them), the CAS's own columns and expressions."""
        from django.db.models.expressions import Combinable

        columns = cls._fields_by_column()
        for column, value in (values or {}).items():
            if column in cls.CAS_COLUMNS:
                raise ValueError(f"{cls.model.__name__}: {what} cannot name {column!r}; the CAS owns it")
            if column not in columns:
                raise ValueError(f"{cls.model.__name__}: {what} names unknown column {column!r}")
            if what == "set_fields" and column in cls.immutable_columns:
                raise ValueError(f"{cls.model.__name__}: {column!r} is fixed at insert and never changes")
            if isinstance(value, Combinable) or hasattr(value, "resolve_expression"):
                raise ValueError(f"{cls.model.__name__}: {what}[{column!r}] is an expression; pass a value")

    @classmethod
    def _touched_columns(cls) -> list[str]:
        """``auto_now`` columns: the CAS stamps them with the database clock on every change."""
        return [f.column for f in cls.model._meta.concrete_fields if getattr(f, "auto_now", False)]

    @staticmethod
    def _check_version(version: Any) -> None:
        if type(version) is not int:  # "1abc" would be cast by MariaDB, 1.0 would return 2.0
            raise ValueError(f"version must be an int, got {version!r}")

    @classmethod
    def _cas(cls, *, org_id, pk, src, dst, version, fences, set_fields) -> int:
        cls._check_version(version)
        cls._check_columns(set_fields, "set_fields")
        cls._check_columns(fences, "fences")
        validate_key(org_id, field=f"{cls.model.__name__}.org_id")
        cls._check_typed_values(fences)
        cls._check_typed_values(set_fields)
        cls._check_identity_values(set_fields)
        cls._check_identity_values({k: v for k, v in (fences or {}).items() if v is not None})
        table = cls.model._meta.db_table
        ops = connections[cls.db()].ops

        def adapt(value):
            # Raw SQL bypasses field conversion: store datetimes as the backend
            # expects and bind typed ids as the integers they are.
            return ops.adapt_datetimefield_value(value) if isinstance(value, dt.datetime) else sql_param(value)

        assignments = ["`state` = %s", "`version` = `version` + 1"]
        assignments += [f"`{c}` = UTC_TIMESTAMP(6)" for c in cls._touched_columns() if c not in (set_fields or {})]
        params: list[Any] = [dst]
        for column, value in (set_fields or {}).items():
            assignments.append(f"`{column}` = %s")
            params.append(adapt(value))
        where = ["`id` = %s", "`org_id` = %s", "`state` = %s", "`version` = %s"]
        params += [int(pk), org_id, src, version]
        for column, value in (fences or {}).items():
            if value is None:
                where.append(f"`{column}` IS NULL")
            else:
                where.append(f"`{column}` = %s")
                params.append(adapt(value))
        sql = f"UPDATE `{table}` SET {', '.join(assignments)} WHERE {' AND '.join(where)}"
        with connections[cls.db()].cursor() as cursor:
            cursor.execute(sql, params)
            count = cursor.rowcount
        if count == 0:
            raise cls.stale_error(f"{cls.machine.name} id={pk}: expected {src}@v{version}, row moved")
        if count > 1:
            raise MultipleRowsUpdated(f"{cls.machine.name} id={pk}: {count} rows matched")
        return version + 1
