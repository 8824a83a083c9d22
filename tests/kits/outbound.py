"""Outbound intents for tests: author a push the way a record save does, make backed-off work due.

Seed 003 "Outbound facts": a save changes the source record and authors its
OutboundCommand in one application transaction; the outbox message it writes
is delivered separately (``outbox_try_deliver_one``), so a test chooses when
the RemoteEffect appears.
"""
from __future__ import annotations

import itertools

from django.db import connection, transaction

from nexusflow.kernel.scope import OrgScope, TrustedRuntimeWorkScope
from nexusflow.records.models import Record
from nexusflow.records.services import record_lock, record_update
from runtime_outbox.models import OutboundCommand
from runtime_outbox.services import outbound_command_author
from tests.conftest import ORG

#: The trusted Runtime work scope every test intent is authored under.
SCOPE = TrustedRuntimeWorkScope(ORG, "core", "flow-runtime", "test-binding")
#: The billing pack's push contract (replay-safe idempotency keys).
BILLING_CONTRACT = "billing.customer"

_slots = itertools.count(1)


def author(record: Record | str, slot: str | None = None, *, contract: str = BILLING_CONTRACT,
           root: str | None = None, **changes: str | None) -> OutboundCommand:
    """Save ``changes`` (if any) to ``record`` and author its push intent in the same transaction; not delivered.

    Args:
        record: the source record, or a Contact's record key.
        slot: the effect slot id (one logical effect per slot); default a new ``"push-<n>"``.
        contract: the push contract key.
        root: the effect root id; default ``"root-<contract>-<record key>"`` (one root per record and contract).
        changes: field changes saved first (``record_update``).

    Raises:
        NotServing: the org's gate or epoch does not serve (nothing is written).
    """
    key, object_name = (record, "Contact") if isinstance(record, str) else (record.record_key, record.object_name)
    with transaction.atomic():
        locked = record_lock(org=OrgScope(ORG), object_name=object_name, record_key=key)
        if changes:
            record_update(org=OrgScope(ORG), record=locked, changes=changes)
        return outbound_command_author(scope=SCOPE, effect_root_id=root or f"root-{contract}-{key}",
                                       effect_slot_id=slot or f"push-{next(_slots)}", effect_generation_id="1",
                                       contract_key=contract, record=locked, origin_flow_run_id=None)


def zero_backoff(*, outbox: bool = False) -> None:
    """Make every backed-off RemoteEffect due now (and, with ``outbox``, every outbox message).

    Due-ness is ``next_attempt_at`` against the database clock; NULL is due at once.
    """
    with connection.cursor() as cursor:
        cursor.execute("UPDATE connectors_remoteeffect SET next_attempt_at = NULL")
        if outbox:
            cursor.execute("UPDATE runtime_outbox_outboxmessage SET next_attempt_at = NULL")
