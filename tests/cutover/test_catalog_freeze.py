"""The Catalog and binding-definition owners stay frozen through activation (seed 003 "Generation and replay").

A pack publication is deployment-wide and immutable: it adds a PackGeneration and its CatalogBindings and
changes none. An org's Catalog view is the exact pack generations its configuration generation froze
(``epoch.document["accounts"][*]["pack_generation"]``), and only a configuration publication, which the
org's ServingPublicationBarrierSet refuses while held, can point the org at another one. So a pack published
while an activation holds the barriers is admitted, and the activation still commits the Catalog view it froze.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.conf import settings

from connectors.models import PackGeneration, ServingEpoch, ServingPublicationBarrierSet
from connectors.serving.gates import service_configuration_apply
from connectors.serving.generations import pack_publish
from connectors.serving.publication import PublicationBarrierHeld, barrier_acquire, barrier_hold, owner_receipts
from cutover.activate import cutover_activate
from cutover.decision import decision_of
from tests.conftest import ORG, service_document
from tests.cutover.conftest import ATTEMPT
from tests.cutover.test_activate import _assert_activated

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])


def _billing_successor() -> dict:
    document = json.loads((Path(settings.NEXUS_PACKS_DIR) / "billing" / "pack.json").read_text())
    document["version"] = document["version"] + "-successor"
    document["callout_profiles"][0]["timeout_seconds"] += 1
    return document


def test_a_pack_published_while_the_barriers_are_held_leaves_the_frozen_catalog_view_and_activation_commits_it(
        validated, billing_sandbox):
    epoch = ServingEpoch.objects.get(pk=decision_of(ORG, ATTEMPT).epoch_id)
    holding = barrier_acquire(org=validated, attempt_key=ATTEMPT, epoch=epoch)
    frozen = owner_receipts(org=validated, epoch=epoch)
    barrier_hold(org=validated, holding=holding, receipts=frozen)

    successor, created = pack_publish(document=_billing_successor())
    assert created and successor.pk not in {ref["id"] for ref in frozen["packs"].values()}
    assert owner_receipts(org=validated, epoch=epoch) == frozen  # the Catalog view did not move
    with pytest.raises(PublicationBarrierHeld):  # pointing the org at the new pack is a configuration publication
        service_configuration_apply(org=validated, document=service_document(billing_sandbox.base_url))

    cutover_activate(org=validated, attempt_key=ATTEMPT)  # the takeover commits under the same set
    _assert_activated()
    committed = ServingPublicationBarrierSet.objects.get(org_id=ORG)
    assert committed.receipts["packs"] == frozen["packs"]
    served = {a["account_key"]: a["pack_generation"]["id"] for a in ServingEpoch.objects.get(pk=epoch.pk)
              .document["accounts"]}
    assert successor.pk not in served.values()
    assert PackGeneration.objects.filter(pk=successor.pk).exists()
