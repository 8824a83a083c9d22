"""The only writer of records.Record rows (version compare-and-swap)."""
from __future__ import annotations

from django.db import connection

from nexusflow.kernel import canonical_json, locks
from nexusflow.kernel.errors import MultipleRowsUpdated, StaleVersion
from nexusflow.kernel.models import insert

from .models import Record


#: Namespace under which a transaction remembers the records it holds (the owner fence, seed 000).
FENCE = "records.Record"


def fence_key(org_id: str, object_name: str, record_key: str) -> tuple[str, str, str]:
    return (org_id, object_name, record_key)


class RecordStore:
    @staticmethod
    def lock(org_id: str, object_name: str, record_key: str, *, nowait: bool = False) -> Record:
        """Lock one live record (business-record lock class).

        Raises:
            Record.DoesNotExist: no such live record.
        """
        locks.note(locks.LockClass.BUSINESS_RECORD)
        record = Record.objects.select_for_update(nowait=nowait).get(
            org_id=org_id, object_name=object_name, record_key=record_key, is_deleted=False
        )
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
        record = Record.objects.select_for_update().get(org_id=org_id, object_name=object_name,
                                                        record_key=record_key)
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
