"""The only writer of records.Record rows (version compare-and-swap)."""
from __future__ import annotations

from django.db import connection

from nexusflow.kernel import canonical_json, locks
from nexusflow.kernel.errors import MultipleRowsUpdated, StaleVersion
from nexusflow.kernel.models import insert
from nexusflow.kernel.rows import get_row

from .models import Record, RecordFieldHistory

#: Namespace under which a transaction remembers the records it holds (the owner fence, seed 000).
FENCE = "records.Record"


def fence_key(org_id: str, object_name: str, record_key: str) -> tuple[str, str, str]:
    return (org_id, object_name, record_key)


#: Namespaces of a transaction's history reservations: the sequence rows it holds, and a reserved number
#: not yet used by a write.
HISTORY_ROW = "records.RecordHistorySequence"
HISTORY_NEXT = "records.RecordHistorySequence.next"


class HistoryStore:
    """The only writer of record history rows (seed 004 section 13.1 step 3)."""

    @staticmethod
    def reserve(org_id: str, object_name: str, record_key: str, *, new: bool = False) -> int:
        """Advance and row-lock the record's history sequence; keep the number for the record's next write.

        Takes the history-sequence lock-order position first (after business rows, before any Flow
        lifecycle row: reserving after a Flow root raises :class:`LockOrderViolation`), unless the
        transaction already holds the row or inserted the record (``new``: nobody can contend for it).

        Returns:
            The reserved sequence number.
        """
        key = (org_id, object_name, record_key)
        pending = locks.recall(HISTORY_NEXT, key)
        if pending is not None:  # already reserved for the same coming write (a Flow step's, then its deletion)
            return pending
        if not new and not locks.is_held(HISTORY_ROW, key):
            locks.note(locks.LockClass.HISTORY_SEQUENCE, key=key)
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO records_recordhistorysequence (org_id, object_name, record_key, last_sequence) "
                "VALUES (%s, %s, %s, 1) ON DUPLICATE KEY UPDATE last_sequence = last_sequence + 1", list(key))
            cursor.execute(
                "SELECT last_sequence FROM records_recordhistorysequence "
                "WHERE org_id=%s AND object_name=%s AND record_key=%s", list(key))
            sequence = int(cursor.fetchone()[0])
        locks.mark_held(HISTORY_ROW, key)
        locks.remember(HISTORY_NEXT, key, sequence)
        return sequence

    @staticmethod
    def hold(org_id: str, object_name: str, record_key: str) -> None:
        """Row-lock the record's history sequence at its lock-order position without taking a number.

        For a write that may still change a tracked field (its before-save hooks run later): the number is
        taken by :meth:`take` if it does, under the row already held; no number is spent if it does not.
        """
        key = (org_id, object_name, record_key)
        if locks.is_held(HISTORY_ROW, key):
            return
        locks.note(locks.LockClass.HISTORY_SEQUENCE, key=key)
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO records_recordhistorysequence (org_id, object_name, record_key, last_sequence) "
                "VALUES (%s, %s, %s, 0) ON DUPLICATE KEY UPDATE last_sequence = last_sequence", list(key))
        locks.mark_held(HISTORY_ROW, key)

    @staticmethod
    def take(org_id: str, object_name: str, record_key: str, *, new: bool = False) -> int:
        """The sequence number of a write about to happen: the one reserved for it, else a fresh reservation."""
        reserved = locks.recall(HISTORY_NEXT, (org_id, object_name, record_key), pop=True)
        if reserved is not None:
            return reserved
        sequence = HistoryStore.reserve(org_id, object_name, record_key, new=new)
        locks.recall(HISTORY_NEXT, (org_id, object_name, record_key), pop=True)
        return sequence

    @staticmethod
    def append(rows: list[dict]) -> None:
        """Insert the field-history rows of one write (immutable)."""
        for row in rows:
            insert(RecordFieldHistory, **row)


class RecordStore:
    @staticmethod
    def lock(org_id: str, object_name: str, record_key: str, *, nowait: bool = False) -> Record:
        """Lock one live record (business-record lock class).

        Raises:
            Record.DoesNotExist: no such live record.
        """
        locks.note(locks.LockClass.BUSINESS_RECORD)
        record = get_row(Record, {"org_id": org_id, "object_name": object_name, "record_key": record_key,
                                  "is_deleted": False}, lock="update_nowait" if nowait else "update")
        locks.mark_held(FENCE, fence_key(org_id, object_name, record_key))
        return record

    @staticmethod
    def lock_owner(org_id: str, object_name: str, record_key: str) -> Record:
        """Lock one record row whether live or deleted: the owner fence of seed 000.

        A committed deletion is visible here (``is_deleted``), so a caller
        queued behind a deleting transaction sees the deletion instead of a
        missing row.

        Raises:
            Record.DoesNotExist: no row with this identity ever existed.
        """
        locks.note(locks.LockClass.BUSINESS_RECORD)
        record = get_row(Record, {"org_id": org_id, "object_name": object_name, "record_key": record_key},
                         lock="update")
        locks.mark_held(FENCE, fence_key(org_id, object_name, record_key))
        return record

    @staticmethod
    def is_fenced(record: Record) -> bool:
        """Whether the current transaction holds ``record``'s row (locked or inserted by it)."""
        return locks.is_held(FENCE, fence_key(record.org_id, record.object_name, record.record_key))

    @staticmethod
    def create(**values) -> Record:
        record = insert(Record, **values)
        # An inserted row is held by the inserting transaction until it ends.
        locks.mark_held(FENCE, fence_key(record.org_id, record.object_name, record.record_key))
        return record

    @staticmethod
    def soft_delete(record: Record) -> Record:
        """Mark a locked live record deleted if ``record.version`` is still current.

        Raises:
            StaleVersion: the record moved or is already deleted.
        """
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE records_record SET is_deleted=1, version=version+1, updated_at=UTC_TIMESTAMP(6) "
                "WHERE id=%s AND org_id=%s AND version=%s AND is_deleted=0",
                [int(record.pk), record.org_id, record.version])
            count = cursor.rowcount
        if count != 1:
            raise StaleVersion(f"record {record.record_key}: version {record.version} is not current")
        record.is_deleted, record.version = True, record.version + 1
        return record

    @staticmethod
    def write(record: Record, *, fields: dict | None = None, mirrors: dict | None = None) -> Record:
        """Persist new ``fields``/``mirrors`` if ``record.version`` is still current.

        Raises:
            StaleVersion: the record moved since it was read.
        """
        new_fields = record.fields if fields is None else fields
        new_mirrors = record.mirrors if mirrors is None else mirrors
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE records_record SET fields=%s, mirrors=%s, version=version+1, updated_at=UTC_TIMESTAMP(6) "
                "WHERE id=%s AND org_id=%s AND version=%s AND is_deleted=0",
                [canonical_json.dumps(new_fields).decode(), canonical_json.dumps(new_mirrors).decode(),
                 int(record.pk), record.org_id, record.version],
            )
            count = cursor.rowcount
        if count == 0:
            raise StaleVersion(f"record {record.record_key}: version {record.version} is not current")
        if count > 1:
            raise MultipleRowsUpdated(f"record {record.record_key}: {count} rows")
        record.fields, record.mirrors, record.version = new_fields, new_mirrors, record.version + 1
        return record
