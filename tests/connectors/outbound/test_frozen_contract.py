"""A dispatch reads its frozen pack generation once per process, and still refuses a digest it did not freeze."""
from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from connectors.models import PackGeneration, RemoteEffect
from connectors.outbound import egress_common
from connectors.outbound.egress_common import EgressRefused, frozen_contract
from runtime_outbox.models import OutboundCommand
from tests.conftest import make_serving_org

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])


def _effect(pack: PackGeneration, digest: str) -> RemoteEffect:
    contract = pack.document["push_contracts"][0]
    command = OutboundCommand(frozen_binding={"pack_generation": {"id": pack.pk, "digest": digest},
                                              "contract_key": contract["contract_key"]})
    return RemoteEffect(org_id="test-org", command=command)


def _pack_reads(queries) -> int:
    return sum(1 for q in queries if PackGeneration._meta.db_table in q["sql"])


def test_the_generation_is_read_once_and_a_frozen_digest_it_does_not_have_is_refused(billing_sandbox, monkeypatch):
    make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    monkeypatch.setattr(egress_common, "_FROZEN_CONTRACTS", {})
    pack = next(p for p in PackGeneration.objects.all() if p.document.get("push_contracts"))
    effect = _effect(pack, pack.digest)
    with CaptureQueriesContext(connection) as first:
        _binding, contract, profile = frozen_contract(effect)
    with CaptureQueriesContext(connection) as again:
        assert frozen_contract(_effect(pack, pack.digest))[1:] == (contract, profile)
    assert (_pack_reads(first.captured_queries), _pack_reads(again.captured_queries)) == (1, 0)
    assert contract["contract_key"] == pack.document["push_contracts"][0]["contract_key"]
    # A binding that froze another digest of the same id is checked against the row, and refused.
    with CaptureQueriesContext(connection) as other, pytest.raises(EgressRefused, match="digest mismatch"):
        frozen_contract(_effect(pack, "0" * 64))
    assert _pack_reads(other.captured_queries) == 1
