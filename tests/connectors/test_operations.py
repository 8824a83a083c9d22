"""Operator commands and endpoints answer bad input with clear errors, never tracebacks."""
import json

import pytest

from tests.conftest import (
    ORG,
    SECRET_VERSION,
    WEBHOOK_SECRET,
    hubspot_event,
    make_serving_org,
    post_signed,
    run_manage,
    subprocess_env,
)

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])


@pytest.mark.parametrize("content", ["[]", '"text"', '{"accounts": [1]}', '{"accounts": []}', "{nope",
                                     '{"accounts": [{"account_key": " x", "pack": "billing"}]}'])
def test_config_apply_rejects_bad_documents_with_a_message(tmp_path, content):
    path = tmp_path / "config.json"
    path.write_text(content)
    result = run_manage(["connector_config_apply", "--org", ORG, str(path)], subprocess_env())
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().startswith("CommandError:")


def test_run_workers_accepts_all_roles_at_once():
    result = run_manage(["run_workers", "--role", "all", "--once"], subprocess_env())
    assert result.returncode == 0, result.stderr
    start = json.loads(result.stderr.splitlines()[0])
    assert start["roles"] == ["connector", "runtime", "flow", "egress", "stream"]


def test_health_endpoint(client):
    response = client.get("/api/v2/health/")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


def test_unreadable_credential_is_503_without_naming_the_secret(client, billing_sandbox):
    from connectors.serving.secret_store import secret_path

    make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    path = secret_path(org_id=ORG, account_key="crm-webhooks", credential_ref="webhook_secret",
                       secret_version=SECRET_VERSION)
    path.rename(path.with_name("moved-away"))  # the exact version is gone; no other version is used
    try:
        response = post_signed(client, [hubspot_event(1, 501, 1000)])
    finally:
        path.with_name("moved-away").rename(path)
    assert response.status_code == 503
    assert response.json()["error"] == "credential_unavailable"
    assert WEBHOOK_SECRET not in response.content.decode()
