"""Runtime CAS store: outbox message delivery is the only mutable Runtime row."""
from nexusflow.kernel import locks
from nexusflow.kernel.locks import LockClass
from nexusflow.kernel.store import CasStore

from . import models, transitions


class OutboxMessageStore(CasStore):
    model = models.OutboxMessage
    machine = transitions.OUTBOX_MESSAGE
    lock_class = LockClass.RUNTIME


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
        return models.OutboundCommand.objects.select_for_update().get(org_id=org_id, pk=int(pk))

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
