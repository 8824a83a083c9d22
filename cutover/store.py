from nexusflow.kernel.locks import LockClass
from nexusflow.kernel.store import CasStore

from . import models, transitions


class CutoverDecisionStore(CasStore):
    model = models.CutoverDecision
    machine = transitions.CUTOVER_DECISION
    lock_class = LockClass.SERVING_GATE
