"""Adversarial inputs: every signed body gets a 2xx or a 4xx with a stable code, never a 5xx."""
import json
import time

import pytest

from tests.conftest import WEBHOOK_SECRET, hubspot_event, post_signed

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

BASE = hubspot_event(1, 901, 1000)


def post_raw(client, body: bytes):
    from connectors.contracts.signatures import header_timestamp, sign_request
    from packs.hubspot.sender import webhook_route

    auth = webhook_route()["auth"]
    url = "http://testserver/api/v2/ingress/crm-webhooks/webhooks/"
    headers = sign_request(auth, secret=WEBHOOK_SECRET.encode(), method="POST", url=url, body=body,
                           timestamp=header_timestamp(auth, epoch_seconds=time.time()))
    return client.post(url, data=body, content_type="application/json", headers=headers)


BODIES = {
    "nan_in_item": '[{"eventId":1,"subscriptionId":101,"objectId":901,"occurredAt":1000,'
                   '"subscriptionType":"contact.creation","junk":NaN}]',
    "nan_item": "[NaN]",
    "infinity_float": '[{"eventId":1,"subscriptionId":101,"objectId":901,"occurredAt":1000,'
                      '"subscriptionType":"contact.creation","junk":1e400}]',
    "lone_surrogate": '[{"eventId":1,"subscriptionId":101,"objectId":901,"occurredAt":1000,'
                      '"subscriptionType":"contact.creation","junk":"\\ud800"}]',
    "lone_surrogate_value": '[{"eventId":2,"subscriptionId":202,"objectId":901,"occurredAt":1000,'
                            '"subscriptionType":"contact.propertyChange","propertyName":"email",'
                            '"propertyValue":"\\udfff"}]',
    "deep_nesting": "[" * 200000 + "]" * 200000,
    "huge_object_id": json.dumps([hubspot_event(1, 10 ** 400, 1000)]),
    "huge_subscription_id": json.dumps([hubspot_event(1, 901, 1000, subscription_id=10 ** 300)]),
    "huge_int_4301_digits": '[{"eventId":1,"subscriptionId":101,"objectId":' + "9" * 5000
                            + ',"occurredAt":1000,"subscriptionType":"contact.creation"}]',
    "float_ids": json.dumps([{**BASE, "eventId": 1.0, "objectId": 901.5}]),
    "bool_ids": json.dumps([{**BASE, "eventId": True, "objectId": False}]),
    "big_event_id": json.dumps([{**BASE, "eventId": 2 ** 64}]),
    "nul_in_value": json.dumps([hubspot_event(3, 901, 1000, "email", "a\u0000b")]),
    "long_value": json.dumps([hubspot_event(4, 901, 1000, "email", "x" * 100000)]),
    "long_property_name": json.dumps([hubspot_event(5, 901, 1000, "p" * 300, "v")]),
    "unicode_property": json.dumps([hubspot_event(6, 901, 1000, "e\u0301mail", "v")]),
    "object_body": json.dumps({"events": [BASE]}),
    "scalar_items": json.dumps([1, "x", None, True, [], {}]),
    "invalid_utf8": b"[\xff\xfe]",
    "bom": "\ufeff" + json.dumps([BASE]),
    "string_json": json.dumps("[]"),
    "empty": "",
    "null": "null",
}


@pytest.mark.parametrize("name", sorted(BODIES))
def test_bad_body_is_never_5xx(client, serving_org, name):
    body = BODIES[name]
    body = body if isinstance(body, bytes) else body.encode("utf-8")
    response = post_raw(client, body)
    assert response.status_code < 500, (name, response.status_code, response.content[:300])
    # redelivery of the same bytes must give the same class of answer
    again = post_raw(client, body)
    assert again.status_code < 500, (name, again.status_code)
    if response.status_code == 202:
        assert again.status_code == 200 and again.json() == {**response.json(), "status": "redelivered"}


def test_ten_megabyte_body_is_not_5xx(client, serving_org):
    events = [hubspot_event(i, 900 + i, 1000 + i, "firstname", "x" * 100_000) for i in range(1, 100)]
    response = post_signed(client, events)
    assert response.status_code < 500, response.status_code


def _post_headers(client, headers, body=b"[]"):
    url = "http://testserver/api/v2/ingress/crm-webhooks/webhooks/"
    return client.post(url, data=body, content_type="application/json", headers=headers)


@pytest.mark.parametrize("headers", [
    {"X-HubSpot-Signature-v3": "!!!", "X-HubSpot-Request-Timestamp": str(int(time.time() * 1000))},
    {"X-HubSpot-Signature-v3": "abc=", "X-HubSpot-Request-Timestamp": "9" * 19},
    {"X-HubSpot-Signature-v3": "abc=", "X-HubSpot-Request-Timestamp": "9" * 400},
    {"X-HubSpot-Signature-v3": "abc=", "X-HubSpot-Request-Timestamp": "-1"},
    {"X-HubSpot-Signature-v3": "abc=", "X-HubSpot-Request-Timestamp": "1e3"},
    {"X-HubSpot-Signature-v3": "\u00e9\u00e9", "X-HubSpot-Request-Timestamp": str(int(time.time() * 1000))},
    {"X-HubSpot-Signature-v3": "", "X-HubSpot-Request-Timestamp": ""},
    {},
])
def test_header_edge_cases_are_4xx(client, serving_org, headers):
    response = _post_headers(client, headers)
    assert 400 <= response.status_code < 500, (headers, response.status_code)


@pytest.mark.parametrize("path", [
    "/api/v2/ingress/crm-webhooks/other/", "/api/v2/ingress/nope/webhooks/",
    "/api/v2/ingress/crm%00webhooks/webhooks/", "/api/v2/ingress/%C3%A9/webhooks/",
    "/api/v2/ingress/" + "a" * 5000 + "/webhooks/", "/api/v2/ingress/crm-webhooks/%ff/",
])
def test_odd_paths_are_4xx(client, serving_org, path):
    response = client.post(path, data=b"[]", content_type="application/json")
    assert 400 <= response.status_code < 500, (path, response.status_code)


def test_bad_value_is_rejected_not_crash(client, serving_org):
    from tests.conftest import drain

    batch = [hubspot_event(1, 901, 1000), hubspot_event(2, 901, 2000, "email", "y" * 5000),
             hubspot_event(3, 901, 3000, "firstname", "a\u0000b")]
    assert post_signed(client, batch).status_code == 202
    drain()
    from connectors.models import Execution
    assert not Execution.objects.filter(state="ready").exists()


@pytest.mark.parametrize("content_type", ["multipart/form-data; boundary=xyz", "application/x-www-form-urlencoded",
                                          "text/plain; charset=latin-1", "application/json; charset=utf-16", ""])
def test_content_types_never_5xx(client, serving_org, content_type):
    from connectors.contracts.signatures import header_timestamp, sign_request
    from packs.hubspot.sender import webhook_route

    body = json.dumps([hubspot_event(11, 990, 1000)]).encode()
    auth = webhook_route()["auth"]
    url = "http://testserver/api/v2/ingress/crm-webhooks/webhooks/"
    headers = sign_request(auth, secret=WEBHOOK_SECRET.encode(), method="POST", url=url, body=body,
                           timestamp=header_timestamp(auth, epoch_seconds=time.time()))
    response = client.post(url, data=body, content_type=content_type, headers=headers)
    assert response.status_code < 500, (content_type, response.status_code, response.content[:200])


@pytest.mark.parametrize("method", ["get", "put", "patch", "delete", "options"])
def test_other_methods_never_5xx(client, serving_org, method):
    response = getattr(client, method)("/api/v2/ingress/crm-webhooks/webhooks/")
    assert response.status_code < 500
