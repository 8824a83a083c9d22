"""Who may call the operator REST API, and for which orgs (ARCHITECTURE.md section 2, "Trusted scope").

An operator is an active staff user; the orgs it acts for are its
``org:<org_id>`` groups (a superuser acts for every org). The org of a request
comes from these groups, never from a payload value.

``REST_FRAMEWORK`` makes :class:`IsOperator` the default permission and tries
HTTP basic before the session, so a view is closed unless it opens itself, and
an anonymous request answers 401 ``not_authenticated`` with
``WWW-Authenticate`` while an authenticated user who is no operator answers 403
``permission_denied``.
"""
from __future__ import annotations

from rest_framework.permissions import BasePermission

from .errors import NexusError


class IsOperator(BasePermission):
    """An authenticated, active staff user (DRF permission)."""

    def has_permission(self, request, view) -> bool:
        user = request.user
        return bool(user and user.is_authenticated and user.is_active and user.is_staff)


class OrgNotAuthorized(NexusError):
    """The operator does not act for the org it named (HTTP 403)."""

    code = "org_not_authorized"
    definite = True
    http_status = 403


def operator_org_ids(user) -> set[str] | None:
    """Return the org ids ``user`` may act for (its ``org:<id>`` groups), or ``None`` for all orgs (a superuser)."""
    if user.is_superuser:
        return None
    return {name.removeprefix("org:") for name in user.groups.values_list("name", flat=True) if name.startswith("org:")}


def require_operator_org(user, org_id: str, *, detail: str = "") -> None:
    """Refuse ``org_id`` unless ``user`` acts for it.

    Raises:
        OrgNotAuthorized: ``org_id`` is not one of the operator's orgs.
    """
    orgs = operator_org_ids(user)
    if orgs is not None and org_id not in orgs:
        raise OrgNotAuthorized(detail or f"the operator does not act for org {org_id!r}")
