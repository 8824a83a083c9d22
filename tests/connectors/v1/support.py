"""Helpers for the V1 runtime tests: a configured org installed as a fresh V1 service, signed V1 deliveries."""
from __future__ import annotations

import time

from nexusflow.kernel.scope import OrgScope
from tests.conftest import ORG, WEBHOOK_SECRET, apply_service_configuration

V1_URL = "http://testserver/api/v1/ingress/{account}/{channel}/"
WEBHOOK_ACCOUNT, WEBHOOK_CHANNEL = "crm-webhooks", "webhooks"


def install_v1(billing_url: str) -> OrgScope:
    """Configure the demo accounts for ``ORG`` and install V1 (every gate stays ``v1_serving``)."""
    from cutover.v1_install import cutover_v1_install

    org = OrgScope(ORG)
    apply_service_configuration(org, billing_url)
    cutover_v1_install(org=org)
    return org


def post_v1(client, events_or_body, *, sign: str = "valid", account: str = WEBHOOK_ACCOUNT,
            channel: str = WEBHOOK_CHANNEL):
    """POST a provider-signed webhook body to the V1 ingress route."""
    from packs.hubspot.sender import Delivery, signed_headers, webhook_route

    delivery = Delivery(events_or_body, sign)
    url = V1_URL.format(account=account, channel=channel)
    headers = signed_headers(delivery, auth=webhook_route()["auth"], url=url, secret=WEBHOOK_SECRET.encode(),
                             now_epoch_seconds=time.time())
    return client.post(url, data=delivery.body_bytes(), content_type="application/json", headers=headers)
