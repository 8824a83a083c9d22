"""Fixtures for pulled-route tests: a loopback stream sandbox and an org serving both pack kinds.

``tests/conftest.py`` registers this module as a plugin (``pytest_plugins``): every test module may ask for
its fixtures by name.
The org is configured exactly as an operator would: ``connector_pack_publish``
for the three packs, ``connector_credential_publish`` for their secret
versions, ``connector_config_apply`` with a JSON file naming the webhook
account, the billing account and the pulled change-stream account, then
``cutover greenfield``.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

import pytest
from django.core.management import call_command

from nexusflow.kernel.scope import OrgScope
from tests.conftest import CREDENTIAL_DOCUMENTS, ORG, ROOT, SECRET_VERSION, service_document

STREAM_TOKEN = "test-stream-token"
STREAM_ACCOUNT = "crm-changes"
STREAM_ROUTE = "contacts.changes"
STREAM_CHANNEL = "contact-changes"


@pytest.fixture
def cdc_sandbox(monkeypatch):
    from packs.salesforce_cdc.sandbox import StreamSandbox

    monkeypatch.setenv("NEXUS_TEST_STREAM_TOKEN", STREAM_TOKEN)
    sandbox = StreamSandbox(STREAM_TOKEN)
    sandbox.start()
    yield sandbox
    sandbox.stop()


def stream_service_document(billing_url: str, stream_url: str) -> dict:
    document = service_document(billing_url)
    document["accounts"].append({"account_key": STREAM_ACCOUNT, "pack": "salesforce_cdc", "routes": [STREAM_ROUTE],
                                 "base_url": stream_url, "credentials": {"stream_token": SECRET_VERSION}})
    return document


@dataclass
class StreamOrg:
    org: OrgScope
    billing: object
    stream: object


def stream_service_configure(billing_url: str, stream_url: str, tmp_path, *, procedure: str = "greenfield") -> None:
    """Configure the stream org as an operator would (packs, credentials, service document), then run
    ``cutover <procedure>`` (``greenfield``: V2 serves; ``v1-install``: a fresh V1 install)."""
    path = tmp_path / "service.json"
    path.write_text(json.dumps(stream_service_document(billing_url, stream_url)))
    credentials = tmp_path / "credentials.json"
    credentials.write_text(json.dumps(CREDENTIAL_DOCUMENTS + [
        {"account_key": STREAM_ACCOUNT, "credential_ref": "stream_token", "version": SECRET_VERSION,
         "secret": {"from_env": "NEXUS_TEST_STREAM_TOKEN"}, "transport": {"scheme": "bearer"}}]))
    with open(os.devnull, "w") as sink:
        call_command("connector_pack_publish", *(str(ROOT / "packs" / key / "pack.json")
                                                 for key in ("hubspot", "billing", "salesforce_cdc")), stdout=sink)
        call_command("connector_credential_publish", "--org", ORG, str(credentials), stdout=sink)
        call_command("connector_config_apply", "--org", ORG, str(path), stdout=sink)
        call_command("cutover", procedure, "--org", ORG, stdout=sink)


@pytest.fixture
def stream_org(billing_sandbox, cdc_sandbox, tmp_path, django_db_blocker) -> StreamOrg:
    stream_service_configure(billing_sandbox.base_url, cdc_sandbox.base_url, tmp_path)
    return StreamOrg(OrgScope(ORG), billing_sandbox, cdc_sandbox)


def stream_target():
    from connectors.inbound.stream_poll import pull_targets

    (target,) = pull_targets(account_key=STREAM_ACCOUNT)
    return target
