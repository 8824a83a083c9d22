"""The producer contracts of Flow waits (seed 004 section 14.1): every producer a wait can name is registered."""
from __future__ import annotations

import pytest

from nexusflow.flows.producers import (
    PRODUCER_CLOCK,
    PRODUCER_RECORD,
    PRODUCER_RUNTIME_INTENT,
    PRODUCERS,
    UnknownProducer,
    producer_contract,
)


def test_every_producer_a_wait_writes_is_registered_with_its_whole_contract():
    assert {PRODUCER_CLOCK, PRODUCER_RUNTIME_INTENT, PRODUCER_RECORD} <= set(PRODUCERS)
    for kind, contract in PRODUCERS.items():
        assert contract.kind == kind
        assert all(contract.as_dict()[k] for k in ("notification", "wake_identity", "resolution_receipt", "expiry"))
    # only its owner's finalize can tell whether a remote effect happened: no hand signal for an intent receipt
    assert producer_contract(PRODUCER_RUNTIME_INTENT).operator_signal is None
    assert producer_contract(PRODUCER_CLOCK).operator_signal


@pytest.mark.parametrize("kind", ["runtime.nothing", "", "Runtime.Clock", "runtime.clock "])
def test_an_unregistered_producer_is_refused_by_name(kind):
    with pytest.raises(UnknownProducer) as refused:
        producer_contract(kind)
    assert refused.value.code == "flow_producer_unknown" and "runtime.clock" in str(refused.value)
