"""Support reads redact sensitive context (seed 004 section 17.3; proof S004-22.6-11).

A real Flow run's checkpoints hold the trigger record, whose ``email`` the metadata declares sensitive
(``metadata/field_classes.json``). The FlowCheckpoint support view (the admin page, as an operator) and the
run's REST support read show the value's digest, never the value; business fields stay readable.
"""
from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, User
from django.db import transaction

from nexusflow.flows.models import FlowCheckpoint, FlowRun
from nexusflow.flows.redaction import redacted, sensitive_fields, support_projection
from nexusflow.flows.services import flow_deploy

from . import executor_flows as ef
from .conftest import save_record

pytestmark = pytest.mark.django_db(transaction=True)

SECRET_EMAIL = "ada.private@example.com"


def _operator(client, org):
    user = User.objects.create_user("support-op", password="pw", is_staff=True)
    with transaction.atomic():
        user.groups.add(Group.objects.create(name=f"org:{org.org_id}"))
    client.force_login(user)
    return client


def test_the_metadata_declares_which_fields_are_sensitive_and_the_projection_hides_them_at_any_depth():
    assert "email" in sensitive_fields() and "firstname" not in sensitive_fields()
    shown = support_projection({"record": {"fields": {"email": SECRET_EMAIL, "firstname": "Ada"}},
                                "context": {"vars": {"rows": [{"email": SECRET_EMAIL}]}}, "cursor": "s1"})
    assert shown["record"]["fields"] == {"email": redacted(SECRET_EMAIL), "firstname": "Ada"}
    assert shown["context"]["vars"]["rows"] == [{"email": redacted(SECRET_EMAIL)}] and shown["cursor"] == "s1"
    assert redacted(SECRET_EMAIL) == {"redacted": "sensitive", "digest": redacted(SECRET_EMAIL)["digest"]}
    assert redacted(SECRET_EMAIL) != redacted("other@example.com")  # comparable without reading


def test_support_reads_of_a_real_run_show_the_digest_of_a_sensitive_value_never_the_value(org, client):
    flow_deploy(org=org, source=ef.atomic_set_firstname(), flow_api_name="Atomic_Set_Name")
    record = save_record(org, {"lifecyclestage": "customer", "email": SECRET_EMAIL, "lastname": "Lovelace"})
    run = FlowRun.objects.get(org_id=org.org_id, record_key=record.record_key)
    checkpoint = FlowCheckpoint.objects.filter(org_id=org.org_id, run=run).order_by("sequence").first()
    assert checkpoint.context_payload["record"]["fields"]["email"] == SECRET_EMAIL  # durable: the run needs it
    operator = _operator(client, org)
    page = operator.get(f"/admin/flows/flowcheckpoint/{int(checkpoint.pk)}/change/")
    assert page.status_code == 200
    body = page.content.decode()
    assert SECRET_EMAIL not in body
    assert redacted(SECRET_EMAIL)["digest"] in body and "Lovelace" in body  # business fields stay readable
    listing = operator.get("/admin/flows/flowcheckpoint/")
    assert listing.status_code == 200 and SECRET_EMAIL not in listing.content.decode()
    read = operator.get(f"/api/v2/flows/orgs/{org.org_id}/runs/{int(run.pk)}/")
    assert read.status_code == 200 and SECRET_EMAIL not in read.content.decode()
