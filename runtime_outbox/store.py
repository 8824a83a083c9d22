"""Runtime CAS stores: outbox message delivery is the only mutable Runtime row; inbox acceptances are
inserted in their final state and only locked."""
from django.db import connections

from nexusflow.kernel import locks
from nexusflow.kernel.locks import LockClass
from nexusflow.kernel.rows import get_row, row_shape
from nexusflow.kernel.store import CasStore

from . import models, transitions


class OutboxMessageStore(CasStore):
    model = models.OutboxMessage
    machine = transitions.OUTBOX_MESSAGE
    lock_class = LockClass.RUNTIME

    @classmethod
    def due(cls, *, state: str, now, limit: int, suffix: str = "") -> list[models.OutboxMessage]:
        """Up to ``limit`` messages in ``state`` due at ``now`` (all orgs), first due first (read committed, no
        lock unless :meth:`lock_due` reads them). Due: ``next_attempt_at`` unset or not after ``now`` (the
        database clock): ``filter(state=state).exclude(next_attempt_at__gt=now).order_by("next_attempt_at",
        "id")``, by SQL built once."""
        shape = row_shape(cls.model, cls.db())
        where, params = shape.where({"state": state})
        due = shape.by_name["next_attempt_at"]
        sql = shape.select_sql(f"{where} AND (`{due.column}` IS NULL OR `{due.column}` <= %s)",
                               suffix=f" ORDER BY `{due.column}`, `id` LIMIT {int(limit)}{suffix}")
        return shape.fetch(sql, [*params, due.get_db_prep_value(now, connections[shape.alias], prepared=False)])

    @classmethod
    def lock_due(cls, *, state: str, now, limit: int) -> list[models.OutboxMessage]:
        """:meth:`due`, the rows locked ``FOR UPDATE SKIP LOCKED`` (a row another transaction holds is left
        out): two relays claim disjoint batches."""
        locks.note(cls.lock_class, cls.db(), rank=cls.lock_rank, label=cls.lock_label)
        return cls.due(state=state, now=now, limit=limit, suffix=" FOR UPDATE SKIP LOCKED")


class InboxAcceptanceStore(CasStore):
    model = models.InboxAcceptance
    machine = transitions.INBOX_ACCEPTANCE
    lock_class = LockClass.RUNTIME
    lock_label = "InboxAcceptance"

    @classmethod
    def lock_key(cls, message_key: str) -> models.InboxAcceptance | None:
        """Lock the acceptance row of ``message_key`` ``FOR UPDATE`` (Runtime lock class), or return None.

        The key alone is unique (seed 004 section 10.7): the row is found
        whatever its scope, so that a caller of another scope is refused
        against it instead of inserting beside it. Under READ COMMITTED a
        missing key takes no gap lock; an uncommitted insert of the same key
        makes this read wait for its commit.
        """
        locks.note(cls.lock_class, cls.db(), rank=cls.lock_rank, label=cls.lock_label)
        return cls.model.objects.select_for_update().filter(message_key=message_key).first()


class OutboundCommandStore:
    """Locking reads of the immutable OutboundCommand intent (it has no state to write)."""

    @staticmethod
    def lock(org_id: str, pk: int) -> models.OutboundCommand:
        """Lock one intent row ``FOR UPDATE`` (Runtime lock class).

        Only the result commit waits on an intent (seed 000: it locks its
        intent before projecting onto the record, inside
        ``locks.result_commit``); owner checks read intents ``NOWAIT``.

        Raises:
            OutboundCommand.DoesNotExist: no such intent in ``org_id``.
        """
        locks.note(LockClass.RUNTIME, label="OutboundCommand")
        return get_row(models.OutboundCommand, {"org_id": org_id, "pk": int(pk)}, lock="update")

    @staticmethod
    def lock_owner_intents(org_id: str, object_name: str, record_key: str, *,
                           nowait: bool = True) -> list[tuple[int, str, str]]:
        """Lock every intent of one owner record ``FOR UPDATE NOWAIT`` in id order (owner-leading index).

        Returns:
            ``(id, contract_key, link_key)`` rows.

        Raises:
            django.db.OperationalError: a row is locked by another transaction
                (``NOWAIT``: MariaDB 1205, MySQL/TiDB 3572).
        """
        locks.note(LockClass.RUNTIME, label="OutboundCommand")
        return list(models.OutboundCommand.objects.select_for_update(nowait=nowait)
                    .filter(org_id=org_id, source_object=object_name, source_record_key=record_key)
                    .order_by("id").values_list("id", "contract_key", "link_key"))
