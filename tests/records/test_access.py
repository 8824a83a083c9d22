"""Who may do what: users, permission sets, field-level security and record access (issue 23, item 1;
seed 004 section 17).

An org's access policy is an immutable chain of generations published by ``manage.py records access
publish``; decisions combine the user's state, object permissions, FLS, the org-wide default, ownership,
explicit shares and view all / modify all. An org without a generation is unrestricted, as before.
"""
from __future__ import annotations

import copy
import io
import json

import pytest
from django.core.management import CommandError, call_command
from django.db import transaction

from nexusflow.kernel.errors import ImmutableRow
from nexusflow.kernel.scope import OrgScope
from nexusflow.records import access as a
from nexusflow.records.access_services import access_policy_publish, record_share_set
from nexusflow.records.authority import field_read_authority
from nexusflow.records.models import AccessPolicyGeneration, RecordShare
from nexusflow.records.selectors import access_principal, record_access_check
from nexusflow.records.services import RecordNotFound, record_create

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])

ORG, OTHER = "org-access-a", "org-access-b"

DOCUMENT = {
    "users": [
        {"id": "owner", "email": "owner@example.org", "name": "Owner", "permission_sets": ["rep"]},
        {"id": "peer", "email": "peer@example.org", "name": "Peer", "permission_sets": ["rep"]},
        {"id": "auditor", "email": "aud@example.org", "name": "Auditor", "permission_sets": ["rep", "audit"]},
        {"id": "admin", "email": "adm@example.org", "name": "Admin", "permission_sets": ["rep", "admin"]},
        {"id": "gone", "active": False, "email": "gone@example.org", "name": "Gone", "permission_sets": ["rep"]},
        {"id": "nobody", "email": "no@example.org", "name": "Nobody", "permission_sets": []},
        {"id": "sync", "email": "sync@example.org", "name": "Sync", "permission_sets": ["rep"]},
    ],
    "permission_sets": {
        "rep": {"objects": {"Contact": ["create", "delete"], "Lead": ["read"]},
                "fields": {"Contact": {"email": ["edit"], "firstname": ["read"]}}},
        "audit": {"view_all": ["Contact"]},
        "admin": {"modify_all": ["Contact"]},
    },
    "sharing": {"Contact": "private", "Lead": "public_read"},
    "integration_user": "sync",
}


def _doc(sharing: str | None = None) -> dict:
    doc = copy.deepcopy(DOCUMENT)
    if sharing is not None:
        doc["sharing"]["Contact"] = sharing
    return doc


def _publish(org=ORG, document=None, reason="test"):
    return access_policy_publish(org_id=org, document=_doc() if document is None else document, authored_by="ops", reason=reason)


def _contact(org=ORG, owner="owner", **values):
    with transaction.atomic():
        return record_create(org=OrgScope(org), object_name="Contact",
                             values=values or {"email": "c@example.org"}, owner_id=owner)


# --- the decision table -------------------------------------------------------------------------------------

R, E, D = "read", "edit", "delete"
#: (org-wide default, who, {op: (allowed, basis)}); "peer+read"/"peer+edit": peer with a read/edit share.
TABLE = [
    ("private", "owner", {R: (True, "owner"), E: (True, "owner"), D: (True, "owner")}),
    ("private", "peer", {R: (False, "no_record_access"), E: (False, "no_record_access"),
                         D: (False, "no_record_access")}),
    ("private", "peer+read", {R: (True, "share"), E: (False, "no_record_access"), D: (False, "no_record_access")}),
    ("private", "peer+edit", {R: (True, "share"), E: (True, "share"), D: (False, "no_record_access")}),
    ("private", "auditor", {R: (True, "view_all"), E: (False, "no_record_access"), D: (False, "no_record_access")}),
    ("private", "admin", {R: (True, "modify_all"), E: (True, "modify_all"), D: (True, "modify_all")}),
    ("public_read", "owner", {R: (True, "owner"), E: (True, "owner"), D: (True, "owner")}),
    ("public_read", "peer", {R: (True, "org_wide_default"), E: (False, "no_record_access"),
                             D: (False, "no_record_access")}),
    ("public_read", "peer+edit", {R: (True, "org_wide_default"), E: (True, "share"), D: (False, "no_record_access")}),
    ("public_read", "auditor", {R: (True, "view_all"), E: (False, "no_record_access"),
                                D: (False, "no_record_access")}),
    ("public_read", "admin", {R: (True, "modify_all"), E: (True, "modify_all"), D: (True, "modify_all")}),
    ("public_read_write", "owner", {R: (True, "owner"), E: (True, "owner"), D: (True, "owner")}),
    ("public_read_write", "peer", {R: (True, "org_wide_default"), E: (True, "org_wide_default"),
                                   D: (False, "no_record_access")}),
    ("public_read_write", "peer+read", {R: (True, "org_wide_default"), E: (True, "org_wide_default"),
                                        D: (False, "no_record_access")}),
    ("public_read_write", "auditor", {R: (True, "view_all"), E: (True, "org_wide_default"),
                                      D: (False, "no_record_access")}),
    ("public_read_write", "admin", {R: (True, "modify_all"), E: (True, "modify_all"), D: (True, "modify_all")}),
    # The user's state and the object permission come first, whatever the record's sharing.
    ("public_read_write", "gone", {R: (False, "inactive_user"), E: (False, "inactive_user"),
                                   D: (False, "inactive_user")}),
    ("public_read_write", "nobody", {R: (False, "object_denied"), E: (False, "object_denied"),
                                     D: (False, "object_denied")}),
    ("public_read_write", "stranger", {R: (False, "unknown_user"), E: (False, "unknown_user"),
                                       D: (False, "unknown_user")}),
]


@pytest.mark.parametrize("sharing,who,expected", TABLE, ids=[f"{s}-{w}" for s, w, _ in TABLE])
def test_record_access_decision_table(sharing, who, expected):
    generation, _ = _publish(document=_doc(sharing))
    record = _contact()
    user, _, level = who.partition("+")
    if level:
        record_share_set(org_id=ORG, object_name="Contact", record_key=record.record_key, user_id=user,
                         access=level, authored_by="ops", reason="share")
    for op, (allowed, basis) in expected.items():
        decision = record_access_check(org_id=ORG, user_id=user, object_name="Contact",
                                       record_key=record.record_key, op=op)
        assert (decision.allowed, decision.basis) == (allowed, basis), op
        assert decision.context_digest == generation.digest


def test_an_org_without_a_policy_allows_everything_as_before():
    record = _contact(owner=None)
    for op in (R, E, D):
        decision = record_access_check(org_id=ORG, user_id="anyone", object_name="Contact",
                                       record_key=record.record_key, op=op)
        assert (decision.allowed, decision.basis, decision.context_digest) == (True, "no_policy", "")
    principal = access_principal(org_id=ORG, user_id="anyone")
    assert a.field_access(principal, "Contact", ["email", "lastname"], R).allowed == ("email", "lastname")
    assert a.object_access(principal, "Contact", "create").allowed


def test_object_permissions_imply_and_create_needs_the_object_permission_only():
    _publish()
    owner = access_principal(org_id=ORG, user_id="owner")
    assert owner.objects["Contact"] == {"create", "read", "edit", "delete"}  # delete implies edit, read
    assert owner.objects["Lead"] == {"read"}
    assert a.object_access(owner, "Contact", "create").allowed
    assert not a.object_access(owner, "Lead", "create").allowed
    assert a.object_access(owner, "Lead", "create").basis == "object_denied"
    nobody = access_principal(org_id=ORG, user_id="nobody")
    assert not a.object_access(nobody, "Contact", "read").allowed
    with pytest.raises(ValueError):
        a.object_access(owner, "Contact", "merge")


def test_a_record_without_owner_follows_the_org_wide_default_and_shares():
    _publish(document=_doc("public_read"))
    record = _contact(owner=None)
    decide = lambda user, op: record_access_check(org_id=ORG, user_id=user, object_name="Contact",
                                                  record_key=record.record_key, op=op)
    assert decide("owner", R).basis == "org_wide_default" and not decide("owner", E).allowed
    record_share_set(org_id=ORG, object_name="Contact", record_key=record.record_key, user_id="owner",
                     access="edit", authored_by="ops", reason="share")
    assert decide("owner", E).basis == "share"
    assert not decide("owner", D).allowed  # a share never grants deletion


def test_field_level_security_allows_and_denies_per_field():
    generation, _ = _publish()
    owner = access_principal(org_id=ORG, user_id="owner")
    read = a.field_access(owner, "Contact", ["lastname", "email", "firstname", "email"], R)
    assert (read.allowed, read.denied) == (("email", "firstname"), ("lastname",))
    assert read.context_digest == generation.digest
    edit = a.field_access(owner, "Contact", ["email", "firstname"], E)
    assert (edit.allowed, edit.denied) == (("email",), ("firstname",))
    # Object permission first: Lead is readable but lists no field; editing needs the object's edit.
    lead = a.field_access(owner, "Lead", ["email"], R)
    assert (lead.allowed, lead.denied, lead.basis) == ((), ("email",), "field_level_security")
    assert a.field_access(owner, "Lead", ["email"], E).basis == "object_denied"
    # view all / modify all do not widen FLS; inactive users read nothing.
    admin = access_principal(org_id=ORG, user_id="admin")
    assert a.field_access(admin, "Contact", ["lastname"], R).denied == ("lastname",)
    gone = a.field_access(access_principal(org_id=ORG, user_id="gone"), "Contact", ["email"], R)
    assert (gone.allowed, gone.basis) == ((), "inactive_user")


def test_field_read_authority_answers_from_the_policy_when_the_org_has_one():
    # Without a policy (or without an org): the metadata view's read_access lists, as before.
    before = field_read_authority(user_id="owner", object_name="Contact", fields=["email", "lastname"], org_id=ORG)
    assert (before.allowed_fields, before.denied, before.context_digest) == (("email", "lastname"), (), "")
    generation, _ = _publish()
    decision = field_read_authority(user_id="owner", object_name="Contact", fields=["email", "lastname", "nope"],
                                    org_id=ORG)
    assert (decision.allowed_fields, decision.denied) == (("email",), ("lastname", "nope"))
    assert decision.context_digest == generation.digest
    other = field_read_authority(user_id="owner", object_name="Contact", fields=["lastname"], org_id=OTHER)
    assert other.allowed_fields == ("lastname",)
    legacy = field_read_authority(user_id="owner", object_name="Contact", fields=["lastname"])
    assert legacy.allowed_fields == ("lastname",)


# --- generations ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("document,detail", [
    ([], "a JSON object"),
    ({"roles": {}}, "unknown key 'roles'"),
    ({"users": [{"id": "u"}, {"id": "u"}]}, "declared twice"),
    ({"users": [{"id": " u"}]}, "users[0].id"),
    ({"users": [{"id": "u", "active": "yes"}]}, "users[0].active must be true or false"),
    ({"users": [{"id": "u", "permission_sets": ["missing"]}]}, "no permission set 'missing'"),
    ({"users": [{"id": "u", "role": "x"}]}, "unknown key users[0].role"),
    ({"users": [{"id": "u", "fields": {"Title": 3}}]}, "users[0].fields must be an object"),
    ({"permission_sets": {"p": {"objects": {"Nope__c": ["read"]}}}}, "no object 'Nope__c'"),
    ({"permission_sets": {"p": {"objects": {"Contact": ["merge"]}}}}, "unknown permission 'merge'"),
    ({"permission_sets": {"p": {"fields": {"Contact": {"nope": ["read"]}}}}}, "no field 'nope' on Contact"),
    ({"permission_sets": {"p": {"fields": {"Contact": {"email": ["delete"]}}}}}, "unknown permission 'delete'"),
    ({"permission_sets": {"p": {"view_all": "Contact"}}}, "view_all must be a list"),
    ({"permission_sets": {"p": {"grants": {}}}}, "unknown key permission_sets.p.grants"),
    ({"sharing": {"Contact": "public"}}, "sharing.Contact: 'public' is not one of"),
    ({"users": [{"id": "u"}], "integration_user": "v"}, "integration_user: 'v' is not a declared user"),
    ({"users": [{"id": "u"}], "integration_users": {"acct": "v"}}, "integration_users.acct: 'v' is not a declared"),
    ({"users": [{"id": "u"}], "integration_users": ["u"]}, "integration_users must be an object"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_an_invalid_document_is_refused_naming_the_key_and_publishes_nothing(document, detail):
    with pytest.raises(a.AccessPolicyInvalid) as caught:
        _publish(document=document)
    assert caught.value.code == "access_policy_invalid" and detail in str(caught.value)
    assert not AccessPolicyGeneration.objects.exists()


def test_generations_chain_immutably_and_the_same_document_publishes_nothing():
    first, created = _publish()
    assert created and first.generation == 1
    reordered = _doc()
    reordered["users"].reverse()
    reordered["permission_sets"]["rep"]["objects"]["Contact"] = ["delete", "read", "edit", "create"]
    again, created = _publish(document=reordered)
    assert (again.pk, created) == (first.pk, False)  # the canonical form is the same document
    second, created = _publish(document=_doc("public_read"), reason="open up")
    assert created and second.generation == 2 and second.digest != first.digest
    back, created = _publish(reason="close again")  # an earlier document again: a new generation
    assert created and back.generation == 3 and back.digest == first.digest
    assert access_principal(org_id=ORG, user_id="owner").generation == 3
    with pytest.raises(ImmutableRow):
        first.save()
    with pytest.raises(ImmutableRow):
        AccessPolicyGeneration.objects.filter(pk=first.pk).update(reason="rewritten")
    assert AccessPolicyGeneration.objects.get(pk=first.pk).reason == "test"
    with pytest.raises(a.AccessPolicyInvalid):
        access_policy_publish(org_id=ORG, document=_doc(), authored_by=" ", reason="r")


def test_concurrent_publishes_get_distinct_generations_and_one_document_is_published_once():
    from tests.concurrency import run_at_once

    documents = [_doc("private"), _doc("public_read"), _doc("public_read_write"), _doc("public_read")]
    results, errors = run_at_once(*[(lambda d=d: _publish(document=d)) for d in documents])
    assert not errors
    generations = list(AccessPolicyGeneration.objects.filter(org_id=ORG).order_by("generation")
                       .values_list("generation", "digest"))
    assert [g for g, _ in generations] == list(range(1, len(generations) + 1))
    assert len(generations) in (3, 4)  # the repeated document is new again only after another one came between
    assert sum(created for _, created in results) == len(generations)
    assert {row.digest for row, _ in results} == {d for _, d in generations}


def test_shares_are_an_append_only_log_and_revocation_is_an_entry():
    _publish()
    record = _contact()
    share = dict(org_id=ORG, object_name="Contact", record_key=record.record_key, user_id="peer",
                 authored_by="ops", reason="r")
    assert record_share_set(**share, access="none") == (None, False)
    granted, created = record_share_set(**share, access="read")
    assert created and granted.sequence == 1
    assert record_share_set(**share, access="read")[1] is False
    revoked, created = record_share_set(**share, access="none")
    assert created and revoked.sequence == 2
    assert not record_access_check(org_id=ORG, user_id="peer", object_name="Contact",
                                   record_key=record.record_key, op=R).allowed
    assert list(RecordShare.objects.filter(record_key=record.record_key).order_by("sequence")
                .values_list("access", flat=True)) == ["read", "none"]
    with pytest.raises(ImmutableRow):
        RecordShare.objects.filter(pk=granted.pk).delete()
    with pytest.raises(a.AccessPolicyInvalid):
        record_share_set(**share, access="owner")
    with pytest.raises(RecordNotFound):
        record_share_set(**{**share, "record_key": "003missing"}, access="read")


def test_two_orgs_with_the_same_record_and_user_ids_decide_independently():
    _publish(ORG, _doc("private"))
    other_doc = _doc("public_read_write")
    other_doc["users"] = [dict(u, active=u["id"] != "owner") for u in other_doc["users"]]
    _publish(OTHER, other_doc)
    mine, theirs = _contact(ORG), _contact(OTHER)
    assert mine.record_key != theirs.record_key
    assert not record_access_check(org_id=ORG, user_id="peer", object_name="Contact",
                                   record_key=mine.record_key, op=E).allowed
    assert record_access_check(org_id=OTHER, user_id="peer", object_name="Contact",
                               record_key=theirs.record_key, op=E).allowed
    assert record_access_check(org_id=ORG, user_id="owner", object_name="Contact",
                               record_key=mine.record_key, op=R).allowed
    assert record_access_check(org_id=OTHER, user_id="owner", object_name="Contact",
                               record_key=theirs.record_key, op=R).basis == "inactive_user"
    # A share in one org says nothing in the other, even for identical ids.
    record_share_set(org_id=ORG, object_name="Contact", record_key=mine.record_key, user_id="peer",
                     access="edit", authored_by="ops", reason="r")
    with pytest.raises(RecordNotFound):
        record_access_check(org_id=OTHER, user_id="peer", object_name="Contact", record_key=mine.record_key, op=R)
    assert access_principal(org_id=ORG, user_id="peer").context_digest != \
        access_principal(org_id=OTHER, user_id="peer").context_digest


# --- the command ---------------------------------------------------------------------------------------------

def _manage(*args) -> str:
    out = io.StringIO()
    call_command("records", "access", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def _refused(*args) -> CommandError:
    with pytest.raises(CommandError) as caught:
        _manage(*args)
    return caught.value


def test_the_command_publishes_shows_checks_and_shares(tmp_path):
    path = tmp_path / "access.json"
    path.write_text(json.dumps(_doc()), encoding="utf-8")
    assert json.loads(_manage("show", "--org", ORG, "--json"))["generation"] is None
    assert "unrestricted" in _manage("show", "--org", ORG)
    published = json.loads(_manage("publish", str(path), "--org", ORG, "--actor", "ops", "--reason", "first"))
    assert (published["generation"], published["created"]) == (1, True)
    again = json.loads(_manage("publish", str(path), "--org", ORG, "--actor", "ops", "--reason", "retry"))
    assert (again["generation"], again["created"]) == (1, False)
    report = json.loads(_manage("show", "--org", ORG, "--json"))
    assert report["digest"] == published["digest"] and report["document"]["integration_user"] == "sync"
    assert [g["reason"] for g in report["generations"]] == ["first"]
    text = _manage("show", "--org", ORG)
    assert "user gone INACTIVE" in text and "sharing Contact: private" in text

    record = _contact()
    check = json.loads(_manage("check", "--org", ORG, "--user", "owner", "--object", "Contact",
                               "--record", record.record_key, "--op", "delete"))
    assert (check["allowed"], check["basis"], check["context_digest"]) == (True, "owner", published["digest"])
    denied = _refused("check", "--org", ORG, "--user", "peer", "--object", "Contact", "--record", record.record_key)
    assert denied.returncode == 1 and str(denied).startswith("access_denied:")
    shared = json.loads(_manage("share", "Contact", record.record_key, "--org", ORG, "--user", "peer",
                                "--access", "read", "--actor", "ops", "--reason", "needs it"))
    assert (shared["sequence"], shared["created"]) == (1, True)
    assert json.loads(_manage("check", "--org", ORG, "--user", "peer", "--object", "Contact",
                              "--record", record.record_key))["basis"] == "share"
    fields = _refused("check", "--org", ORG, "--user", "owner", "--object", "Contact", "--fields", "email,lastname")
    assert fields.returncode == 1
    assert json.loads(_manage("check", "--org", ORG, "--user", "owner", "--object", "Contact", "--op", "edit",
                              "--fields", "email"))["allowed_fields"] == ["email"]
    assert json.loads(_manage("check", "--org", ORG, "--user", "owner", "--object", "Contact",
                              "--op", "create"))["basis"] == "object_granted"


def test_the_command_refuses_bad_input_with_exit_2_and_publishes_nothing(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json", encoding="utf-8")
    invalid = tmp_path / "invalid.json"
    invalid.write_text(json.dumps({"sharing": {"Contact": "open"}}), encoding="utf-8")
    cases = [
        (("publish", str(bad), "--org", ORG, "--actor", "ops", "--reason", "r"), "access_policy_invalid"),
        (("publish", str(invalid), "--org", ORG, "--actor", "ops", "--reason", "r"), "access_policy_invalid"),
        (("publish", str(tmp_path / "missing.json"), "--org", ORG, "--actor", "ops", "--reason", "r"), "cannot read"),
        (("publish", str(invalid), "--org", " bad", "--actor", "ops", "--reason", "r"), "invalid_identity"),
        (("show", "--org", "bad org\n"), "invalid_identity"),
        (("check", "--org", ORG, "--user", "owner", "--object", "Contact", "--op", "merge"), "invalid_operation"),
        (("check", "--org", ORG, "--user", " owner", "--object", "Contact"), "invalid_identity"),
        (("share", "Contact", "003x", "--org", ORG, "--user", "u ", "--access", "read", "--actor", "ops",
          "--reason", "r"), "access_policy_invalid"),
    ]
    for args, code in cases:
        error = _refused(*args)
        assert error.returncode == 2 and str(error).startswith(code), (args, str(error))
    assert not AccessPolicyGeneration.objects.exists()
    missing = _refused("check", "--org", ORG, "--user", "owner", "--object", "Contact", "--record", "003missing")
    assert missing.returncode == 1 and str(missing).startswith("record_not_found")


# --- running user and inbound ownership ----------------------------------------------------------------------

def test_the_running_user_prefers_the_policy_user_record_of_the_org():
    from nexusflow.flows.interpreter import running_user
    from nexusflow.records.authority import AUTOMATED_PROCESS_USER

    doc = _doc()
    doc["users"].append({"id": AUTOMATED_PROCESS_USER, "email": "robot@example.org", "name": "Robot",
                         "fields": {"Email": "robot@example.org", "Name": "Robot"}})
    before = running_user(ORG)
    assert before == running_user() and before["Id"] == AUTOMATED_PROCESS_USER
    _publish(document=doc)
    assert running_user(ORG) == {**before, "Email": "robot@example.org", "Name": "Robot"}
    assert running_user(OTHER) == before == running_user()


def test_inbound_application_creates_records_owned_by_the_integration_user(client, billing_sandbox):
    from connectors.inbound.executions import execution_try_run_one
    from nexusflow.records.models import Record
    from nexusflow.records.selectors import access_integration_user
    from tests.conftest import ORG as SERVING_ORG
    from tests.conftest import hubspot_event, make_serving_org, post_signed

    make_serving_org(billing_sandbox.base_url, deploy_flow=False)
    assert post_signed(client, [hubspot_event(1, 901, 1000, "email", "before@x.io")]).status_code == 202
    while execution_try_run_one(worker_id="t"):
        pass
    _publish(SERVING_ORG)
    assert access_integration_user(org_id=SERVING_ORG) == "sync" and access_integration_user(org_id=OTHER) is None
    assert post_signed(client, [hubspot_event(2, 902, 2000, "email", "after@x.io")]).status_code == 202
    while execution_try_run_one(worker_id="t"):
        pass
    # The account's own integration user wins over the org's.
    per_account = _doc()
    per_account["integration_users"] = {"crm-webhooks": "peer", "another-account": "owner"}
    _publish(SERVING_ORG, per_account)
    assert post_signed(client, [hubspot_event(3, 903, 3000, "email", "account@x.io")]).status_code == 202
    while execution_try_run_one(worker_id="t"):
        pass
    owners = {r.fields.get("email"): r.owner_id for r in Record.objects.filter(org_id=SERVING_ORG)}
    assert owners == {"before@x.io": None, "after@x.io": "sync", "account@x.io": "peer"}
    shown = io.StringIO()
    record = Record.objects.get(org_id=SERVING_ORG, owner_id="peer")
    call_command("records", "show", "--org", SERVING_ORG, record.object_name, record.record_key, "--json",
                 stdout=shown)
    assert json.loads(shown.getvalue())["owner"] == "peer"


# --- from the metadata view's read_access lists to a policy ---------------------------------------------------

@pytest.fixture
def restricted_view(settings, tmp_path):
    """The project's metadata with ``Contact.lastname`` readable by ``integration_admin`` only, and a declared user."""
    from nexusflow.records.metadata import current_view
    from tests.records.conftest import project_objects_copy

    objects = project_objects_copy(settings, tmp_path)
    contact = json.loads((objects / "Contact.object.json").read_text())
    for field in contact["fields"]:
        if field["name"] == "lastname":
            field["read_access"] = ["integration_admin"]
    (objects / "Contact.object.json").write_text(json.dumps(contact), encoding="utf-8")
    (tmp_path / "metadata" / "users").mkdir()
    (tmp_path / "metadata" / "users" / "ops.user.json").write_text(
        json.dumps({"id": "ops", "active": False, "fields": {"Title": "Ops"}}), encoding="utf-8")
    settings.NEXUS_METADATA_DIR = tmp_path / "metadata"
    current_view.cache_clear()
    yield
    current_view.cache_clear()


def test_the_draft_carries_the_read_access_lists_and_decides_as_before(restricted_view, tmp_path):
    from nexusflow.records.authority import AUTOMATED_PROCESS_USER

    users, fields = ["integration_admin", "ops", AUTOMATED_PROCESS_USER], ["email", "firstname", "lastname"]
    before = {u: field_read_authority(user_id=u, object_name="Contact", fields=fields, org_id=ORG) for u in users}
    assert before["integration_admin"].allowed_fields == tuple(sorted(fields))
    assert before[AUTOMATED_PROCESS_USER].denied == ("lastname",)
    path = tmp_path / "draft.json"
    path.write_text(_manage("draft", "--org", ORG), encoding="utf-8")
    draft = json.loads(path.read_text())
    assert {u["id"] for u in draft["users"]} == set(users)
    assert draft["permission_sets"]["fields-integration_admin"]["fields"] == {"Contact": {"lastname": ["read", "edit"]}}
    generation = json.loads(_manage("publish", str(path), "--org", ORG, "--actor", "ops", "--reason", "adopt"))
    for user in ("integration_admin", AUTOMATED_PROCESS_USER):
        after = field_read_authority(user_id=user, object_name="Contact", fields=fields, org_id=ORG)
        assert (after.allowed_fields, after.denied) == (before[user].allowed_fields, before[user].denied)
        assert after.context_digest == generation["digest"]
    # The view's inactive user stays inactive under the policy; everyone else keeps every record operation.
    assert field_read_authority(user_id="ops", object_name="Contact", fields=["email"], org_id=ORG).denied == ("email",)
    record = _contact(owner=None)
    for op in (R, E, D):
        assert record_access_check(org_id=ORG, user_id=AUTOMATED_PROCESS_USER, object_name="Contact",
                                   record_key=record.record_key, op=op).allowed
    assert json.loads(_manage("draft", "--org", ORG)) == AccessPolicyGeneration.objects.get(org_id=ORG).document


def test_decisions_read_nothing_from_the_database(django_assert_num_queries):
    from types import SimpleNamespace

    generation, _ = _publish()
    policy = a.AccessPolicy(org_id=ORG, generation=generation.generation, digest=generation.digest,
                            document=generation.document)
    with django_assert_num_queries(0):
        owner = policy.principal("owner")
        record = SimpleNamespace(object_name="Contact", owner_id="someone-else")
        assert a.record_access(owner, record, R, share="edit").basis == "share"
        assert a.record_access(owner, record, D, share="edit").basis == "no_record_access"
        assert a.field_access(owner, "Contact", ["email"], E).allowed == ("email",)
        assert a.object_access(policy.principal("gone"), "Contact", R).basis == "inactive_user"
