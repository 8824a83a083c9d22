"""The shared read-only admin support view (CONVENTIONS.md "Admin").

No add, change or delete; every field read-only; no actions. Operators see
the orgs of their ``org:<org_id>`` groups; superusers see every org.
"""
from __future__ import annotations

from django.contrib import admin


def operator_org_ids(user) -> set[str] | None:
    """Return the org ids ``user`` may read, or ``None`` for all orgs."""
    if user.is_superuser:
        return None
    return {name.removeprefix("org:") for name in user.groups.values_list("name", flat=True) if name.startswith("org:")}


class ReadOnlyAdmin(admin.ModelAdmin):
    actions = None
    list_per_page = 50

    def get_readonly_fields(self, request, obj=None):
        return [field.name for field in self.model._meta.fields]

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_view_permission(self, request, obj=None):
        return request.user.is_active and request.user.is_staff

    def has_module_permission(self, request):
        # Staff operators read every support view: the admin index lists them.
        return request.user.is_active and request.user.is_staff

    def get_queryset(self, request):
        qs = super().get_queryset(request)
        orgs = operator_org_ids(request.user)
        if orgs is None:
            return qs
        return qs.filter(org_id__in=orgs)
