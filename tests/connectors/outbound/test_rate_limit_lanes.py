"""Provider rate limits are shared by every worker sending with one credential (seed 004 section 16; issue 22
item 3).

What was seen before: after a 429 with ``Retry-After: 2`` on one push, two other pushes to the same account
were sent inside the window; repeated daily-limit 429s ended a push ``no_effect`` / ``retry_exhausted``.
Here a rate-limit answer pauses the credential's dispatch lane on its dispatch gate (the row every grant
locks), 429s never count toward ``retry.max_attempts``, and a daily limit the billing profile declares
(``X-RateLimit-Scope: daily``) pauses until the next reset, shown by ``effects list``. Windows pass by moving
the database clock, never by waiting.
"""
from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command

from connectors.contracts import outcomes
from connectors.models import CredentialGenerationDispatchGate, DispatchPermit, RemoteEffect
from connectors.outbound import egress
from connectors.outbound.permit_settle import daily_reset
from nexusflow.kernel.clock import db_now
from tests.concurrency import race_behind_hold
from tests.conftest import ORG, drain, make_serving_org
from tests.connectors.outbound.test_outbound_effects import GATE_TABLE, _push
from tests.kits.outbound import zero_backoff

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

RETRY_AFTER_429 = {"status": 429, "count": 1, "headers": {"Retry-After": "2"}}


@pytest.fixture
def org(billing_sandbox):
    return make_serving_org(billing_sandbox.base_url, deploy_flow=False)


def _listed() -> dict[int, dict]:
    out = io.StringIO()
    call_command("effects", "list", "--org", ORG, "--json", stdout=out)
    return {row["effect"]: row for row in json.loads(out.getvalue())}


def _gate() -> CredentialGenerationDispatchGate:
    return CredentialGenerationDispatchGate.objects.get(org_id=ORG, credential_generation__account_key="billing-main")


def test_a_retry_after_429_pauses_the_account_lane_for_every_other_push(org, billing_sandbox, db_clock_advance):
    commands = [_push(f"p{i}@x.io", slot=f"push-{i}") for i in range(3)]
    billing_sandbox.set_faults(fail_before_commit=RETRY_AFTER_429)
    assert egress.effect_try_dispatch_one(worker_id="w1")
    first = RemoteEffect.objects.get(command=commands[0])
    assert (first.state, first.reason_code) == ("prepared", "")
    gate = _gate()
    assert (gate.pause_kind, gate.pause_status) == ("rate_limited", 429)
    assert gate.paused_until > db_now()

    # Other workers, other pushes of the same account: nothing is granted, nothing is sent inside the window.
    assert not egress.effect_try_dispatch_one(worker_id="w2")
    assert not egress.effect_try_dispatch_one(worker_id="w3")
    assert billing_sandbox.state()["requests"] == 1
    assert DispatchPermit.objects.filter(org_id=ORG).count() == 1
    listed = _listed()
    for command in commands:
        effect = RemoteEffect.objects.get(command=command)
        assert listed[int(effect.pk)]["lane_paused"] == {"kind": "rate_limited", "until": gate.paused_until.isoformat(),
                                                         "status": 429}

    db_clock_advance(3)
    drain()
    assert set(RemoteEffect.objects.filter(org_id=ORG).values_list("state", flat=True)) == {"finalized"}
    assert billing_sandbox.state()["requests"] == 4
    assert all(row["lane_paused"] is None for row in _listed().values())


def test_a_grant_queued_behind_the_pause_sees_it_and_sends_nothing(org, billing_sandbox, holds):
    """Real concurrent workers: the pause commits while another worker's grant waits on the gate row."""
    first, second = _push("a@x.io", slot="push-a"), _push("b@x.io", slot="push-b")
    billing_sandbox.set_faults(fail_before_commit=RETRY_AFTER_429)
    settle, grant = race_behind_hold(
        holds, "permit.lane_pause_before_commit",
        lambda: egress.effect_try_dispatch_one(worker_id="w1"),
        lambda: egress.permit_try_grant_one(worker_id="w2"),
        GATE_TABLE, names=("settle", "grant"))

    assert settle.error is None and grant.error is None
    assert settle.result is True and grant.result is None
    assert RemoteEffect.objects.get(command=first).state == "prepared"
    waiting = RemoteEffect.objects.get(command=second)
    assert (waiting.state, waiting.attempt_count) == ("prepared", 0)
    assert waiting.next_attempt_at == _gate().paused_until  # off the claim scan until the window ends
    assert DispatchPermit.objects.filter(org_id=ORG).count() == 1
    assert billing_sandbox.state()["requests"] == 1


def test_daily_limit_429s_pause_until_the_reset_and_never_exhaust_the_push(org, billing_sandbox, db_clock_advance):
    command = _push()
    billing_sandbox.set_faults(fail_before_commit={"status": 429, "count": 1000,
                                                   "headers": {"X-RateLimit-Scope": "daily", "Retry-After": "2"}})
    max_attempts = 10  # packs/billing/pack.json retry.max_attempts
    for attempt in range(1, max_attempts + 3):
        assert egress.effect_try_dispatch_one(worker_id="w1")
        effect = RemoteEffect.objects.get(command=command)
        assert (effect.state, effect.reason_code, effect.attempt_count) == ("prepared", "", attempt)
        gate = _gate()
        now = db_now()
        assert (gate.pause_kind, gate.paused_until) == ("daily_limit", daily_reset(now, 0))
        assert _listed()[int(effect.pk)]["lane_paused"]["kind"] == "daily_limit"
        assert not egress.effect_try_dispatch_one(worker_id="w2")  # nothing before the reset
        assert billing_sandbox.state()["requests"] == attempt
        db_clock_advance((gate.paused_until - now).total_seconds() + 1)
    billing_sandbox.set_faults(fail_before_commit={"status": 429, "count": 0})
    drain()
    effect = RemoteEffect.objects.get(command=command)
    assert (effect.state, effect.attempt_count) == ("finalized", max_attempts + 3)


def test_other_not_performed_answers_still_exhaust_and_429s_are_not_counted(org, billing_sandbox, db_clock_advance):
    """409 (not performed, not a rate limit) counts; earlier 429 Attempts do not."""
    command = _push()
    billing_sandbox.set_faults(fail_before_commit={"status": 429, "count": 3})
    for _ in range(3):
        zero_backoff()
        assert egress.effect_try_dispatch_one(worker_id="w1")
    billing_sandbox.set_faults(fail_before_commit={"status": 409, "count": 1000})
    for _ in range(10):
        zero_backoff()
        assert egress.effect_try_dispatch_one(worker_id="w1")
    effect = RemoteEffect.objects.get(command=command)
    assert (effect.state, effect.reason_code, effect.attempt_count) == ("no_effect", "retry_exhausted", 13)


@pytest.mark.parametrize("block, message", [
    ({"statuses": [500]}, "not_performed"),
    ({"statuses": []}, "not_performed"),
    ({"daily": {"header": "X-Scope"}}, "daily must name"),
    ({"daily": {"header": "bad header", "value": "daily"}}, "daily must name"),
    ({"daily": {"header": "X-Scope", "value": "daily", "reset_hour_utc": 24}}, "reset_hour_utc"),
    ({"weekly": {}}, "rate_limit must be"),
])
def test_a_malformed_rate_limit_declaration_is_refused(block, message):
    profile = {"outcomes": {"not_performed": [429], "ambiguous": [500]}, "retry": {"max_attempts": 3},
               "idempotency": {"replay_safe": False}, "rate_limit": block}
    with pytest.raises(ValueError, match=message):
        outcomes.validate_profile(profile)
