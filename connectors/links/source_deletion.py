"""What a source record's deletion does to its push links (seed 000 deletion hook; seed 002 "Drift Matrix").

Installed as the record-deletion lifecycle hook at stage
``DELETE_STAGE_REMOTE_LINKS``: it runs in the deleting transaction, under the
record lock, after Runtime's owner work check (``runtime_outbox.owner``) has
refused any pending, accepted or unknown-state intent of the record.

Decision: each ``active`` push link of the deleted record moves to
``suspended_drift`` with reason ``source_deleted`` and a RemoteLinkEvidence
row. A suspended link is no PATCH authority (seed 002 "Before PATCH"), so no
later update goes out for the deleted record; the remote record itself is not
deleted, and the link's evidence stays for reconciliation or an operator's
retire. Links of other action types and links already suspended or retired
are left as they are.

Lock order: the owner check already holds the record's intents (Runtime
class), so the links are locked ``FOR UPDATE NOWAIT`` (never a wait in reverse
order, ARCHITECTURE.md section 6); a link held by a running settlement is the
retryable ``owner_contended``.
"""
from __future__ import annotations

from django.db import OperationalError

from connectors import reasons
from connectors.links.link_keys import PUSH_ACTION_TYPE
from connectors.models import RemoteLink
from connectors.store import RemoteLinkStore
from nexusflow.kernel.scope import OrgScope


def links_before_source_delete(*, org: OrgScope, record) -> list[int]:
    """Suspend the deleting record's active push links (``source_deleted``); return their ids.

    Runs inside the deleting transaction with the record locked (the
    installed record-deletion hook). Seed 000 "installed record-deletion
    lifecycle hook"; seed 002 "Drift Matrix", local deletion.

    Raises:
        OwnerContended: a link row is locked by another transaction (retryable).
    """
    from connectors.links.push_rules import append_link_evidence
    from runtime_outbox.owner import NOWAIT_LOCK_ERRORS, OwnerContended

    ids = list(RemoteLink.objects.filter(org_id=org.org_id, source_object=record.object_name,
                                         source_record_key=record.record_key, action_type=PUSH_ACTION_TYPE,
                                         state="active").order_by("id").values_list("id", flat=True))
    suspended = []
    for link_id in ids:
        try:
            link = RemoteLinkStore.lock(org.org_id, link_id, nowait=True)
        except OperationalError as exc:
            if exc.args and exc.args[0] in NOWAIT_LOCK_ERRORS:
                raise OwnerContended(f"{record.object_name}/{record.record_key}: remote link {link_id} is being "
                                     f"settled now; retry") from exc
            raise
        if link.state != "active":
            continue
        append_link_evidence(link, kind="source_deleted", actor="record_delete", to_state="suspended_drift",
                             detail={"source_object": record.object_name, "source_record_key": record.record_key,
                                     "record_version": int(record.version), "remote_id": link.remote_id})
        RemoteLinkStore.transition(org_id=link.org_id, pk=link.pk, src="active", dst="suspended_drift",
                                   version=link.version, set_fields={"reason_code": reasons.SOURCE_DELETED})
        suspended.append(int(link.pk))
    return suspended
