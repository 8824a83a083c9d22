"""Managed system substrate: tables no generic CRUD surface may write or expose.

Seed 002 "2026-07-22 Finalized Mapping Revalidation CARVE_DOWN", "Acceptance":
the revalidation receipt table "is blocked from generic CRUD and listed as
managed system substrate". The same holds for every append-only evidence or
receipt table that an L0 transaction writes next to the authority it records:
an operator reads them through the read-only admin, and only their owning
service appends to them.

- :data:`SYSTEM_SUBSTRATE` lists them by model label;
- :func:`substrate_exposures` reports every way one of them is writable or
  exposed: a missing or writable admin (``ReadOnlyAdmin`` and no
  add/change/delete permission, even for a superuser), a model that is not a
  store-guarded append-only row, and any non-admin URL route whose view
  names the model (its queryset, model, serializers or module globals);
- :func:`check_substrate` runs it as a Django system check (``manage.py check``).
"""
from __future__ import annotations

from collections.abc import Iterator

from django.core import checks

#: ``app_label.ModelName`` of every managed substrate table.
SYSTEM_SUBSTRATE: frozenset[str] = frozenset({
    "connectors.PushLinkRevalidationReceipt",
    "connectors.RemoteLinkEvidence",
    "connectors.RemoteEffectEvidence",
    "connectors.GateTransitionEvidence",
    "connectors.OrderingDecision",
})


def substrate_models() -> list:
    """The model classes of :data:`SYSTEM_SUBSTRATE`, sorted by label.

    Raises:
        LookupError: a listed label names no installed model.
    """
    from django.apps import apps

    return [apps.get_model(label) for label in sorted(SYSTEM_SUBSTRATE)]


def _url_views(patterns, prefix: str = "") -> Iterator[tuple[str, object]]:
    """Yield ``(route, view callback)`` of every non-admin URL pattern, recursively."""
    from django.urls import URLPattern, URLResolver

    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            if pattern.app_name == "admin" or pattern.namespace == "admin":
                continue  # the admin site is checked through its ModelAdmins
            yield from _url_views(pattern.url_patterns, prefix + str(pattern.pattern))
        elif isinstance(pattern, URLPattern):
            yield prefix + str(pattern.pattern), pattern.callback


def _view_models(callback) -> set:
    """Every model a view names: queryset, ``model``, serializer ``Meta.model`` and its module's globals."""
    import inspect
    import sys

    from django.db import models

    view = getattr(callback, "view_class", None) or getattr(callback, "cls", None) or callback
    named: set = set()
    queryset = getattr(view, "queryset", None)
    if queryset is not None and getattr(queryset, "model", None) is not None:
        named.add(queryset.model)
    if inspect.isclass(getattr(view, "model", None)):
        named.add(view.model)
    for value in vars(view).values() if inspect.isclass(view) else ():
        meta = getattr(value, "Meta", None) if inspect.isclass(value) else None
        if meta is not None and inspect.isclass(getattr(meta, "model", None)):
            named.add(meta.model)
    serializer = getattr(view, "serializer_class", None)
    if serializer is not None and inspect.isclass(getattr(getattr(serializer, "Meta", None), "model", None)):
        named.add(serializer.Meta.model)
    module = sys.modules.get(getattr(view, "__module__", ""), None)
    for value in vars(module).values() if module is not None else ():
        if inspect.isclass(value) and issubclass(value, models.Model):
            named.add(value)
    return named


def substrate_exposures(*, site=None, urlconf=None) -> list[str]:
    """Report every generic CRUD path to a substrate table; an empty list means none.

    Args:
        site: the admin site (default ``django.contrib.admin.site``).
        urlconf: the URLconf module name (default ``settings.ROOT_URLCONF``).

    Returns:
        One message per exposure, naming the model label and the path.
    """
    from django.contrib import admin
    from django.contrib.auth.models import User
    from django.test import RequestFactory
    from django.urls import get_resolver

    from .admin import ReadOnlyAdmin
    from .models import GuardedModel
    from .store import load_all_stores

    site = site or admin.site
    stores = load_all_stores()
    found: list[str] = []
    request = RequestFactory().get("/admin/")
    request.user = User(is_staff=True, is_superuser=True, is_active=True)  # the widest operator, never saved
    substrate = substrate_models()
    for model in substrate:
        label = model._meta.label
        if not issubclass(model, GuardedModel):
            found.append(f"{label}: not a GuardedModel (ORM writes are not blocked)")
        if label in stores:
            found.append(f"{label}: has a CAS store; substrate rows are append-only")
        model_admin = site._registry.get(model)
        if model_admin is None:
            found.append(f"{label}: no read-only admin support view")
            continue
        if not isinstance(model_admin, ReadOnlyAdmin):
            found.append(f"{label}: admin {type(model_admin).__name__} is not a ReadOnlyAdmin")
        for verb in ("add", "change", "delete"):
            if getattr(model_admin, f"has_{verb}_permission")(request):
                found.append(f"{label}: admin grants {verb} to a superuser")
        if model_admin.actions:
            found.append(f"{label}: admin has actions")
    for route, callback in _url_views(get_resolver(urlconf).url_patterns):
        for model in sorted(_view_models(callback) & set(substrate), key=lambda m: m._meta.label):
            found.append(f"{model._meta.label}: exposed by route {route!r}")
    return found


@checks.register("substrate")
def check_substrate(app_configs=None, **kwargs) -> list[checks.Error]:
    """Django system check ``kernel.E001``: no substrate table is writable or exposed by a generic surface."""
    return [checks.Error(message, id="kernel.E001") for message in substrate_exposures()]
