"""Source order per (objectId, propertyName): latest (occurredAt, eventId) wins, compared with the pack oracle."""
import pytest

from packs.hubspot.fixtures.make_demo_webhooks import expected_final_state
from packs.hubspot.sender import Delivery
from tests.adversarial.helpers import local_by_object_id
from tests.conftest import drain, hubspot_event, post_signed

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])


def _apply(client, *batches):
    for batch in batches:
        assert post_signed(client, batch).status_code in (200, 202)
    drain()
    oracle = expected_final_state([Delivery(b) for b in batches])
    local = {k: {p: r.fields.get(p) for p in oracle.get(k, {})} for k, r in local_by_object_id().items()}
    return oracle, local


def test_creation_event_carrying_property_name_does_not_swallow_a_change(client, serving_org):
    change = hubspot_event(2, 901, 2000, "email", "a@x.io")
    creation = {**hubspot_event(5, 901, 3000), "propertyName": "email"}  # odd but schema-valid creation
    oracle, local = _apply(client, [change, creation])
    assert oracle == {"901": {"email": "a@x.io"}}
    assert local == oracle, local


@pytest.mark.parametrize("order", ["first_then_second", "second_then_first", "separate_receipts"])
def test_equal_positions_across_subscriptions_resolve_the_same_way_in_any_arrival_order(client, serving_org, order):
    first = hubspot_event(7, 902, 2000, "firstname", "First", subscription_id=202)
    second = hubspot_event(7, 902, 2000, "firstname", "Second", subscription_id=203)
    batches = {"first_then_second": [[first, second]], "second_then_first": [[second, first]],
               "separate_receipts": [[second], [first]]}[order]
    oracle, local = _apply(client, *batches)
    # The framed SourceEventKey closes the order: subscription 203 sorts after 202.
    assert oracle == {"902": {"firstname": "Second"}}
    assert local == oracle, local


def test_late_older_event_in_new_receipt_is_ignored(client, serving_org):
    newer = [hubspot_event(1, 903, 1000), hubspot_event(9, 903, 5000, "email", "new@x.io")]
    older = [hubspot_event(3, 903, 4000, "email", "old@x.io")]
    oracle, local = _apply(client, newer, older)
    assert local == oracle == {"903": {"email": "new@x.io"}}


def test_negative_and_extreme_positions(client, serving_org):
    a = hubspot_event(-(2 ** 63), 904, -(2 ** 63), "email", "min@x.io")
    b = hubspot_event(2 ** 63 - 1, 904, 2 ** 63 - 1, "email", "max@x.io")
    c = hubspot_event(0, 904, 0, "email", "zero@x.io")
    oracle, local = _apply(client, [b, c, a])
    assert local == oracle == {"904": {"email": "max@x.io"}}
