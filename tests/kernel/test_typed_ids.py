"""Typed row ids against the real database (seed 003 "Identity rules").

Ids read back from MariaDB carry their model's kind; a store refuses an id of
another kind before running any SQL; the typed ids still behave as the
integers they are for comparison, hashing, JSON and the API.
"""
import json
import pickle

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from rest_framework.renderers import JSONRenderer

from connectors.models import (
    AccountServingGate,
    ConnectorServiceConfigurationGeneration,
    Event,
    Execution,
    ExecutionAttempt,
    OrderingLane,
    Projection,
    Receipt,
    ServingEpoch,
)
from connectors.reasons import SUPERSEDED_BY_NEWER_POSITION
from connectors.store import ExecutionStore, OrderingLaneStore
from nexusflow.flows.models import FlowRun
from nexusflow.flows.selectors import flow_run_get
from nexusflow.kernel.errors import InvalidIdentity
from nexusflow.kernel.ids import TypedId, id_class_for, require_id
from nexusflow.kernel.models import insert
from nexusflow.kernel.scope import OrgScope

pytestmark = pytest.mark.django_db(transaction=True)

ORG = "typed-ids-org"
DIGEST = "0" * 64


def _execution(org_id: str = ORG) -> Execution:
    """Insert the minimal connector chain up to one ready Execution."""
    config = insert(ConnectorServiceConfigurationGeneration, org_id=org_id, generation=1, document={},
                    digest=DIGEST, profile_id="p")
    epoch = insert(ServingEpoch, allow_any_state=True, org_id=org_id, state="active", configuration=config, document={}, digest=DIGEST,
                   profile_id="p")
    receipt = insert(Receipt, org_id=org_id, epoch=epoch, account_key="acct", channel="webhooks", route_key="r",
                     body=b"{}", body_digest=DIGEST, component_count=1, quarantined_count=0)
    event = insert(Event, org_id=org_id, epoch=epoch, account_key="acct", route_key="r", canonical_kind="k",
                   source_event_key="e1", source_locator="l1", occurred_at_ms=1, ordering_contract="none",
                   ordering_contract_digest=DIGEST, partition_key=DIGEST, partition={}, position=b"\x00" * 8,
                   tie_breaker="t", payload={}, payload_digest=DIGEST, receipt=receipt)
    projection = insert(Projection, org_id=org_id, event=event, route_key="r", definition_digest=DIGEST,
                        input_digest=DIGEST)
    return ExecutionStore.create(org_id=org_id, projection=projection, position=b"\x00" * 8, state="ready",
                                 command_id=DIGEST, execution_ref_digest=DIGEST)


def _attempt(execution: Execution) -> ExecutionAttempt:
    from nexusflow.kernel.clock import db_now

    return insert(ExecutionAttempt, org_id=execution.org_id, execution_id=execution.pk, attempt_number=1,
                  worker_id="w", lease_token="t", lease_expires_at=db_now())


# --- the id classes ----------------------------------------------------------
def test_each_model_has_its_own_id_class():
    assert Execution.Id is id_class_for(Execution) is id_class_for("connectors.Execution")
    assert Execution.Id.__name__ == "ExecutionId"
    assert FlowRun.Id.__name__ == "FlowRunId"
    assert Execution.Id is not FlowRun.Id
    assert issubclass(Execution.Id, TypedId) and issubclass(Execution.Id, int)
    assert repr(Execution.Id(5)) == "ExecutionId(5)"
    cleaned = Execution._meta.pk.to_python("5")
    assert type(cleaned) is Execution.Id and cleaned == 5
    with pytest.raises(TypeError):
        TypedId(5)


def test_typed_ids_behave_as_their_integer():
    eid = Execution.Id(5)
    assert eid == 5 and 5 == eid and eid == FlowRun.Id(5)
    assert hash(eid) == hash(5) and {5: "x"}[eid] == "x"
    assert str(eid) == "5" and f"{eid}" == "5" and f"{eid:03d}" == "005" and f"{eid}" == "5"
    assert json.dumps({"id": eid}) == '{"id": 5}'
    assert JSONRenderer().render({"id": eid, "ids": [eid]}) == b'{"id":5,"ids":[5]}'
    restored = pickle.loads(pickle.dumps(eid))
    assert type(restored) is Execution.Id and restored == 5


# --- require_id ----------------------------------------------------------------
def test_require_id_keeps_same_kind_and_converts_plain_int():
    eid = Execution.Id(7)
    assert require_id(eid, Execution) is eid
    converted = require_id(7, Execution)
    assert type(converted) is Execution.Id and converted == 7
    assert type(require_id(7, Execution.Id)) is Execution.Id
    assert type(require_id(7, "connectors.Execution")) is Execution.Id


@pytest.mark.parametrize("value", [FlowRun.Id(7), True, False, 0, -3, Execution.Id(0), "7", 7.0, None, b"7"],
                         ids=repr)
def test_require_id_refuses_other_kinds_bools_and_non_positive(value):
    with pytest.raises(InvalidIdentity) as info:
        require_id(value, Execution, field="execution_id")
    assert info.value.code == "invalid_identity"
    assert "execution_id" in str(info.value)


# --- reads from the database are typed ----------------------------------------
def test_pk_after_insert_and_read_back_is_typed():
    execution = _execution()
    assert type(execution.pk) is Execution.Id
    assert type(execution.projection_id) is Projection.Id
    fetched = Execution.objects.get(pk=execution.pk)
    assert type(fetched.pk) is Execution.Id and fetched.pk == execution.pk
    assert type(fetched.projection_id) is Projection.Id
    assert type(fetched.projection.event_id) is Event.Id
    assert fetched.lane_id is None


def test_foreign_key_columns_values_and_values_list_are_typed():
    execution = _execution()
    attempt = _attempt(execution)
    # Given as a plain int at insert, the FK attribute comes back typed.
    assert type(attempt.execution_id) is Execution.Id
    read = ExecutionAttempt.objects.get(pk=attempt.pk)
    assert type(read.pk) is ExecutionAttempt.Id
    assert type(read.execution_id) is Execution.Id and read.execution_id == execution.pk
    (pk, execution_id), = ExecutionAttempt.objects.filter(pk=attempt.pk).values_list("pk", "execution_id")
    assert (type(pk), type(execution_id)) == (ExecutionAttempt.Id, Execution.Id)
    row = ExecutionAttempt.objects.filter(pk=attempt.pk).values("execution__projection_id").get()
    assert type(row["execution__projection_id"]) is Projection.Id
    joined = ExecutionAttempt.objects.select_related("execution").get(pk=attempt.pk)
    assert type(joined.execution.pk) is Execution.Id


def test_lookup_with_another_kind_of_id_is_refused_before_sql():
    execution = _execution()
    with CaptureQueriesContext(connection) as queries:
        with pytest.raises(InvalidIdentity):
            Execution.objects.filter(pk=FlowRun.Id(int(execution.pk))).exists()
        with pytest.raises(InvalidIdentity):
            ExecutionAttempt.objects.filter(execution_id=FlowRun.Id(int(execution.pk))).exists()
    assert len(queries) == 0
    assert Execution.objects.filter(pk=int(execution.pk)).exists()


def test_insert_refuses_a_foreign_key_of_another_kind_before_sql():
    execution = _execution()
    with CaptureQueriesContext(connection) as queries:
        with pytest.raises(InvalidIdentity):
            insert(ExecutionAttempt, org_id=ORG, execution_id=FlowRun.Id(int(execution.pk)), attempt_number=1,
                   worker_id="w", lease_token="t", lease_expires_at="2030-01-01 00:00:00")
    assert len(queries) == 0
    assert not ExecutionAttempt.objects.filter(execution_id=execution.pk).exists()


# --- the store boundary ----------------------------------------------------------
def test_store_refuses_a_flow_run_id_with_zero_queries():
    execution = _execution()
    wrong = FlowRun.Id(int(execution.pk))  # same number, other kind
    with CaptureQueriesContext(connection) as queries:
        with pytest.raises(InvalidIdentity):
            ExecutionStore.lock(ORG, wrong)
        with pytest.raises(InvalidIdentity):
            ExecutionStore.transition(org_id=ORG, pk=wrong, src="ready", dst="completed", version=1)
        with pytest.raises(InvalidIdentity):
            ExecutionStore.touch(org_id=ORG, pk=wrong, state="ready", version=1)
    assert len(queries) == 0
    row = Execution.objects.get(pk=execution.pk)
    assert (row.state, row.version) == ("ready", 1)


@pytest.mark.parametrize("bad", [True, 0, -1, "1", None], ids=repr)
def test_store_refuses_bool_zero_negative_and_non_int(bad):
    execution = _execution()
    with CaptureQueriesContext(connection) as queries:
        with pytest.raises(InvalidIdentity):
            ExecutionStore.transition(org_id=ORG, pk=bad, src="ready", dst="completed", version=1)
    assert len(queries) == 0
    assert Execution.objects.get(pk=execution.pk).state == "ready"


def test_store_accepts_its_own_id_and_a_plain_int():
    execution = _execution()
    with transaction.atomic():
        locked = ExecutionStore.lock(ORG, int(execution.pk))
        assert type(locked.pk) is Execution.Id
    version = ExecutionStore.touch(org_id=ORG, pk=int(execution.pk), state="ready", version=1)
    version = ExecutionStore.transition(org_id=ORG, pk=execution.pk, src="ready", dst="superseded", version=version,
                                        set_fields={"reason_code": SUPERSEDED_BY_NEWER_POSITION})
    row = Execution.objects.get(pk=execution.pk)
    assert (row.state, row.version, row.reason_code) == ("superseded", 3, SUPERSEDED_BY_NEWER_POSITION)
    assert version == 3


def test_store_refuses_a_foreign_key_fence_of_another_kind():
    execution = _execution()
    with CaptureQueriesContext(connection) as queries:
        with pytest.raises(InvalidIdentity):
            ExecutionStore.touch(org_id=ORG, pk=execution.pk, state="ready", version=1,
                                 fences={"projection_id": Execution.Id(int(execution.projection_id))})
        with pytest.raises(InvalidIdentity):
            ExecutionStore.touch(org_id=ORG, pk=execution.pk, state="ready", version=1,
                                 set_fields={"lane_id": execution.pk})
    assert len(queries) == 0
    ExecutionStore.touch(org_id=ORG, pk=execution.pk, state="ready", version=1,
                         fences={"projection_id": execution.projection_id})
    assert Execution.objects.get(pk=execution.pk).version == 2


def test_gate_ids_stay_numbers_in_the_api_shape():
    gate = insert(AccountServingGate, org_id=ORG, account_key="acct", pack_key="p", state="v1_serving")
    read = AccountServingGate.objects.get(pk=gate.pk)
    assert type(read.pk) is AccountServingGate.Id
    assert json.loads(JSONRenderer().render({"gate_id": read.pk, "epoch_id": read.epoch_id})) == \
        {"gate_id": int(gate.pk), "epoch_id": None}


def test_typed_reference_columns_read_typed_and_refuse_other_kinds():
    execution = _execution()
    epoch = execution.projection.event.epoch
    lane = OrderingLaneStore.create(org_id=ORG, epoch=epoch, account_key="acct", route_key="r",
                                    partition_key=DIGEST, partition={}, state="open")
    with CaptureQueriesContext(connection) as queries:
        with pytest.raises(InvalidIdentity):
            OrderingLaneStore.touch(org_id=ORG, pk=lane.pk, state="open", version=1,
                                    set_fields={"active_execution_id": FlowRun.Id(int(execution.pk))})
    assert len(queries) == 0
    OrderingLaneStore.touch(org_id=ORG, pk=lane.pk, state="open", version=1,
                            set_fields={"active_execution_id": execution.pk})
    read = OrderingLane.objects.get(pk=lane.pk)
    assert type(read.active_execution_id) is Execution.Id and read.active_execution_id == execution.pk
    # The reference can be handed straight to the Execution store.
    with transaction.atomic():
        assert ExecutionStore.lock(ORG, read.active_execution_id).pk == execution.pk
    with pytest.raises(InvalidIdentity):
        OrderingLane.objects.filter(active_execution_id=FlowRun.Id(int(execution.pk))).exists()


def test_selectors_refuse_an_id_of_another_kind():
    execution = _execution()
    with CaptureQueriesContext(connection) as queries:
        with pytest.raises(InvalidIdentity):
            flow_run_get(org=OrgScope(ORG), run_id=execution.pk)
    assert len(queries) == 0
    assert flow_run_get(org=OrgScope(ORG), run_id=int(execution.pk)) is None


def test_to_python_refuses_another_models_id():
    from connectors.models import ServingEpoch as Epoch

    field = AccountServingGate._meta.pk
    with pytest.raises(InvalidIdentity):
        field.to_python(Epoch.Id(12))
    assert type(field.to_python(12)) is AccountServingGate.Id


@pytest.mark.parametrize("text", ["", "0", "01", "-1", "+1", " 1", "1 ", "1.0", "\u00b2", "\u0661", "\uff11",
                                  "9223372036854775808", "9" * 20, None])
def test_an_id_given_as_text_is_ascii_digits_below_2_63(text):
    from nexusflow.kernel.errors import InvalidIdentity
    from nexusflow.kernel.ids import id_from_text

    with pytest.raises(InvalidIdentity):
        id_from_text(text, FlowRun, field="run id")


def test_an_id_given_as_text_becomes_an_id_of_its_kind():
    from nexusflow.kernel.ids import id_from_text

    parsed = id_from_text("9223372036854775807", FlowRun, field="run id")
    assert parsed == 2**63 - 1 and type(parsed) is FlowRun.Id
