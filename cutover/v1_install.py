"""``cutover v1-install``: set up a fresh V1 install (seed 003 "Offline V1 shutdown, cold rollback, and V2 cutover").

A fresh V1 install serves the V1 runtime (:mod:`connectors.v1`) with every
AccountServingGate in ``v1_serving``, the initial state a configuration gives
each new account (seed 003 "State machines"). This registers every configured
account with V1 ingress, opens a V1 stream cursor for every enabled pulled
route, and records one ``v1_install`` evidence row per account naming the
configuration generation and the exact V1 release, and creates the org's three
V1 maintenance barriers open (:mod:`connectors.v1.barriers`). It is idempotent;
rerun it on an older install to add missing barriers.
"""
from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction

from connectors.models import PackGeneration
from connectors.v1.barriers import v1_barriers_install
from connectors.v1.generations import v1_release
from connectors.v1.models import V1Account, V1StreamCursor
from connectors.v1.store import V1StreamCursorStore
from nexusflow.kernel.models import insert
from nexusflow.kernel.scope import OrgScope

from .services import CutoverRefused, _evidence, v1_serving_configuration


@dataclass
class V1InstallReport:
    """``accounts``: every account V1 serves; ``cursors``: ``account/route`` of each V1 stream cursor."""

    configuration_generation: int
    release: str
    accounts: list[str]
    cursors: list[str]
    created: int


def cutover_v1_install(*, org: OrgScope) -> V1InstallReport:
    """Install the V1 runtime for ``org``: V1 accounts, V1 stream cursors and ``v1_install`` evidence.

    Returns:
        :class:`V1InstallReport` (``created`` counts the V1 rows this call added; 0 on a rerun).

    Raises:
        CutoverRefused: the org has no configuration or accounts, a gate is not ``v1_serving`` (the org
            is being cut over or already serves V2), or an account key is registered for another org.
    """
    generation, gates = v1_serving_configuration(org=org, purpose="a V1 install serves only v1_serving gates")
    release = v1_release()
    created, accounts, cursors = v1_barriers_install(org_id=org.org_id), [], []
    for account in generation.document["accounts"]:
        key = account["account_key"]
        with transaction.atomic(durable=True):
            registered = V1Account.objects.filter(account_key=key).first()
            if registered is not None and registered.org_id != org.org_id:
                raise CutoverRefused(f"account {key} is a V1 account of another org")
            if registered is None:
                insert(V1Account, org_id=org.org_id, account_key=key, pack_key=account["pack_key"])
                created += 1
            pack = PackGeneration.objects.get(pk=account["pack_generation_id"]).document
            for route in pack.get("inbound_routes", []):
                if route["route_key"] not in account["routes"] or route.get("delivery", "push") != "pull":
                    continue
                if not V1StreamCursor.objects.filter(org_id=org.org_id, account_key=key,
                                                     route_key=route["route_key"]).exists():
                    V1StreamCursorStore.create(org_id=org.org_id, account_key=key, route_key=route["route_key"],
                                               state="polling")
                    created += 1
                cursors.append(f"{key}/{route['route_key']}")
            _evidence(org, f"v1-install-{generation.generation}", "v1_install", key,
                      {"configuration_generation": generation.generation, "configuration_digest": generation.digest,
                       "v1_release": release})
        accounts.append(key)
    return V1InstallReport(generation.generation, release, accounts, cursors, created)
