"""Runtime CAS store: outbox message delivery is the only mutable Runtime row."""
from nexusflow.kernel.locks import LockClass
from nexusflow.kernel.store import CasStore

from . import models, transitions


class OutboxMessageStore(CasStore):
    model = models.OutboxMessage
    machine = transitions.OUTBOX_MESSAGE
    lock_class = LockClass.RUNTIME
