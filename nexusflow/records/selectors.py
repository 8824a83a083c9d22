"""Record reads (no locks)."""
from __future__ import annotations

from nexusflow.kernel.scope import OrgScope

from .models import Record


def record_get(*, org: OrgScope, object_name: str, record_key: str) -> Record | None:
    return Record.objects.filter(org_id=org.org_id, object_name=object_name, record_key=record_key, is_deleted=False).first()


def records_of(*, org: OrgScope, object_name: str):
    return Record.objects.filter(org_id=org.org_id, object_name=object_name, is_deleted=False).order_by("id")
