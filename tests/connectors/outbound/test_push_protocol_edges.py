"""Seed 002 edges found by attacking the push protocol: no repeat for a deleted source, out-of-band conflicts.

Real MariaDB, the billing and CRM objects sandboxes; provider answers that
the sandboxes cannot be made to give are served by an ``httpx`` mock transport
at the same adapter call.
"""
from __future__ import annotations

import httpx
import pytest

from connectors import reasons
from connectors.models import RemoteEffect, RemoteEffectAttempt, RemoteLink, RemoteLinkEvidence
from connectors.outbound import egress
from connectors.outbound.effect_decisions import effect_reconcile
from tests.conftest import ORG, drain
from tests.connectors.push_helpers import (
    BILLING,
    PushEnv,
    contact,
    delete,
    effect_of,
    push_env,
    push_link,
    save,
    zero_backoff,
)

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])


@pytest.fixture
def env(billing_sandbox, hubspot_crm_sandbox) -> PushEnv:
    return push_env(billing_sandbox, hubspot_crm_sandbox)


def test_an_uncertain_create_is_not_repeated_once_its_source_is_deleted(env):
    """Seed 002 "Retry And Recovery Semantics" 7: the exact repeat of a replay-safe create re-checks the source."""
    record = contact("gone@x.io")
    command = save(record, contract=BILLING)
    env.billing.set_faults(drop_response_after_commit=1)
    assert egress.effect_try_dispatch_one(worker_id="w1")
    effect = effect_of(command)
    assert effect.state == "uncertain"
    requests = env.billing.state()["requests"]
    delete(record)
    zero_backoff()
    drain()
    effect.refresh_from_db()
    assert (effect.state, effect.reason_code) == ("quarantined", reasons.SOURCE_DELETED_BEFORE_POST)
    assert env.billing.state()["requests"] == requests, "no repeat for a deleted source"
    assert RemoteEffectAttempt.objects.filter(effect=effect).count() == 1


def test_a_patch_refused_as_a_conflict_suspends_the_link_by_default(env):
    """Seed 002 "Before PATCH": without a declared reconciliation contract an out-of-band conflict suspends."""
    record = contact("ann@x.io")
    save(record)
    drain()
    link = push_link(record)
    command = save(record, lastname="Park")
    conflict = httpx.Client(transport=httpx.MockTransport(lambda request: httpx.Response(
        409, json={"status": "error", "message": "Contact already exists. Existing ID: 999", "category": "CONFLICT"})))
    with conflict:
        assert egress.effect_try_dispatch_one(worker_id="w1", client=conflict)
    assert effect_of(command).state == "no_effect"
    link.refresh_from_db()
    assert (link.state, link.reason_code) == ("suspended_drift", reasons.REMOTE_CONFLICT)
    assert RemoteLinkEvidence.objects.get(link=link).detail["status"] == 409
    later = save(record, lastname="Lee")
    drain()
    assert (effect_of(later).state, effect_of(later).reason_code) == ("quarantined", reasons.LINK_NOT_PATCHABLE)
    assert env.hubspot.state()["requests_by_route"].get("POST /crm/v3/objects/contacts") == 1


def test_an_operator_confirmation_is_refused_for_a_remote_id_another_link_holds(env):
    """The hard remote-locator index holds for operator reconciliation too: nothing is written."""
    first = contact("one@x.io")
    save(first, contract=BILLING)
    drain()
    taken = push_link(first, BILLING).remote_id
    second = contact("two@x.io")
    command = save(second, contract=BILLING)
    env.billing.set_faults(drop_response_after_commit=1)
    assert egress.effect_try_dispatch_one(worker_id="w1")
    effect = effect_of(command)
    from connectors.outbound.effect_decisions import EffectOperationRefused

    with pytest.raises(EffectOperationRefused) as refused:
        effect_reconcile(org_id=ORG, effect_id=effect.pk, outcome="confirmed", remote_id=taken, actor="ops",
                         note="looked it up")
    assert refused.value.code == "remote_id_conflict"
    assert RemoteEffect.objects.get(pk=effect.pk).state == "uncertain"
    assert push_link(first, BILLING).state == "active"


def test_a_link_of_another_remote_scope_is_never_patched_nor_revalidated_into_service(env):
    """The remote destination scope is part of a link's identity (seed 002 "Link Key" remote-locator rule).

    A link created while another account served the slot (an account renamed or replaced in
    configuration: the row below is given that older scope) names a record of that account's
    provider tenant; the serving account must not PATCH it, and revalidation refuses to put it back.
    """
    from django.db import connection

    from connectors.links.link_decisions import LinkOperationRefused, link_revalidate

    record = contact("scope@x.io")
    save(record, contract=BILLING)
    drain()
    link = push_link(record, BILLING)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE connectors_remotelink SET remote_scope = %s WHERE id = %s",
                       ["billing-previous", int(link.pk)])
    requests = env.billing.state()["requests"]
    command = save(record, contract=BILLING, lastname="Moved")
    drain()
    effect = effect_of(command)
    assert (effect.state, effect.reason_code) == ("quarantined", reasons.LINK_NOT_PATCHABLE)
    assert env.billing.state()["requests"] == requests
    link.refresh_from_db()
    assert (link.state, link.reason_code) == ("suspended_drift", reasons.LINK_DRIFT)
    assert RemoteLinkEvidence.objects.get(link=link).detail["surfaces"] == ["remote_scope"]
    with pytest.raises(LinkOperationRefused) as refused:
        link_revalidate(org_id=ORG, link_key=link.link_key, actor="ops", reason="looks fine")
    assert refused.value.code == "revalidate_scope_mismatch"
    assert RemoteLink.objects.get(pk=link.pk).state == "suspended_drift"


def test_a_refused_repeat_of_an_ambiguous_create_never_proves_no_effect(env):
    """Seed 002 "After POST": an earlier create may have landed; a later refusal of its exact repeat is no proof."""
    from runtime_outbox.services import SuccessorRefused, outbound_command_author_successor

    record = contact("twice@x.io")
    command = save(record, contract=BILLING)
    env.billing.set_faults(drop_response_after_commit=1)
    assert egress.effect_try_dispatch_one(worker_id="w1")
    effect = effect_of(command)
    assert effect.state == "uncertain"
    zero_backoff()
    assert egress.effect_try_reconcile_one()  # replay-safe: the exact repeat is released
    refusal = httpx.Client(transport=httpx.MockTransport(lambda request: httpx.Response(
        400, json={"error": {"type": "invalid_request_error", "message": "refused"}})))
    with refusal:
        assert egress.effect_try_dispatch_one(worker_id="w1", client=refusal)
    effect.refresh_from_db()
    assert (effect.state, effect.reason_code) == ("uncertain", reasons.RESPONSE_AMBIGUOUS)
    with pytest.raises(SuccessorRefused) as refused:
        outbound_command_author_successor(org_id=ORG, predecessor_command_id=command.pk, actor="ops", reason="again")
    assert refused.value.code == "predecessor_uncertain"
