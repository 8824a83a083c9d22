from nexusflow.kernel.locks import LockClass
from nexusflow.kernel.models import insert
from nexusflow.kernel.store import CasStore

from . import models, transitions


class CutoverDecisionStore(CasStore):
    model = models.CutoverDecision
    machine = transitions.CUTOVER_DECISION
    lock_class = LockClass.SERVING_GATE


def certificate_insert(**values) -> models.CutoverReadinessCertificate:
    """Insert one immutable CutoverReadinessCertificate (the only writer; rows never change).

    Args:
        values: every column of :class:`~cutover.models.CutoverReadinessCertificate` but ``id``/``created_at``.

    Raises:
        IntegrityError: the ``(org_id, attempt_key)`` already holds a certificate.
        InvalidIdentity: a non-canonical key (before SQL).
    """
    return insert(models.CutoverReadinessCertificate, **values)
