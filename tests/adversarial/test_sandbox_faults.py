"""Billing sandbox faults combined with several updates for one contact."""
import datetime as dt
import time

import pytest

from connectors.models import RemoteEffect
from tests.adversarial.helpers import check_end_state
from tests.conftest import drain, hubspot_event, post_signed

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])


@pytest.fixture
def no_backoff(monkeypatch):
    from connectors.outbound import permit_settle, recovery

    for step in (permit_settle, recovery):
        monkeypatch.setattr(step, "backoff", lambda attempts: dt.timedelta(0))


def _drain_until_settled(timeout=90):
    deadline = time.time() + timeout
    while time.time() < deadline:
        drain()
        if not RemoteEffect.objects.filter(state__in=("prepared", "dispatching", "uncertain", "remote_confirmed")).exists():
            return
        time.sleep(0.3)


def _post_updates(client, object_id=901, n=4, base=1):
    batch = [hubspot_event(base, object_id, 1000), hubspot_event(base + 1, object_id, 1500, "lifecyclestage", "customer"),
             hubspot_event(base + 2, object_id, 2000, "email", "v0@x.io")]
    assert post_signed(client, batch).status_code == 202
    drain()
    for i in range(1, n + 1):
        assert post_signed(client, [hubspot_event(base + 10 + i, object_id, 2000 + i, "email", f"v{i}@x.io"),
                                    hubspot_event(base + 30 + i, object_id, 2000 + i, "firstname", f"F{i}")]).status_code == 202
        drain()
    return {str(object_id): {"email": f"v{n}@x.io", "firstname": f"F{n}", "lifecyclestage": "customer"}}


def _summary():
    return [(e.pk, e.state, e.reason_code, e.attempt_count) for e in RemoteEffect.objects.order_by("id")]


@pytest.mark.parametrize("status", [429, 503, 500])
def test_retryable_status_storm_does_not_lose_final_values(client, serving_org, no_backoff, status):
    sandbox = serving_org.sandbox
    sandbox.set_faults(fail_before_commit={"status": status, "count": 8})
    expected = _post_updates(client)
    _drain_until_settled()
    assert not check_end_state(expected, sandbox), (check_end_state(expected, sandbox), _summary())
    assert len(sandbox.state()["customers"]) == 1


def test_dropped_responses_with_many_updates(client, serving_org, no_backoff):
    sandbox = serving_org.sandbox
    sandbox.set_faults(drop_response_after_commit=5)
    expected = _post_updates(client, n=5)
    _drain_until_settled()
    problems = check_end_state(expected, sandbox)
    assert not problems, (problems, _summary())
    assert len(sandbox.state()["customers"]) == 1
    assert set(RemoteEffect.objects.values_list("state", flat=True)) == {"finalized"}


def test_slow_provider_beyond_timeout_with_updates(client, serving_org):
    sandbox = serving_org.sandbox
    sandbox.set_faults(delay_seconds=6)  # the callout profile times out after 5 s
    expected = _post_updates(client, n=2)
    sandbox.set_faults(delay_seconds=0)
    _drain_until_settled(timeout=120)
    problems = check_end_state(expected, sandbox)
    assert not problems, (problems, _summary())
    assert len(sandbox.state()["customers"]) == 1


@pytest.mark.chaos
def test_rate_limit_storm_with_real_backoff_converges(client, serving_org):
    """The 429 case with the shipped backoff: "not performed" answers retry without exhausting the budget."""
    sandbox = serving_org.sandbox
    sandbox.set_faults(fail_before_commit={"status": 429, "count": 8})
    expected = _post_updates(client, n=2)
    _drain_until_settled(timeout=150)
    problems = check_end_state(expected, sandbox)
    assert not problems, (problems, _summary())
