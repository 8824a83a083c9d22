"""Ingress API contract (issue: walking slice, item 7; seed 003 "Inbound facts")."""
import json

import pytest

from connectors.models import Event, Execution, Receipt, ReceiptAdmissionKey, ReceiptComponent
from tests.conftest import hubspot_event, make_serving_org, post_signed

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

URL = "/api/v2/ingress/crm-webhooks/webhooks/"


@pytest.fixture
def org(billing_sandbox):
    return make_serving_org(billing_sandbox.base_url, deploy_flow=False)


def test_ingress_answers_503_until_greenfield_activation(client, billing_sandbox):
    from cutover.services import cutover_greenfield
    from nexusflow.kernel.scope import OrgScope
    from tests.conftest import ORG, apply_service_configuration

    apply_service_configuration(OrgScope(ORG), billing_sandbox.base_url)
    response = post_signed(client, [hubspot_event(1, 501, 1000)])
    assert response.status_code == 503
    assert response["Retry-After"]
    assert response.json()["error"] == "not_serving"
    assert Receipt.objects.count() == 0
    cutover_greenfield(org=OrgScope(ORG))
    assert post_signed(client, [hubspot_event(1, 501, 1000)]).status_code == 202


def test_admission_then_redelivery_resolves_the_same_receipt(client, org):
    events = [hubspot_event(1, 501, 1000), hubspot_event(2, 501, 2000, "email", "a@example.com")]
    first = post_signed(client, events)
    assert first.status_code == 202
    receipt_id = first.json()["receipt_id"]
    for event in events:
        event["attemptNumber"] = 1
    events.reverse()
    again = post_signed(client, events)
    assert again.status_code == 200
    assert again.json() == {"receipt_id": receipt_id, "status": "redelivered"}
    assert Receipt.objects.count() == 1
    assert ReceiptAdmissionKey.objects.count() == 1
    assert Event.objects.count() == 2
    assert Execution.objects.count() == 2


def test_regrouped_redelivery_creates_no_new_event(client, org):
    assert post_signed(client, [hubspot_event(1, 501, 1000), hubspot_event(2, 502, 1000)]).status_code == 202
    response = post_signed(client, [hubspot_event(2, 502, 1000, attempt=1), hubspot_event(3, 503, 1000)])
    assert response.status_code == 202
    assert Event.objects.count() == 3
    dispositions = sorted(ReceiptComponent.objects.filter(receipt_id=response.json()["receipt_id"])
                          .values_list("disposition", flat=True))
    assert dispositions == ["duplicate", "event"]


@pytest.mark.parametrize("sign,code", [("invalid", "signature_invalid"), ("stale", "signature_stale"),
                                       ("missing", "signature_missing")])
def test_bad_signatures_are_401_and_admit_nothing(client, org, sign, code):
    response = post_signed(client, [hubspot_event(1, 501, 1000)], sign=sign)
    assert response.status_code == 401
    assert response.json()["error"] == code
    assert Receipt.objects.count() == 0


@pytest.mark.parametrize("body", ["not json", '{"a":1}', "[]", "\udcff".encode("utf-8", "surrogatepass").decode("latin-1")])
def test_bodies_the_route_cannot_accept_are_400(client, org, body):
    response = post_signed(client, body)
    assert response.status_code == 400
    assert response.json()["error"] == "malformed_body"
    assert Receipt.objects.count() == 0


def test_schema_failures_are_quarantined_and_the_batch_proceeds(client, org):
    good = hubspot_event(1, 501, 1000)
    bad_object = {**hubspot_event(2, 502, 1000), "objectId": "abc"}
    no_id = {k: v for k, v in hubspot_event(3, 503, 1000).items() if k != "eventId"}
    unknown = {**hubspot_event(4, 504, 1000), "subscriptionType": "contact.deletion"}
    not_object = 17
    response = post_signed(client, [good, bad_object, no_id, unknown, not_object])
    assert response.status_code == 202
    components = {c.ordinal: c for c in ReceiptComponent.objects.all()}
    assert components[0].disposition == "event"
    assert [components[i].reason_code for i in (1, 2, 3, 4)] == [
        "item_schema_invalid", "item_schema_invalid", "item_kind_unsupported", "item_not_object"]
    assert Event.objects.count() == 1
    assert Receipt.objects.get().quarantined_count == 4


def test_same_transport_key_with_other_content_is_a_conflict(client, org):
    assert post_signed(client, [hubspot_event(1, 501, 1000, "email", "a@x.io")]).status_code == 202
    response = post_signed(client, [hubspot_event(1, 501, 1000, "email", "b@x.io")])
    assert response.status_code == 409
    assert response.json()["error"] == "admission_conflict"
    assert Event.objects.get().payload["propertyValue"] == "a@x.io"


def test_unknown_account_or_channel_is_404(client, org):
    assert post_signed(client, [hubspot_event(1, 501, 1000)], account="nope").status_code == 404
    assert post_signed(client, [hubspot_event(1, 501, 1000)], channel="nope").status_code == 404


def test_openapi_schema_lists_the_ingress_endpoint(client, org):
    response = client.get("/api/schema/?format=json")
    assert response.status_code == 200
    assert "/api/v2/ingress/{account_key}/{channel}/" in json.loads(response.content)["paths"]


@pytest.mark.parametrize("path", [
    "/api/v2/ingress/%20crm-webhooks/webhooks/", "/api/v2/ingress/crm-webhooks/web%00hooks/",
    "/api/v2/ingress/" + "a" * 300 + "/webhooks/", "/api/v1/ingress/%20crm-webhooks/webhooks/",
], ids=["v2-padded-account", "v2-control-channel", "v2-over-length-account", "v1-padded-account"])
def test_a_path_key_that_names_no_route_is_unknown_ingress_not_a_malformed_body(client, org, path):
    response = client.post(path, data=b"[]", content_type="application/json")
    assert (response.status_code, response.json()["error"]) == (404, "unknown_ingress")
    assert not Receipt.objects.exists()


def test_an_org_named_in_the_payload_never_routes_the_webhook(client, org):
    """Seed 004 section 22.6: payload-supplied org identity cannot override trusted routing; the org comes
    from the authenticated ingress account alone, and a body that wraps events under an org is refused."""
    from connectors.models import Projection
    from tests.conftest import ORG

    victim = "victim-org"
    event = {**hubspot_event(1, 501, 1000), "org_id": victim, "orgId": victim, "portalId": victim}
    admitted = post_signed(client, [event])
    assert admitted.status_code == 202
    for model in (ReceiptAdmissionKey, Receipt, Event, Projection, Execution):
        assert set(model.objects.values_list("org_id", flat=True)) == {ORG}, model.__name__
    wrapped = post_signed(client, {"org_id": victim, "events": [hubspot_event(2, 502, 1000)]})
    assert (wrapped.status_code, wrapped.json()["error"]) == (400, "malformed_body")
    assert Receipt.objects.count() == 1 and not Receipt.objects.filter(org_id=victim).exists()
