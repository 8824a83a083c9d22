"""Every model has a read-only admin support view, scoped to the operator's orgs."""
import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.auth.models import Group, User
from django.test import RequestFactory
from django.utils.html import escape

from nexusflow.kernel.admin import ReadOnlyAdmin

APPS = ["records", "flows", "connectors", "runtime_outbox", "cutover"]
MODELS = [m for label in APPS for m in apps.get_app_config(label).get_models()]


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m._meta.label)
def test_model_has_a_read_only_support_view(model):
    model_admin = admin.site._registry.get(model)
    assert isinstance(model_admin, ReadOnlyAdmin), f"{model._meta.label} has no read-only admin"
    request = RequestFactory().get("/admin/")
    request.user = User(is_staff=True, is_superuser=True, is_active=True)
    assert not model_admin.has_add_permission(request)
    assert not model_admin.has_change_permission(request)
    assert not model_admin.has_delete_permission(request)
    assert model_admin.actions is None


@pytest.mark.django_db(transaction=True, databases=["default", "control"])
def test_operators_see_only_their_orgs(client):
    from connectors.models import AccountServingGate
    from connectors.store import AccountServingGateStore

    AccountServingGateStore.create(org_id="org-a", account_key="a1", pack_key="p", state="v1_serving")
    AccountServingGateStore.create(org_id="org-b", account_key="b1", pack_key="p", state="v1_serving")
    operator = User.objects.create_user("op", password="pw", is_staff=True)
    operator.groups.add(Group.objects.create(name="org:org-a"))
    request = RequestFactory().get("/admin/")
    request.user = operator
    visible = admin.site._registry[AccountServingGate].get_queryset(request)
    assert list(visible.values_list("account_key", flat=True)) == ["a1"], (str(visible.query), list(operator.groups.values_list("name", flat=True)))
    client.force_login(User.objects.create_superuser("root", password="pw"))
    response = client.get("/admin/connectors/accountservinggate/")
    assert response.status_code == 200 and b"b1" in response.content


@pytest.mark.django_db(transaction=True, databases=["default", "control"])
def test_an_operator_finds_the_support_views_on_the_admin_index(client):
    operator = User.objects.create_user("op", password="pw", is_staff=True)
    operator.groups.add(Group.objects.create(name="org:org-a"))
    client.force_login(operator)
    index = client.get("/admin/")
    assert index.status_code == 200
    assert b"/admin/connectors/accountservinggate/" in index.content
    assert b"/admin/flows/" in index.content


def _lists_reason_codes(model) -> bool:
    return any(f.name == "reason_code" for f in model._meta.concrete_fields)


def test_every_view_that_lists_reason_codes_shows_and_filters_their_class():
    from nexusflow.kernel.admin import ReasonClassFilter

    listing = [m for m in MODELS if _lists_reason_codes(m)]
    assert {m._meta.label for m in listing} >= {"connectors.RemoteEffect", "connectors.Execution", "flows.FlowRun"}
    for model in listing:
        model_admin = admin.site._registry[model]
        assert "reason_class" in model_admin.list_display, model._meta.label
        assert ReasonClassFilter in model_admin.list_filter, model._meta.label


@pytest.mark.django_db(transaction=True, databases=["default", "control"])
def test_the_remote_effect_view_filters_by_reason_class_and_keeps_the_stored_state(client):
    from connectors.models import RemoteEffect
    from connectors.reasons import OPERATOR_QUARANTINE, SUPERSEDED_BY_NEWER_VERSION
    from tests.kernel import rows

    superseded = rows.make(RemoteEffect, org_id="org-a", state="quarantined", version=1,
                           reason_code=SUPERSEDED_BY_NEWER_VERSION)
    parked = rows.make(RemoteEffect, org_id="org-a", state="quarantined", version=1, reason_code=OPERATOR_QUARANTINE)
    done = rows.make(RemoteEffect, org_id="org-a", state="finalized", version=1)
    client.force_login(User.objects.create_superuser("root", password="pw"))
    url = "/admin/connectors/remoteeffect/"

    def listed(query: str) -> set[int]:
        response = client.get(url + query)
        assert response.status_code == 200, query
        assert b"reason class" in response.content
        return {obj.pk for obj in response.context["cl"].result_list}

    assert listed("") == {superseded.pk, parked.pk, done.pk}
    assert listed("?reason_class=attention") == {parked.pk}
    assert listed("?reason_class=benign") == {superseded.pk}
    assert listed("?state=quarantined&reason_class=benign") == {superseded.pk}  # still quarantined
    page = client.get(url + "?reason_class=benign").content.decode()
    assert "attention: an operator must look" in page and "benign: expected outcome" in page
    assert page.count('<td class="field-reason_class">benign</td>') == 1
    everything = client.get(url).content.decode()
    assert everything.count('<td class="field-reason_class">attention</td>') == 1
    assert everything.count('<td class="field-reason_class">-</td>') == 1
    refused = client.get(url + "?reason_class=severe", follow=True)
    assert refused.redirect_chain == [(url + "?e=1", 302)]
    # The redirected page is the unfiltered list, and it says why.
    assert ("Reason class must be benign or attention, not &#x27;severe&#x27;: showing every row"
            in refused.content.decode())


@pytest.mark.django_db(transaction=True, databases=["default", "control"])
def test_every_support_list_page_renders_from_the_project_templates_with_its_fact_description(client):
    """ARCHITECTURE.md section 2: the support views take their templates from ``templates/``."""
    from nexusflow.kernel.admin import fact_description

    client.force_login(User.objects.create_superuser("root", password="pw"))
    for model in MODELS:
        url = f"/admin/{model._meta.app_label}/{model._meta.model_name}/"
        response = client.get(url)
        assert response.status_code == 200, url
        names = [t.name for t in response.templates]
        assert "admin/support/change_list.html" in names and "admin/base_site.html" in names, (url, names)
        page = response.content.decode()
        assert "NexusFlow support" in page and "Read-only support view." in page, url
        description = fact_description(model)
        assert description, f"{model._meta.label} has no docstring saying what the fact is"
        assert escape(description) in page, url


@pytest.mark.django_db(transaction=True, databases=["default", "control"])
def test_a_support_detail_page_shows_the_banner_and_no_save_button(client):
    from connectors.models import AccountServingGate
    from connectors.store import AccountServingGateStore

    AccountServingGateStore.create(org_id="org-a", account_key="a1", pack_key="p", state="v1_serving")
    gate = AccountServingGate.objects.get(org_id="org-a", account_key="a1")
    client.force_login(User.objects.create_superuser("root", password="pw"))
    response = client.get(f"/admin/connectors/accountservinggate/{gate.pk}/change/")
    assert response.status_code == 200
    assert "admin/support/change_form.html" in [t.name for t in response.templates]
    page = response.content.decode()
    assert "Read-only support view." in page and 'name="_save"' not in page
