"""Generations, owner receipts and ServingEpoch verification (seed 003 "Identity rules",
"State machines", "Existing foundations and schema ownership"; proofs S003-RP-01..06, S003-RP-10).

Forged candidates are built from honest owner reads and then changed the way a
buggy or hostile preparer could: they go in as ``prepared`` rows and
verification, which fresh-reads every owner, must reject them. Verification
runs with the secrets directory gone and the secret reader replaced by one
that fails the test, so no verdict can depend on secret bytes.
"""
from __future__ import annotations

import itertools
import json
import threading
from dataclasses import replace

import pytest
from django.db import connections, transaction

from connectors.models import (
    AccountServingGate,
    CatalogBinding,
    ConnectorServiceConfigurationGeneration,
    CredentialGeneration,
    PackGeneration,
    ServingEpoch,
)
from connectors.reasons import EPOCH_OWNER_MISMATCH
from connectors.serving import secret_store
from connectors.serving.epoch import (
    EpochVerificationFailed,
    build_candidate,
    encode_preimage,
    epoch_digest_of,
    epoch_prepare,
    epoch_verify,
    scope_digest_of,
)
from connectors.serving.generations import (
    ConfigurationError,
    OwnerMismatch,
    credential_generation_digest,
    credential_publish,
    pack_publish,
    service_configuration_apply,
    service_configuration_read,
)
from connectors.store import ServingEpochStore
from nexusflow.kernel import canonical_json
from nexusflow.kernel.digests import PROFILE_V1, PROFILE_V2, OwnerReceipt, digest_v2
from nexusflow.kernel.errors import ImmutableRow, InvalidIdentity
from nexusflow.kernel.scope import OrgScope
from tests.conftest import ORG, ROOT, SECRET_VERSION, apply_service_configuration, service_document
from tests.connectors.generation_helpers import tamper_row

pytestmark = pytest.mark.django_db(transaction=True)

URL = "http://127.0.0.1:9"
_forged = itertools.count(1)


@pytest.fixture
def org() -> OrgScope:
    scope = OrgScope(ORG)
    apply_service_configuration(scope, URL)
    return scope


@pytest.fixture
def no_secret_reads(monkeypatch, settings, tmp_path):
    """The secret backend is gone and any secret read fails the test."""
    settings.NEXUS_SECRETS_DIR = tmp_path / "no-secrets-here"

    def refuse(**ref):
        raise AssertionError(f"verification read secret bytes of {ref}")

    monkeypatch.setattr(secret_store, "secret_read", refuse)


def _latest_config() -> ConnectorServiceConfigurationGeneration:
    return ConnectorServiceConfigurationGeneration.objects.filter(org_id=ORG).order_by("-generation").first()


def _insert_candidate(org: OrgScope, mutate, *, configuration=None, profile_id=PROFILE_V2) -> ServingEpoch:
    configuration = configuration or _latest_config()
    key = f"epoch-forged-{next(_forged)}"
    candidate, document = build_candidate(org=org, configuration_id=configuration.pk, epoch_id=key)
    candidate = mutate(candidate)
    preimage = encode_preimage(candidate)
    with transaction.atomic():
        return ServingEpochStore.create(org_id=org.org_id, state="prepared", configuration=configuration,
                                        document=document, epoch_key=key, preimage=preimage,
                                        digest=epoch_digest_of(preimage), profile_id=profile_id)


def _renumber(items):
    return tuple(replace(item, ordinal=n) for n, item in enumerate(items))


def _without_binding(kind: str):
    def mutate(c):
        return replace(c, bindings=_renumber(b for b in c.bindings if b.kind != kind))
    return mutate


def _assert_rejected(org: OrgScope, epoch: ServingEpoch, *expected: str) -> str:
    with pytest.raises(EpochVerificationFailed) as caught:
        epoch_verify(org=org, epoch_id=epoch.pk)
    row = ServingEpoch.objects.get(org_id=ORG, pk=epoch.pk)
    assert (row.state, row.reason_code) == ("rejected", EPOCH_OWNER_MISMATCH)
    message = str(caught.value)
    for text in expected:
        assert text in message, message
    return message


def _echoed(receipt: OwnerReceipt, **changes) -> OwnerReceipt:
    """A receipt a caller made up from an owner's receipt: self-consistent, but not what the owner says."""
    body = {**json.loads(receipt.receipt), **changes}
    data = canonical_json.dumps(body)
    return OwnerReceipt("caller", data, digest_v2("l2.service-configuration.receipt", [("receipt", data)]).hexdigest)


# --- S003-RP-01 ------------------------------------------------------------------------
def test_an_honest_candidate_verifies_from_fresh_owner_reads_without_secret_bytes(org, no_secret_reads):
    epoch = epoch_prepare(org=org)
    assert epoch.state == "prepared" and bytes(epoch.preimage)
    assert epoch.digest == epoch_digest_of(bytes(epoch.preimage))
    verified = epoch_verify(org=org, epoch_id=epoch.pk)
    assert verified.state == "verified"
    kinds = [b["kind"] for b in CatalogBinding.objects.filter(
        pack_generation__pack_key__in=["hubspot", "billing"]).values("kind")]
    assert set(kinds) == {"inbound_route", "callout_profile", "field_mapping", "push_contract"}


@pytest.mark.parametrize("case", ["incomplete_bindings", "mixed_configuration_generations", "mismatched_l2_document",
                                  "mismatched_catalog_view"])
def test_exact_generation_verification_rejects_incomplete_mixed_or_mismatched_catalog_and_l2_references(
        org, no_secret_reads, case):
    if case == "incomplete_bindings":
        epoch = _insert_candidate(org, _without_binding("push_contract"))
        _assert_rejected(org, epoch, "bindings.count")
    elif case == "mixed_configuration_generations":
        first = _latest_config()
        second = service_configuration_apply(org=org, document=service_document("http://127.0.0.1:10"))
        assert second.generation == first.generation + 1
        other, _ = build_candidate(org=org, configuration_id=second.pk, epoch_id="x")
        # The candidate row names generation 1 but carries generation 2's L2 proof: a mixed reference.
        epoch = _insert_candidate(org, lambda c: replace(c, config=other.config), configuration=first)
        _assert_rejected(org, epoch, "config.generation_id")
    elif case == "mismatched_l2_document":
        epoch = _insert_candidate(org, lambda c: c)
        row = _latest_config()
        changed = {**row.document, "accounts": [{**row.document["accounts"][1], "base_url": "http://evil"},
                                                row.document["accounts"][0]]}
        tamper_row(ConnectorServiceConfigurationGeneration, row.pk, document=json.dumps(changed))
        _assert_rejected(org, epoch, "stored document disagrees with its generation digest")
    else:
        epoch = _insert_candidate(org, lambda c: replace(c, catalog=replace(c.catalog, view_digest="0" * 64)))
        _assert_rejected(org, epoch, "catalog.view_digest")


@pytest.mark.django_db(transaction=True, databases=["default", "control"])
def test_production_activation_changes_the_exact_epoch_and_every_gate_together(org, no_secret_reads):
    from cutover.services import cutover_greenfield

    report = cutover_greenfield(org=org)
    epoch = ServingEpoch.objects.get(org_id=ORG, pk=report.epoch_id)
    assert epoch.state == "active"
    gates = list(AccountServingGate.objects.filter(org_id=ORG))
    assert {g.account_key for g in gates} == {"crm-webhooks", "billing-main"}
    assert all((g.state, g.epoch_id, g.epoch_digest) == ("v2_serving", epoch.pk, epoch.digest) for g in gates)


@pytest.mark.django_db(transaction=True, databases=["default", "control"])
def test_a_verified_epoch_whose_owner_drifted_is_rejected_at_activation(org, no_secret_reads):
    from cutover.services import cutover_greenfield

    epoch = epoch_verify(org=org, epoch_id=epoch_prepare(org=org).pk)
    assert epoch.state == "verified"
    binding = CatalogBinding.objects.get(pack_generation__pack_key="billing", kind="field_mapping")
    tamper_row(CatalogBinding, binding.pk, definition=json.dumps({**binding.definition, "mapping": []}))
    with pytest.raises(EpochVerificationFailed):
        cutover_greenfield(org=org)
    assert ServingEpoch.objects.get(org_id=ORG, pk=epoch.pk).state == "rejected"
    assert not AccountServingGate.objects.filter(org_id=ORG, state="v2_serving").exists()


# --- S003-RP-02 ------------------------------------------------------------------------
def _stale_pack_locator(org):
    # An older billing generation with other content: the candidate's push contract names it instead.
    doc = json.loads((ROOT / "packs" / "billing" / "pack.json").read_text())
    older, _ = pack_publish(document={**doc, "version": "0.9.0"})

    def mutate(c):
        return replace(c, bindings=tuple(replace(b, pack_generation_id=str(older.pk)) if b.kind == "push_contract"
                                         else b for b in c.bindings))
    return mutate


CASES_RP02 = {
    "caller_echoed_configuration_receipt": (
        lambda org: lambda c: replace(c, config=replace(c.config, receipt=_echoed(c.config.receipt, generation=7))),
        "config.receipt"),
    "caller_echoed_binding_receipt": (
        lambda org: lambda c: replace(c, bindings=tuple(
            replace(b, receipt=_echoed(b.receipt, definition_version="2.0.0")) if b.kind == "inbound_route" else b
            for b in c.bindings)), "proof.receipt"),
    "caller_echoed_credential_receipt": (
        lambda org: lambda c: replace(c, credentials=tuple(
            replace(p, receipt=_echoed(p.receipt, secret_version="test-9")) for p in c.credentials)),
        "credential.receipt"),
    "stale_pack_generation_locator": (_stale_pack_locator, "proof.pack_generation_id"),
    "omitted_account": (
        lambda org: lambda c: replace(c, scope_digest=scope_digest_of(ORG, ["crm-webhooks"])), "epoch.scope_digest"),
    "omitted_route": (lambda org: _without_binding("inbound_route"), "bindings.count"),
    "omitted_binding": (lambda org: _without_binding("field_mapping"), "bindings.count"),
    "omitted_credential": (
        lambda org: lambda c: replace(c, credentials=_renumber(c.credentials[1:])), "credentials.count"),
}


@pytest.mark.parametrize("case", sorted(CASES_RP02))
def test_verification_rejects_an_echoed_receipt_a_stale_locator_or_an_omission_without_reading_secrets(
        org, no_secret_reads, case):
    make_mutation, field = CASES_RP02[case]
    epoch = _insert_candidate(org, make_mutation(org))
    _assert_rejected(org, epoch, field)


@pytest.mark.parametrize("self_consistent", [False, True], ids=["digest_left", "digest_recomputed"])
def test_secret_version_reference_drift_rejects_without_reading_secret_bytes(org, no_secret_reads, self_consistent):
    epoch = epoch_prepare(org=org)
    row = CredentialGeneration.objects.get(org_id=ORG, credential_ref="webhook_secret")
    changes = {"secret_version": "test-2"}
    if self_consistent:
        changes["digest"] = credential_generation_digest(
            org_id=ORG, account_key=row.account_key, credential_ref=row.credential_ref, secret_version="test-2",
            transport_digest=row.transport_digest)
    tamper_row(CredentialGeneration, row.pk, **changes)
    _assert_rejected(org, epoch, "credential.receipt" if self_consistent else "secret version reference")


@pytest.mark.parametrize("kind", ["inbound_route", "callout_profile", "field_mapping", "push_contract"])
def test_verification_fresh_reads_each_of_the_four_binding_owners(org, no_secret_reads, kind):
    epoch = epoch_prepare(org=org)
    binding = CatalogBinding.objects.filter(kind=kind, pack_generation__pack_key__in=["hubspot", "billing"]).first()
    tamper_row(CatalogBinding, binding.pk, definition=json.dumps({**binding.definition, "changed": True}))
    _assert_rejected(org, epoch, "field definition disagrees")


# --- S003-RP-03 ------------------------------------------------------------------------
def _relation_mutations():
    def missing(doc):
        doc["accounts"][0]["credentials"] = []
    def extra(doc):
        doc["accounts"][0]["credentials"].append(["unused_ref", doc["accounts"][1]["credentials"][0][1]])
    def duplicate(doc):
        doc["accounts"][0]["credentials"].append(list(doc["accounts"][0]["credentials"][0]))
    def other_account(doc):
        doc["accounts"][0]["credentials"][0][1] = doc["accounts"][1]["credentials"][0][1]
    return {"missing": (missing, "no credential generation mapped"),
            "extra": (extra, "not used by any selected binding"),
            "duplicate": (duplicate, "duplicate credential mapping"),
            "scope_disagrees": (other_account, "maps to generation")}


@pytest.mark.parametrize("case", ["missing", "extra", "duplicate", "scope_disagrees", "identity_disagrees"])
def test_l2_verification_rejects_missing_extra_or_duplicate_credential_mappings_and_scope_or_identity_disagreement(
        org, no_secret_reads, case):
    epoch = epoch_prepare(org=org)
    row = _latest_config()
    doc = json.loads(json.dumps(row.document))
    assert doc["accounts"][0]["account_key"] == "crm-webhooks"
    if case == "identity_disagrees":
        # A generation of the same account but another stable CredentialRef.
        other, _ = credential_publish(org=org, document={
            "account_key": "crm-webhooks", "credential_ref": "other_secret", "version": "v1",
            "secret": {"from_env": "NEXUS_TEST_WEBHOOK_SECRET"}})
        doc["accounts"][0]["credentials"][0][1] = int(other.pk)
        expected = "maps to generation"
    else:
        mutate, expected = _relation_mutations()[case]
        mutate(doc)
    digest = digest_v2("l2.service-configuration.generation", [("canonical", canonical_json.dumps(doc))]).hexdigest
    tamper_row(ConnectorServiceConfigurationGeneration, row.pk, document=json.dumps(doc), digest=digest)
    with pytest.raises(OwnerMismatch, match=expected):
        service_configuration_read(org=org, generation_id=row.pk)
    _assert_rejected(org, epoch, expected)


@pytest.mark.parametrize("credentials, expected", [
    ({}, "no credential generation mapped"),
    ({"webhook_secret": SECRET_VERSION, "extra_ref": "v1"}, "not used by any selected binding"),
    ({"webhook_secret": "test-404"}, "not published"),
    ({"webhook_secret": 1}, "published secret version"),
])
def test_authoring_refuses_an_inexact_credential_relation_and_writes_nothing(org, credentials, expected):
    credential_publish(org=org, document={"account_key": "crm-webhooks", "credential_ref": "extra_ref", "version": "v1",
                                          "secret": {"from_env": "NEXUS_TEST_WEBHOOK_SECRET"}})
    before = ConnectorServiceConfigurationGeneration.objects.filter(org_id=ORG).count()
    document = service_document(URL)
    document["accounts"][0]["credentials"] = credentials
    with pytest.raises(ConfigurationError, match=expected):
        service_configuration_apply(org=org, document=document)
    assert ConnectorServiceConfigurationGeneration.objects.filter(org_id=ORG).count() == before


# --- S003-RP-04 ------------------------------------------------------------------------
def test_a_published_definition_generation_cannot_be_replaced_or_removed_and_its_lost_read_path_fails_closed(
        org, no_secret_reads):
    epoch = epoch_verify(org=org, epoch_id=epoch_prepare(org=org).pk)
    generation = PackGeneration.objects.get(pack_key="billing")
    doc = generation.document
    with pytest.raises(ConfigurationError) as caught:
        pack_publish(document={**doc, "callout_profiles": [{**doc["callout_profiles"][0], "timeout_seconds": 99}]})
    assert caught.value.code == "pack_version_conflict"
    with pytest.raises(ImmutableRow):
        generation.delete()
    with pytest.raises(ImmutableRow):
        CatalogBinding.objects.filter(pack_generation=generation).delete()
    assert PackGeneration.objects.get(pk=generation.pk).document == doc
    # The sole read path of one binding definition is lost (a retention job removed its row).
    binding = CatalogBinding.objects.get(pack_generation=generation, kind="callout_profile")
    with connections["default"].cursor() as cursor:
        cursor.execute("DELETE FROM connectors_catalogbinding WHERE id = %s", [int(binding.pk)])
    from connectors.serving.epoch import epoch_recheck_for_activation

    with pytest.raises(EpochVerificationFailed, match="Catalog bindings stored"):
        epoch_recheck_for_activation(org=org, epoch=epoch)
    assert ServingEpoch.objects.get(org_id=ORG, pk=epoch.pk).state == "rejected"


def test_concurrent_publications_of_one_pack_version_leave_exactly_one_generation():
    doc = json.loads((ROOT / "packs" / "billing" / "pack.json").read_text())
    variants = [{**doc, "version": "7.0.0"},
                {**doc, "version": "7.0.0", "callout_profiles": [{**doc["callout_profiles"][0], "timeout_seconds": 7}]}]
    barrier = threading.Barrier(len(variants))
    outcomes: list[str] = []

    def publish(document):
        try:
            barrier.wait(10)
            pack_publish(document=document)
            outcomes.append("published")
        except ConfigurationError as exc:
            outcomes.append(exc.code)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=publish, args=(v,)) for v in variants]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(outcomes) == ["pack_version_conflict", "published"]
    generation = PackGeneration.objects.get(pack_key="billing", version="7.0.0")
    assert CatalogBinding.objects.filter(pack_generation=generation).count() == 3  # profile, mapping, contract


# --- S003-RP-05 ------------------------------------------------------------------------
@pytest.mark.parametrize("profile_id", [PROFILE_V1, "nexuscrm.connector-digest-profile.v3"])
def test_unknown_cross_profile_or_unprofiled_candidates_fail_closed(org, no_secret_reads, profile_id):
    epoch = _insert_candidate(org, lambda c: c, profile_id=profile_id)
    _assert_rejected(org, epoch, f"unsupported digest profile {profile_id!r}")
    with pytest.raises(InvalidIdentity):  # an unprofiled candidate cannot even be stored
        _insert_candidate(org, lambda c: c, profile_id="")


def test_a_silently_recanonicalized_owner_digest_fails_closed(org, no_secret_reads):
    epoch = epoch_prepare(org=org)
    generation = PackGeneration.objects.get(pack_key="hubspot")
    # The same document digested by another recipe (sorted JSON under the V1 layout) replaces the payload digest.
    relabeled = digest_v2("connectors.pack-generation.v1", [("document", json.dumps(generation.document,
                                                                                      sort_keys=True).encode())])
    tamper_row(PackGeneration, generation.pk, digest=relabeled.hexdigest)
    _assert_rejected(org, epoch, "payload digest")


# --- S003-RP-10 ------------------------------------------------------------------------
@pytest.mark.parametrize("account_key", [" crm-webhooks", "crm-webhooks ", "", None, "crm\u200bwebhooks", b"\xff"])
def test_byte_exact_keys_reject_whitespace_empty_null_and_invalid_encoding_before_persistence(org, account_key):
    before = (ConnectorServiceConfigurationGeneration.objects.count(), CredentialGeneration.objects.count())
    document = service_document(URL)
    document["accounts"][0]["account_key"] = account_key
    with pytest.raises(InvalidIdentity):
        service_configuration_apply(org=org, document=document)
    with pytest.raises(InvalidIdentity):
        credential_publish(org=org, document={"account_key": account_key, "credential_ref": "webhook_secret",
                                              "version": "v9", "secret": {"from_env": "NEXUS_TEST_WEBHOOK_SECRET"}})
    with pytest.raises(InvalidIdentity):
        credential_publish(org=org, document={"account_key": "crm-webhooks", "credential_ref": "webhook_secret",
                                              "version": account_key, "secret": {"from_env": "NEXUS_TEST_WEBHOOK_SECRET"}})
    assert (ConnectorServiceConfigurationGeneration.objects.count(), CredentialGeneration.objects.count()) == before
    assert not secret_store.secret_exists(org_id=ORG, account_key="crm-webhooks", credential_ref="webhook_secret",
                                          secret_version="v9")


def test_a_digest_disagreement_is_refused_before_persistence(org):
    doc = json.loads((ROOT / "packs" / "hubspot" / "pack.json").read_text())
    count = PackGeneration.objects.count()
    with pytest.raises(ConfigurationError, match="already published with other content"):
        pack_publish(document={**doc, "inbound_routes": doc["inbound_routes"][:0]})
    assert PackGeneration.objects.count() == count
    with pytest.raises(ConfigurationError, match="another transport configuration"):
        credential_publish(org=org, document={"account_key": "billing-main", "credential_ref": "api_key",
                                              "version": SECRET_VERSION, "transport": {"scheme": "basic"}})
    with pytest.raises(secret_store.SecretVersionConflict):
        credential_publish(org=org, document={"account_key": "billing-main", "credential_ref": "api_key",
                                              "version": SECRET_VERSION, "secret": {"from_env": "NEXUS_TEST_WEBHOOK_SECRET"},
                                              "transport": {"scheme": "bearer"}})
    assert CredentialGeneration.objects.filter(org_id=ORG).count() == 2


def test_an_unavailable_owner_leaves_the_candidate_prepared(org, no_secret_reads, monkeypatch):
    from django.db import OperationalError

    from connectors.serving import epoch as epoch_module
    from connectors.serving.epoch import EpochVerificationDeferred

    candidate = epoch_prepare(org=org)

    def unavailable(**kwargs):
        raise OperationalError("owner database is restarting")

    with monkeypatch.context() as patched:
        patched.setattr(epoch_module, "service_configuration_read", unavailable)
        with pytest.raises(EpochVerificationDeferred):
            epoch_verify(org=org, epoch_id=candidate.pk)
    row = ServingEpoch.objects.get(org_id=ORG, pk=candidate.pk)
    assert (row.state, row.version) == ("prepared", candidate.version)
    assert epoch_verify(org=org, epoch_id=candidate.pk).state == "verified"
