"""The generation commands as an operator runs them: publish packs and credential versions,
apply a configuration; bad input exits 1 with ``CommandError: <code>: <message>`` and writes nothing."""
from __future__ import annotations

import json
import stat

import pytest

from connectors.models import (
    CatalogBinding,
    ConnectorServiceConfigurationGeneration,
    CredentialGeneration,
    PackGeneration,
)
from tests.conftest import BILLING_KEY, ORG, ROOT, WEBHOOK_SECRET, run_manage, service_document, subprocess_env

pytestmark = pytest.mark.django_db(transaction=True)

DEMO_SERVICE = ROOT / "packs" / "demo" / "service.json"
PACKS = [str(ROOT / "packs" / "hubspot" / "pack.json"), str(ROOT / "packs" / "billing" / "pack.json")]


def _ok(args):
    result = run_manage(args, subprocess_env())
    assert result.returncode == 0, result.stderr
    return result.stdout


def _refused(args, code):
    result = run_manage(args, subprocess_env())
    assert result.returncode == 1, result.stdout
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().startswith(f"CommandError: {code}:"), result.stderr
    return result.stderr


def _publish_credentials(tmp_path):
    path = tmp_path / "credentials.json"
    path.write_text(json.dumps([
        {"account_key": "crm-webhooks", "credential_ref": "webhook_secret", "version": "test-1",
         "secret": {"from_env": "NEXUS_TEST_WEBHOOK_SECRET"}},
        {"account_key": "billing-main", "credential_ref": "api_key", "version": "test-1",
         "secret": {"from_env": "NEXUS_TEST_BILLING_KEY"}, "transport": {"scheme": "bearer"}}]))
    return _ok(["connector_credential_publish", "--org", ORG, str(path)])


def test_pack_publish_authors_immutable_generations_with_the_four_binding_kinds():
    first = _ok(["connector_pack_publish", *PACKS])
    assert "pack hubspot 1.4.0" in first and "published" in first
    assert "1 callout_profile, 3 field_mapping, 1 inbound_route, 3 push_contract" in first
    assert "pack billing 1.2.0" in first and "1 callout_profile, 1 field_mapping, 1 push_contract)" in first
    again = _ok(["connector_pack_publish", *PACKS])
    assert again.count("already published") == 2
    assert PackGeneration.objects.count() == 2 and CatalogBinding.objects.count() == 11


def test_pack_publish_refuses_an_incomplete_pack(tmp_path):
    path = tmp_path / "pack.json"
    path.write_text(json.dumps({"pack_key": "x", "owner_key": "pack.x", "version": "1",
                                "push_contracts": [{"contract_key": "c"}]}))
    _refused(["connector_pack_publish", str(path)], "pack_invalid")
    assert not PackGeneration.objects.exists()


def test_credential_publish_keeps_secrets_in_the_versioned_directory_only(tmp_path, _secrets_dir):
    out = _publish_credentials(tmp_path)
    assert out.count("published") == 2
    path = _secrets_dir / ORG / "crm-webhooks" / "webhook_secret" / "test-1"
    assert path.read_bytes() == WEBHOOK_SECRET.encode()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    for row in CredentialGeneration.objects.filter(org_id=ORG).values():
        flat = json.dumps(row, default=str)
        assert WEBHOOK_SECRET not in flat and BILLING_KEY not in flat
    assert _publish_credentials(tmp_path).count("already published") == 2


def test_config_apply_refuses_the_demo_configuration_of_another_org_with_a_clear_error():
    stderr = _refused(["connector_config_apply", "--org", ORG, str(DEMO_SERVICE)], "configuration_org_mismatch")
    assert "'demo-org'" in stderr and ORG in stderr
    assert not ConnectorServiceConfigurationGeneration.objects.exists()


def test_config_apply_refuses_placeholders_and_unpublished_packs_with_a_clear_error(tmp_path):
    document = {"org_id": ORG, **service_document("{billing_base_url}")}
    path = tmp_path / "service.json"
    path.write_text(json.dumps(document))
    _refused(["connector_config_apply", "--org", ORG, str(path)], "pack_unknown")
    _ok(["connector_pack_publish", *PACKS])
    _publish_credentials(tmp_path)
    stderr = _refused(["connector_config_apply", "--org", ORG, str(path)], "configuration_placeholder")
    assert "{billing_base_url}" in stderr
    assert not ConnectorServiceConfigurationGeneration.objects.exists()
    path.write_text(json.dumps({"org_id": ORG, **service_document("http://127.0.0.1:9")}))
    assert "configuration generation 1" in _ok(["connector_config_apply", "--org", ORG, str(path)])


def test_config_apply_refuses_a_base_url_carrying_credentials_without_echoing_it(tmp_path):
    """Credentials live in credential generations only: a URL holding one never reaches a stored document."""
    _ok(["connector_pack_publish", *PACKS])
    _publish_credentials(tmp_path)
    path = tmp_path / "service.json"
    for url in ("http://ops:sk_live_in_url_0042@127.0.0.1:9", "http://sk_live_in_url_0042@127.0.0.1:9",
                "http://127.0.0.1:9/v1?api_key=sk_live_in_url_0042", "http://127.0.0.1:9/#sk_live_in_url_0042"):
        path.write_text(json.dumps({"org_id": ORG, **service_document(url)}))
        stderr = _refused(["connector_config_apply", "--org", ORG, str(path)], "configuration_url_credentials")
        assert "sk_live_in_url_0042" not in stderr
    assert not ConnectorServiceConfigurationGeneration.objects.exists()


def test_config_apply_refuses_duplicate_json_keys(tmp_path):
    path = tmp_path / "service.json"
    path.write_text('{"accounts": [], "accounts": []}')
    _refused(["connector_config_apply", "--org", ORG, str(path)], "document_unreadable")


@pytest.mark.parametrize("breakage", [
    lambda d: d.update(inbound_routes="x"),
    lambda d: d.update(push_contracts=["x"]),
    lambda d: d["inbound_routes"][0].update(kinds="x"),
])
def test_a_malformed_pack_section_is_refused_with_a_code_and_a_bad_file_publishes_nothing(tmp_path, breakage):
    import copy

    from django.core.management import call_command
    from django.core.management.base import CommandError

    good = ROOT / "packs" / "billing" / "pack.json"
    document = json.loads((ROOT / "packs" / "hubspot" / "pack.json").read_text())
    broken = copy.deepcopy(document)
    breakage(broken)
    bad = tmp_path / "pack.json"
    bad.write_text(json.dumps(broken))
    with pytest.raises(CommandError, match="^pack_invalid: "):
        call_command("connector_pack_publish", str(good), str(bad))
    assert not PackGeneration.objects.exists()
