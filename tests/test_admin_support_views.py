"""Every model has a read-only admin support view, scoped to the operator's orgs."""
import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.auth.models import Group, User
from django.test import RequestFactory

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
