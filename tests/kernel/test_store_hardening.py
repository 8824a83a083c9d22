"""Bypasses of the store discipline that must be refused, each tried against real rows.

Each case is a way around the CAS store that an earlier version allowed: the
CAS's own columns in ``set_fields``, a state spelled differently in ``touch``,
Django's private and base-manager writers, PAD SPACE identity matches, and
inserts in a non-initial state. Every refusal happens before SQL and leaves
the row as it was.
"""
from __future__ import annotations

import pytest
from django.core import serializers
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from connectors.models import AccountServingGate, CredentialGenerationDispatchGate, ServingEpoch
from connectors.reasons import EPOCH_OWNER_MISMATCH
from connectors.store import ServingEpochStore
from nexusflow.kernel.errors import IllegalTransition, ImmutableRow, InvalidIdentity
from nexusflow.kernel.models import insert
from nexusflow.kernel.reasons import UnknownReasonCode

from . import rows

pytestmark = pytest.mark.django_db
ORG = "hardening-org"


def _epoch(state="prepared"):
    return rows.make(ServingEpoch, org_id=ORG, state=state, version=1)


def _unchanged(epoch, state="prepared", version=1):
    row = ServingEpoch.objects.get(org_id=ORG, pk=epoch.pk)
    assert (row.state, row.version, row.org_id) == (state, version, ORG)


@pytest.mark.parametrize("set_fields", [
    {"state": "active"},
    {"version": 1},
    {"org_id": "victim-org"},
    {"id": 1},
    {"state` = 'active', `version": 1},  # a column name is never SQL
    {"no_such_column": 1},
])
def test_set_fields_cannot_name_cas_or_unknown_columns(set_fields):
    epoch = _epoch()
    for call in (
        lambda: ServingEpochStore.transition(org_id=ORG, pk=epoch.pk, src="prepared", dst="verified", version=1,
                                             set_fields=set_fields),
        lambda: ServingEpochStore.touch(org_id=ORG, pk=epoch.pk, state="prepared", version=1, set_fields=set_fields),
    ):
        with CaptureQueriesContext(connection) as queries:
            with pytest.raises(ValueError):
                call()
        assert len(queries) == 0
    _unchanged(epoch)


def test_fences_cannot_name_cas_or_unknown_columns():
    epoch = _epoch()
    with pytest.raises(ValueError):
        ServingEpochStore.transition(org_id=ORG, pk=epoch.pk, src="prepared", dst="verified", version=1,
                                     fences={"state": "prepared"})
    _unchanged(epoch)


@pytest.mark.parametrize("state", ["PREPARED", "prepared ", "Prepared", "no_such_state"])
def test_touch_refuses_a_state_that_is_not_exactly_one_of_the_machine(state):
    # The state column compares case-insensitively and ignores trailing spaces; the check must not.
    epoch = _epoch()
    with CaptureQueriesContext(connection) as queries:
        with pytest.raises(IllegalTransition):
            ServingEpochStore.touch(org_id=ORG, pk=epoch.pk, state=state, version=1)
    assert len(queries) == 0
    _unchanged(epoch)


@pytest.mark.parametrize("version", ["1abc", "1", 1.0, True, None])
def test_version_must_be_an_int(version):
    epoch = _epoch()
    with CaptureQueriesContext(connection) as queries:
        with pytest.raises(ValueError):
            ServingEpochStore.transition(org_id=ORG, pk=epoch.pk, src="prepared", dst="verified", version=version)
    assert len(queries) == 0
    _unchanged(epoch)


def test_django_private_and_base_manager_writers_are_refused():
    gate = rows.make(CredentialGenerationDispatchGate, org_id=ORG, state="enabled", version=1)
    model = CredentialGenerationDispatchGate
    attempts = {
        "base manager update": lambda: model._base_manager.filter(pk=gate.pk).update(state="revoked"),
        "base manager delete": lambda: model._base_manager.filter(pk=gate.pk).delete(),
        "base manager bulk_create": lambda: model._base_manager.bulk_create([model(org_id=ORG, state="revoked")]),
        "_update": lambda: model.objects.filter(pk=gate.pk)._update([(model._meta.get_field("state"), None,
                                                                      "revoked")]),
        "_raw_delete": lambda: model.objects.filter(pk=gate.pk)._raw_delete("default"),
        "save_base": lambda: model.objects.get(org_id=ORG, pk=gate.pk).save_base(),
    }
    for _name, attempt in attempts.items():
        with pytest.raises(ImmutableRow):
            attempt()
    dumped = serializers.serialize("json", [model.objects.get(org_id=ORG, pk=gate.pk)]).replace('"enabled"',
                                                                                                  '"revoked"')
    new_row = dumped.replace(f'"pk": {gate.pk}', '"pk": null')
    for source in (dumped, new_row):
        for obj in serializers.deserialize("json", source):
            with pytest.raises(ImmutableRow), transaction.atomic():
                obj.save()  # the loaddata path: Model.save_base(obj, raw=True), unbound
    assert model.objects.filter(org_id=ORG).count() == 1
    row = model.objects.get(org_id=ORG, pk=gate.pk)
    assert (row.state, row.version) == ("enabled", 1)


def test_reverse_foreign_key_add_cannot_move_a_row():
    epoch = _epoch("active")
    other = _epoch("active")
    gate = rows.make(AccountServingGate, org_id=ORG, state="v2_serving", version=1, epoch=epoch)
    with pytest.raises(ImmutableRow):
        other.accountservinggate_set.add(gate)
    assert AccountServingGate.objects.get(org_id=ORG, pk=gate.pk).epoch_id == epoch.pk


def test_pad_space_collation_cannot_widen_an_identity_match():
    with connection.cursor() as cursor:
        cursor.execute("SELECT 'abc' = 'abc   ' COLLATE utf8mb4_bin")
        # MariaDB's utf8mb4_bin ignores trailing spaces: this is why lookups are validated.
        assert cursor.fetchone()[0] == 1
    epoch = _epoch()
    with pytest.raises(InvalidIdentity):
        list(ServingEpoch.objects.filter(org_id=ORG + "  "))
    with pytest.raises(InvalidIdentity):
        list(AccountServingGate.objects.filter(org_id=ORG, account_key__in=["acct", "acct "]))
    with CaptureQueriesContext(connection) as queries:
        with pytest.raises(InvalidIdentity):
            ServingEpochStore.transition(org_id=ORG + " ", pk=epoch.pk, src="prepared", dst="verified", version=1)
        with pytest.raises(InvalidIdentity):
            ServingEpochStore.transition(org_id=ORG, pk=epoch.pk, src="prepared", dst="verified", version=1,
                                         fences={"digest": epoch.digest + " "})
    assert len(queries) == 0
    _unchanged(epoch)


def test_insert_keeps_the_machine_and_reason_rules():
    with pytest.raises(IllegalTransition):
        insert(ServingEpoch, org_id=ORG, state="active", configuration=_epoch().configuration, document={},
               digest="d" * 64, profile_id="p")
    with pytest.raises(UnknownReasonCode):
        rows.make(ServingEpoch, org_id=ORG, state="rejected", version=1, reason_code="not_registered")
    rejected = rows.make(ServingEpoch, org_id=ORG, state="rejected", version=1, reason_code=EPOCH_OWNER_MISMATCH)
    assert ServingEpoch.objects.get(org_id=ORG, pk=rejected.pk).reason_code == EPOCH_OWNER_MISMATCH


def test_bytes_identities_are_stored_as_their_text():
    gate = insert(AccountServingGate, org_id=ORG, account_key=b"bytes-acct", pack_key="p", state="v1_serving")
    assert AccountServingGate.objects.get(org_id=ORG, pk=gate.pk).account_key == "bytes-acct"


def test_leaving_a_halt_clears_its_reason_code():
    gate = rows.make(CredentialGenerationDispatchGate, org_id=ORG, state="revoked", version=1,
                     reason_code=EPOCH_OWNER_MISMATCH)
    from connectors.store import CredentialDispatchGateStore

    CredentialDispatchGateStore.transition(org_id=ORG, pk=gate.pk, src="revoked", dst="enabled", version=1)
    row = CredentialGenerationDispatchGate.objects.get(org_id=ORG, pk=gate.pk)
    assert (row.state, row.reason_code) == ("enabled", "")


def test_expressions_are_not_values():
    from django.db.models import F, Value

    epoch = _epoch()
    for value in (F("digest"), Value("x")):
        with pytest.raises(ValueError, match="expression"):
            ServingEpochStore.touch(org_id=ORG, pk=epoch.pk, state="prepared", version=1,
                                    set_fields={"digest": value})
    _unchanged(epoch)


def test_every_cas_stamps_auto_now_columns_from_the_database_clock():
    from connectors.models import RemoteEffect
    from connectors.store import RemoteEffectStore
    from nexusflow.kernel.clock import db_now

    effect = rows.make(RemoteEffect, org_id=ORG, state="prepared", version=1)
    before = RemoteEffect.objects.get(org_id=ORG, pk=effect.pk).updated_at
    with connection.cursor() as cursor:  # make the old stamp clearly older than the clock
        cursor.execute("UPDATE connectors_remoteeffect SET updated_at = %s WHERE id = %s",
                       ["2000-01-01 00:00:00", int(effect.pk)])
    RemoteEffectStore.touch(org_id=ORG, pk=effect.pk, state="prepared", version=1)
    stamped = RemoteEffect.objects.get(org_id=ORG, pk=effect.pk).updated_at
    assert stamped.year > 2000 and abs((db_now() - stamped).total_seconds()) < 60
    assert before is not None


def test_a_parent_row_of_another_org_is_refused():
    foreign = rows.make(ServingEpoch, org_id="other-org", state="active", version=1)
    with pytest.raises(InvalidIdentity, match="other-org"):
        insert(AccountServingGate, org_id=ORG, account_key="acct", pack_key="p", state="v1_serving", epoch=foreign)
    assert not AccountServingGate.objects.filter(org_id=ORG).exists()


def test_a_reason_code_belongs_to_a_halt_of_its_own_machine():
    from connectors.store import CredentialDispatchGateStore
    from nexusflow.flows.reasons import STEP_RETRY_EXHAUSTED
    from nexusflow.kernel.errors import ReasonRequired

    gate = rows.make(CredentialGenerationDispatchGate, org_id=ORG, state="enabled", version=1)
    with CaptureQueriesContext(connection) as queries:
        with pytest.raises(ReasonRequired, match="not halted"):
            CredentialDispatchGateStore.touch(org_id=ORG, pk=gate.pk, state="enabled", version=1,
                                              set_fields={"reason_code": EPOCH_OWNER_MISMATCH})
        with pytest.raises(ReasonRequired, match="belongs to flows"):
            CredentialDispatchGateStore.transition(org_id=ORG, pk=gate.pk, src="enabled", dst="revoked", version=1,
                                                   set_fields={"reason_code": STEP_RETRY_EXHAUSTED})
    assert len(queries) == 0
    with pytest.raises(ReasonRequired, match="not halted"):
        insert(CredentialGenerationDispatchGate, org_id=ORG, state="enabled", reason_code=EPOCH_OWNER_MISMATCH,
               credential_generation=gate.credential_generation)
    row = CredentialGenerationDispatchGate.objects.get(org_id=ORG, pk=gate.pk)
    assert (row.state, row.version, row.reason_code) == ("enabled", 1, "")
