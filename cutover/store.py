from nexusflow.kernel import locks
from nexusflow.kernel.locks import LockClass
from nexusflow.kernel.models import insert
from nexusflow.kernel.store import CasStore

from . import models, transitions


class CutoverDecisionStore(CasStore):
    model = models.CutoverDecision
    machine = transitions.CUTOVER_DECISION
    lock_class = LockClass.SERVING_GATE


class RestoreAttemptStore(CasStore):
    model = models.RestoreAttempt
    machine = transitions.RESTORE_ATTEMPT
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


def drop_tables_except(cursor, *, schema: str, keep: set[str]) -> list[str]:
    """Drop every base table and view of ``schema`` not in ``keep`` (a full restore's first step).

    Runs on a DB-API ``cursor`` outside any Django transaction, with foreign key checks off for the
    session, before the restore point's dump recreates the tables it holds.

    Returns:
        The dropped names, sorted.
    """
    cursor.execute("SELECT table_name, table_type FROM information_schema.tables WHERE table_schema = %s",
                   (schema,))
    extra = sorted((name, kind) for name, kind in cursor.fetchall() if name not in keep)
    cursor.execute("SET SESSION foreign_key_checks = 0")
    for name, kind in extra:
        cursor.execute(f"DROP {'VIEW' if kind == 'VIEW' else 'TABLE'} IF EXISTS `{schema}`.`{name}`")
    cursor.execute("SET SESSION foreign_key_checks = 1")
    return [name for name, _ in extra]
