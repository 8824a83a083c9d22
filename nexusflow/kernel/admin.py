"""The shared read-only admin support view (CONVENTIONS.md "Admin").

No add, change or delete; every field read-only; no actions. Operators see
the orgs of their ``org:<org_id>`` groups; superusers see every org.

Every support view that lists ``reason_code`` also lists the code's severity
class (:meth:`ReadOnlyAdmin.reason_class`) and filters by it
(:class:`ReasonClassFilter`): ``attention`` keeps the rows an operator must
look at, ``benign`` the expected, recorded outcomes; the state filter still
shows every row in its stored state.
"""
from __future__ import annotations

from django.contrib import admin, messages
from django.contrib.admin.options import IncorrectLookupParameters

from .permissions import operator_org_ids
from .reasons import BENIGN, SEVERITY_CLASSES, codes_of_class, load_all_reasons


class ReasonClassFilter(admin.SimpleListFilter):
    """Admin list filter ``?reason_class=benign|attention``: rows whose ``reason_code`` is of that class.

    Rows without a code match neither class. Any other value queues an error
    message naming the accepted values and raises ``IncorrectLookupParameters``
    (the admin redirects to ``?e=1``, the unfiltered list, which shows the
    message). ARCHITECTURE.md section 6, "Reason codes".
    """

    title = "reason class"
    parameter_name = "reason_class"

    def lookups(self, request, model_admin):
        return [(name, f"{name}: expected outcome" if name == BENIGN else f"{name}: an operator must look")
                for name in SEVERITY_CLASSES]

    def queryset(self, request, queryset):
        value = self.value()
        if value is None:
            return queryset
        if value not in SEVERITY_CLASSES:
            detail = f"Reason class must be {' or '.join(SEVERITY_CLASSES)}, not {value!r}: showing every row"
            messages.error(request, detail)
            raise IncorrectLookupParameters(detail)
        load_all_reasons()
        return queryset.filter(reason_code__in=sorted(codes_of_class(value)))


def fact_description(model) -> str:
    """The first paragraph of ``model``'s docstring: what the fact is and who owns it (support banner text)."""
    doc = (model.__doc__ or "").strip()
    if not doc or doc.startswith(f"{model.__name__}("):  # Django's generated signature, not a description
        return ""
    return " ".join(doc.split("\n\n", 1)[0].split())


class ReadOnlyAdmin(admin.ModelAdmin):
    """Base of every support view: read-only, org-scoped, rendered from ``templates/admin/support/``.

    Each list and detail page shows the fact's description (its model
    docstring) above a read-only banner.
    """

    actions = None
    list_per_page = 50
    change_list_template = "admin/support/change_list.html"
    change_form_template = "admin/support/change_form.html"

    def changelist_view(self, request, extra_context=None):
        return super().changelist_view(
            request, {"fact_description": fact_description(self.model), **(extra_context or {})})

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        return super().changeform_view(
            request, object_id, form_url, {"fact_description": fact_description(self.model), **(extra_context or {})})

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

    @admin.display(description="reason class")
    def reason_class(self, obj) -> str:
        """The severity class of ``obj.reason_code`` (``benign`` / ``attention``), ``-`` without a code."""
        code = getattr(obj, "reason_code", "")
        if not code:
            return "-"
        reason = load_all_reasons().get(code)
        return reason.severity_class if reason else "-"

    def get_queryset(self, request):
        qs = super().get_queryset(request)
        orgs = operator_org_ids(request.user)
        if orgs is None:
            return qs
        return qs.filter(org_id__in=orgs)
