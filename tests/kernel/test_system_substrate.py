"""Managed system substrate stays out of generic CRUD (seed 002 "2026-07-22 ... CARVE_DOWN", "Acceptance").

The revalidation receipt table, and every other listed append-only fact table,
has a read-only admin that refuses add, change and delete even to a superuser,
and no non-admin URL route names it. The checker is also run against a
deliberately writable admin and a deliberately exposing REST view.
"""
from __future__ import annotations

import pytest
from django.contrib import admin
from django.contrib.admin import AdminSite, ModelAdmin
from django.contrib.auth.models import User
from django.core import checks
from django.test import RequestFactory
from django.urls import path
from rest_framework import serializers
from rest_framework.views import APIView

from connectors.models import PushLinkRevalidationReceipt
from nexusflow.kernel.admin import ReadOnlyAdmin
from nexusflow.kernel.models import GuardedModel
from nexusflow.kernel.store import load_all_stores
from nexusflow.kernel.substrate import SYSTEM_SUBSTRATE, substrate_exposures, substrate_models

RECEIPT = "connectors.PushLinkRevalidationReceipt"


def test_the_revalidation_receipt_and_the_append_only_evidence_tables_are_substrate():
    assert RECEIPT in SYSTEM_SUBSTRATE
    assert {"connectors.RemoteLinkEvidence", "connectors.RemoteEffectEvidence"} <= SYSTEM_SUBSTRATE
    stores = load_all_stores()
    for model in substrate_models():
        assert issubclass(model, GuardedModel) and model._meta.label not in stores, model._meta.label


@pytest.mark.parametrize("label", sorted(SYSTEM_SUBSTRATE))
def test_a_substrate_admin_is_read_only_even_for_a_superuser(label):
    model = next(m for m in substrate_models() if m._meta.label == label)
    model_admin = admin.site._registry[model]
    assert isinstance(model_admin, ReadOnlyAdmin)
    request = RequestFactory().get("/admin/")
    request.user = User(is_staff=True, is_superuser=True, is_active=True)
    assert not model_admin.has_add_permission(request)
    assert not model_admin.has_change_permission(request)
    assert not model_admin.has_change_permission(request, obj=model())
    assert not model_admin.has_delete_permission(request)
    assert not model_admin.has_delete_permission(request, obj=model())
    assert model_admin.actions is None
    assert set(model_admin.get_readonly_fields(request)) == {f.name for f in model._meta.fields}


def test_no_route_exposes_substrate_and_the_system_check_is_clean():
    assert substrate_exposures() == []
    assert [e for e in checks.run_checks() if e.id == "kernel.E001"] == []


class _WritableReceiptAdmin(ModelAdmin):
    pass


class _ReceiptListApi(APIView):
    class OutputSerializer(serializers.ModelSerializer):
        class Meta:
            model = PushLinkRevalidationReceipt
            fields = "__all__"


urlpatterns = [path("api/v2/receipts/", _ReceiptListApi.as_view())]


def test_a_writable_admin_or_an_exposing_route_is_reported():
    site = AdminSite(name="probe")
    site.register(PushLinkRevalidationReceipt, _WritableReceiptAdmin)
    for model in substrate_models():
        if model is not PushLinkRevalidationReceipt:
            site.register(model, ReadOnlyAdmin)
    found = substrate_exposures(site=site, urlconf=__name__)
    assert f"{RECEIPT}: admin _WritableReceiptAdmin is not a ReadOnlyAdmin" in found
    assert {f"{RECEIPT}: admin grants {verb} to a superuser" for verb in ("add", "change", "delete")} <= set(found)
    assert f"{RECEIPT}: exposed by route 'api/v2/receipts/'" in found
    assert all(line.startswith(RECEIPT) for line in found), found
