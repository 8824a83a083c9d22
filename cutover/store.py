from nexusflow.kernel import locks
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


RANK_READINESS_CERTIFICATE = 4  # after the gate, epoch, credential gate and stream cursor of position 4


def certificate_lock(org_id: str, attempt_key: str) -> models.CutoverReadinessCertificate | None:
    """Lock the certificate of ``(org_id, attempt_key)`` (``FOR UPDATE``), or return ``None``.

    Taken after the AccountServingGates in the halt transaction: the certificate is
    immutable; the lock makes it part of the frozen set the gates reference.
    """
    locks.note(LockClass.SERVING_GATE, "default", rank=RANK_READINESS_CERTIFICATE, label="readiness certificate")
    return (models.CutoverReadinessCertificate.objects.select_for_update()
            .filter(org_id=org_id, attempt_key=attempt_key).first())
