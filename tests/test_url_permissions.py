"""Every URL of the project and who may call it (``nexusflow/kernel/permissions.py``, ``REST_FRAMEWORK``).

:data:`EXPECTED` lists every route ``django.urls.get_resolver()`` knows (the
REST API, the schema and its page, the admin), keyed by ``namespace:name`` or,
for an unnamed route, by its route string:

* ``operator``: a DRF view with ``[IsOperator]`` and the default authenticators
  (HTTP basic first): anonymous answers 401 ``not_authenticated`` with
  ``WWW-Authenticate``, an authenticated user who is no operator 403;
* ``public``: a DRF view with ``[AllowAny]`` (health, the schema and its page):
  anonymous ``GET`` answers 200;
* ``signature``: a DRF view with ``[AllowAny]`` and no authenticator: the provider
  authenticates by its signature of the request (401 ``signature_*`` unsigned);
* ``admin``: a view wrapped by ``AdminSite.admin_view`` (staff only): anonymous
  ``GET`` is redirected to the admin login;
* ``login``: the admin login page: anonymous ``GET`` answers 200.

A URL added without an entry, or whose permission differs from its entry,
fails :func:`test_every_url_has_an_entry_and_its_permission`; the self-tests
add deliberately broken views through ``override_settings(ROOT_URLCONF=...)``.
"""
from __future__ import annotations

import re
import types
from dataclasses import dataclass

import pytest
from django.contrib.admin import AdminSite
from django.contrib.auth.models import User
from django.test import override_settings
from django.urls import URLPattern, URLResolver, get_resolver, path, resolve, reverse
from django.urls.resolvers import RegexPattern
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.test import APIClient
from rest_framework.views import APIView

from connectors.models import Receipt
from nexusflow.kernel.permissions import IsOperator

PUBLIC, OPERATOR, SIGNATURE, ADMIN, LOGIN = "public", "operator", "signature", "admin", "login"

#: The DRF routes and the admin site's own routes.
ROUTES = {
    "api-schema": PUBLIC,
    "api-docs": PUBLIC,
    "health": PUBLIC,
    "metrics": OPERATOR,
    "ingress-admit": SIGNATURE,
    "v1-ingress-admit": SIGNATURE,
    "replay-create": OPERATOR,
    "replay-detail": OPERATOR,
    "flow-run-support-read": OPERATOR,
    "flow-run-id-only-read": OPERATOR,
    "record-merge": OPERATOR,
    "record-convert": OPERATOR,
    "record-create": OPERATOR,
    "record-detail": OPERATOR,
    "admin:index": ADMIN,
    "admin:login": LOGIN,
    "admin:logout": ADMIN,
    "admin:password_change": ADMIN,
    "admin:password_change_done": ADMIN,
    "admin:autocomplete": ADMIN,
    "admin:jsi18n": ADMIN,
    "admin:view_on_site": ADMIN,
    "admin:app_list": ADMIN,
    "admin/(?P<url>.*)$": ADMIN,
    "admin:auth_user_password_change": ADMIN,
}
#: Models with an admin view: each has five named ``admin`` routes and the ``<object_id>/`` redirect to its change
#: page (also wrapped by ``admin_view``).
ADMIN_MODELS = (
    "auth.group", "auth.user",
    "django_q.schedule", "django_q.success", "django_q.failure", "django_q.ormq",
    "records.record", "records.identitytransfer", "records.operatortoken", "records.operatortokenrevocation",
    "records.recordfieldhistory", "records.recordhistorysequence",
    "records.accesspolicygeneration", "records.recordshare",
    "flows.flowactioncataloggeneration", "flows.flowruntimemetadataview", "flows.flowexecutionplan",
    "flows.flowactivation", "flows.flowrun", "flows.flowstepexecution", "flows.flowstepattempt",
    "flows.flowcheckpoint", "flows.flowdependency", "flows.flowwakesignal", "flows.floweffectlink",
    "flows.flowauditevent", "flows.flowscheduleoccurrence", "flows.flowdeploymentsource",
    "connectors.accountservinggate", "connectors.servingepoch", "connectors.receipt", "connectors.receiptcomponent",
    "connectors.event", "connectors.execution", "connectors.orderinglane", "connectors.projectionwindow",
    "connectors.executiondependency", "connectors.orderinghandoff", "connectors.remoteeffect",
    "connectors.remoteeffectevidence", "connectors.dispatchpermit", "connectors.credentialgenerationdispatchgate",
    "connectors.remotelink", "connectors.catalogbinding", "connectors.streamcursor", "connectors.packgeneration",
    "connectors.connectorserviceconfigurationgeneration", "connectors.credentialgeneration",
    "connectors.gatetransitionevidence", "connectors.receiptadmissionkey", "connectors.projection",
    "connectors.executionattempt", "connectors.orderingdecision", "connectors.remoteeffectattempt",
    "connectors.replayrequest", "connectors.workerprocess", "connectors.remotelinkevidence",
    "connectors.pushlinkrevalidationreceipt",
    "connectors.v1account", "connectors.v1processgeneration", "connectors.v1transportkey", "connectors.v1event",
    "connectors.v1schedulerlease", "connectors.v1streamcursor", "connectors.v1providercall",
    "connectors.v1maintenancebarrier", "connectors.v1egressdenial", "connectors.servingpublicationbarrierset",
    "runtime_outbox.outboundcommand", "runtime_outbox.applicationresult", "runtime_outbox.outboxmessage",
    "runtime_outbox.intentresultreceipt", "runtime_outbox.replayrecordwrite", "runtime_outbox.inboxacceptance",
    "runtime_outbox.runtimepolicygeneration",
    "cutover.cutoverdecision", "cutover.cutoverevidence", "cutover.cutoverreadinesscertificate",
    "cutover.v1shutdowncertificate", "cutover.orderingbaseline", "cutover.v1restorepoint", "cutover.restoreattempt",
)


def _admin_model_routes(labels) -> dict[str, str]:
    table = {}
    for label in labels:
        app, model = label.split(".")
        table.update({f"admin:{app}_{model}_{view}": ADMIN for view in ("changelist", "add", "history", "delete",
                                                                          "change")})
        table[f"admin/{app}/{model}/<path:object_id>/"] = ADMIN
    return table


EXPECTED: dict[str, str] = {**ROUTES, **_admin_model_routes(ADMIN_MODELS)}

#: Permission classes of each DRF kind.
PERMISSIONS = {OPERATOR: (IsOperator,), PUBLIC: (AllowAny,), SIGNATURE: (AllowAny,)}
#: Values for path arguments in the requests below (any other argument is ``1``).
SAMPLE_ARGS = {"app_label": "records", "url": "no-such-page/", "account_key": "acct", "channel": "hooks",
               "object_name": "thing", "record_key": "k1", "org_id": "org1", "replay_id": "r1"}
#: The path arguments of the signature routes for the account ``make_serving_org`` configures.
SERVING_ARGS = {"account_key": "crm-webhooks", "channel": "webhooks"}
NOT_AUTHENTICATED = {"error": "not_authenticated", "detail": "Authentication credentials were not provided."}


@dataclass(frozen=True)
class Route:
    key: str  # "namespace:name", or the route string of an unnamed route
    route: str
    sample: str  # a path this route resolves, e.g. "/api/v2/replays/acct/r1/"
    callback: object

    @property
    def api_view(self) -> type[APIView] | None:
        cls = getattr(self.callback, "cls", None)
        return cls if isinstance(cls, type) and issubclass(cls, APIView) else None

    @property
    def methods(self) -> list[str]:
        """The HTTP methods the DRF view implements (``OPTIONS`` last)."""
        cls = self.api_view
        return [m.upper() for m in cls.http_method_names if m not in ("head", "options", "trace")
                and hasattr(cls, m)] + ["OPTIONS"]


def _sample(pattern: URLPattern | URLResolver, args: dict[str, str] = SAMPLE_ARGS) -> str:
    """A path piece ``pattern`` matches: each argument replaced by its value in ``args`` (else ``1``)."""
    text = str(pattern.pattern)
    if isinstance(pattern.pattern, RegexPattern):
        return re.sub(r"\(\?P<(\w+)>[^()]*\)", lambda m: args.get(m[1], "1"), text.strip("^$"))
    return re.sub(r"<(?:\w+:)?(\w+)>", lambda m: args.get(m[1], "1"), text)


def routes(resolver: URLResolver | None = None) -> list[Route]:
    """Every URL pattern under ``resolver`` (default: the current root URLconf), recursively."""
    found: list[Route] = []

    def walk(node: URLResolver, prefix: str, sample: str, namespace: str | None) -> None:
        for pattern in node.url_patterns:
            route, here = prefix + str(pattern.pattern), sample + _sample(pattern)
            if isinstance(pattern, URLResolver):
                walk(pattern, route, here, pattern.namespace or namespace)
            elif isinstance(pattern, URLPattern):
                key = (f"{namespace}:{pattern.name}" if namespace else pattern.name) if pattern.name else route
                found.append(Route(key, route, "/" + here, pattern.callback))

    walk(resolver or get_resolver(), "", "", None)
    return found


def route_named(key: str) -> Route:
    return next(r for r in routes() if r.key == key)


def structure_problems(route: Route, kind: str) -> list[str]:
    """How ``route``'s view differs from what ``kind`` requires (empty: it matches)."""
    cls = route.api_view
    if kind in PERMISSIONS:
        if cls is None:
            return [f"{route.key}: not a DRF view, cannot be {kind}"]
        problems = []
        permissions = tuple(cls.permission_classes)
        if permissions != PERMISSIONS[kind]:
            problems.append(f"{route.key}: permission classes {[c.__name__ for c in permissions]} differ from "
                            f"{kind}'s {[c.__name__ for c in PERMISSIONS[kind]]}")
        authenticators = tuple(cls.authentication_classes)
        if kind == OPERATOR and authenticators != tuple(api_settings.DEFAULT_AUTHENTICATION_CLASSES):
            problems.append(f"{route.key}: authentication classes {[c.__name__ for c in authenticators]} are not "
                            "the default ones")
        if kind == SIGNATURE and authenticators:
            problems.append(f"{route.key}: a signature route takes no authenticator")
        return problems
    if cls is not None:
        return [f"{route.key}: a DRF view listed as {kind}"]
    if kind == ADMIN and not _admin_wrapped(route.callback):
        return [f"{route.key}: not wrapped by AdminSite.admin_view"]
    if kind == LOGIN and not (getattr(route.callback, "__func__", None) is AdminSite.login):
        return [f"{route.key}: not the admin login"]
    return []


def _admin_wrapped(view, depth: int = 0) -> bool:
    """True when ``view`` checks ``AdminSite.has_permission`` first: the admin's ``wrap`` (it marks the view
    ``admin_site`` / ``model_admin``) or ``admin_view`` itself (its ``inner``, under ``csrf_protect``)."""
    if depth > 4 or not callable(view):
        return False
    if hasattr(view, "admin_site") or hasattr(view, "model_admin"):
        return True
    if getattr(getattr(view, "__code__", None), "co_qualname", "") == "AdminSite.admin_view.<locals>.inner":
        return True
    inside = [getattr(view, "__wrapped__", None)]
    for cell in getattr(view, "__closure__", None) or ():
        try:
            inside.append(cell.cell_contents)
        except ValueError:  # an empty cell
            continue
    return any(_admin_wrapped(v, depth + 1) for v in inside)


def url_permission_problems(table: dict[str, str]) -> list[str]:
    """Every URL without an entry in ``table``, every entry without a URL, every permission that differs."""
    found = routes()
    problems = [f"{route.key}: a URL without an entry in the table" for route in found if route.key not in table]
    problems += [f"{key}: listed, but there is no such URL" for key in sorted(table.keys() - {r.key for r in found})]
    return problems + [p for route in found if route.key in table for p in structure_problems(route, table[route.key])]


def anonymous_problems(client: APIClient, route: Route, kind: str) -> list[str]:
    """How an anonymous request to ``route`` is answered other than ``kind`` requires (empty: as required).

    ``operator``: every method the view implements, with an empty body, answers 401 ``not_authenticated``
    with ``WWW-Authenticate`` (refused before the view reads or writes). ``public``: ``GET`` answers 200.
    ``admin``: ``GET`` is redirected to the admin login. ``login``: ``GET`` answers 200.
    """
    assert resolve(route.sample).func is route.callback, (route.key, route.sample)
    if kind == OPERATOR:
        problems = []
        for method in route.methods:
            response = client.generic(method, route.sample, data=b"", content_type="application/json")
            if response.status_code != 401:
                problems.append(f"{route.key}: anonymous {method} answered {response.status_code}")
            elif response.json() != NOT_AUTHENTICATED or not response.get("WWW-Authenticate", "").startswith("Basic"):
                problems.append(f"{route.key}: anonymous {method} answered 401 {response.json()} without "
                                "the stable body or WWW-Authenticate")
        return problems
    response = client.get(route.sample)
    if kind in (PUBLIC, LOGIN):
        return [] if response.status_code == 200 else [f"{route.key}: anonymous GET answered {response.status_code}"]
    location = response.get("Location", "")
    # Logging out without a session goes to the index (which sends to the login); every other view to the login.
    sent_to_login = (location == reverse("admin:index") if route.key == "admin:logout"
                     else location.startswith(reverse("admin:login") + "?next="))
    if kind == ADMIN and not (response.status_code == 302 and sent_to_login):
        return [f"{route.key}: anonymous GET answered {response.status_code} {location!r}, not the admin login"]
    return []


# --- the table -----------------------------------------------------------------------------------
def test_every_url_has_an_entry_and_its_permission():
    assert url_permission_problems(EXPECTED) == []


def test_the_default_closes_a_view_and_answers_401_to_anonymous():
    assert tuple(api_settings.DEFAULT_PERMISSION_CLASSES) == (IsOperator,)
    first = api_settings.DEFAULT_AUTHENTICATION_CLASSES[0]()
    assert first.authenticate_header(None), "the first authenticator decides 401 (with WWW-Authenticate) vs 403"


# --- anonymous requests --------------------------------------------------------------------------
@pytest.mark.django_db
@pytest.mark.parametrize("key", sorted(k for k, kind in ROUTES.items() if kind != SIGNATURE))
def test_an_anonymous_request_is_refused_unless_public(key):
    assert anonymous_problems(APIClient(), route_named(key), EXPECTED[key]) == []


@pytest.mark.django_db
def test_every_admin_view_sends_an_anonymous_request_to_the_login():
    client = APIClient()
    admin_routes = [r for r in routes() if EXPECTED.get(r.key) == ADMIN]
    assert len(admin_routes) == len(ADMIN_MODELS) * 6 + sum(kind == ADMIN for kind in ROUTES.values())
    problems = [p for route in admin_routes for p in anonymous_problems(client, route, EXPECTED[route.key])]
    assert problems == []


@pytest.mark.django_db
@pytest.mark.parametrize("key", sorted(k for k, kind in ROUTES.items() if kind == OPERATOR))
def test_a_user_who_is_no_operator_is_forbidden(key):
    route = route_named(key)
    client = APIClient()
    client.force_login(User.objects.create_user("plain"))
    for method in route.methods:
        response = client.generic(method, route.sample, data=b"", content_type="application/json")
        assert (response.status_code, response.json()["error"]) == (403, "permission_denied"), method
        assert "WWW-Authenticate" not in response


@pytest.mark.django_db(transaction=True, databases=["default", "control"])
def test_an_unsigned_request_to_a_signature_route_is_refused_before_admission(billing_sandbox):
    from cutover.services import cutover_greenfield
    from cutover.v1_install import cutover_v1_install
    from nexusflow.kernel.scope import OrgScope
    from tests.conftest import ORG, apply_service_configuration

    # Installed as V1 first (the V1 ingress route knows the accounts), then activated as V2.
    org = OrgScope(ORG)
    apply_service_configuration(org, billing_sandbox.base_url)
    cutover_v1_install(org=org)
    cutover_greenfield(org=org)
    for key in sorted(k for k, kind in ROUTES.items() if kind == SIGNATURE):
        sample = re.sub(r"<(?:\w+:)?(\w+)>", lambda m: SERVING_ARGS[m[1]], "/" + route_named(key).route)
        response = APIClient().generic("POST", sample, data=b"", content_type="application/json")
        assert (response.status_code, response.json()["error"]) == (401, "signature_missing"), key
    assert Receipt.objects.count() == 0


# --- self-tests: deliberately broken views -------------------------------------------------------
class _ForgottenApi(APIView):
    """A new view whose author named no permission: the default applies, but the table has no entry."""

    def get(self, request):
        return Response({"secret": "data"})


class _OpenedApi(APIView):
    """A new view that empties its permissions (as views here did before the default closed them)."""

    authentication_classes: list = []
    permission_classes: list = []

    def get(self, request):
        return Response({"secret": "data"})


def _urlconf(*extra) -> types.ModuleType:
    from nexusflow import urls

    module = types.ModuleType("tests.test_url_permissions_urls")
    module.urlpatterns = [*urls.urlpatterns, *extra]
    return module


@pytest.mark.django_db
def test_self_test_a_view_added_without_an_entry_is_caught():
    broken = _urlconf(path("api/v2/forgotten/", _ForgottenApi.as_view(), name="forgotten"))
    with override_settings(ROOT_URLCONF=broken):
        assert url_permission_problems(EXPECTED) == ["forgotten: a URL without an entry in the table"]
        # Listed as public, its permission (the closed default) differs from the entry.
        assert url_permission_problems({**EXPECTED, "forgotten": PUBLIC}) == [
            "forgotten: permission classes ['IsOperator'] differ from public's ['AllowAny']"]
        # The corrected form: listed with the permission it has, and anonymous is refused.
        assert url_permission_problems({**EXPECTED, "forgotten": OPERATOR}) == []
        assert anonymous_problems(APIClient(), route_named("forgotten"), OPERATOR) == []


@pytest.mark.django_db
def test_self_test_a_view_that_empties_its_permissions_is_caught():
    broken = _urlconf(path("api/v2/opened/", _OpenedApi.as_view(), name="opened"))
    with override_settings(ROOT_URLCONF=broken):
        assert url_permission_problems({**EXPECTED, "opened": OPERATOR}) == [
            "opened: permission classes [] differ from operator's ['IsOperator']",
            "opened: authentication classes [] are not the default ones",
        ]
        assert anonymous_problems(APIClient(), route_named("opened"), OPERATOR) == [
            "opened: anonymous GET answered 200", "opened: anonymous OPTIONS answered 200"]


@pytest.mark.django_db
def test_self_test_an_entry_without_a_url_and_an_unwrapped_admin_view_are_caught():
    from django.http import HttpResponse

    def plain(request):
        return HttpResponse("open")

    broken = _urlconf(path("admin-like/", plain, name="admin-like"))
    with override_settings(ROOT_URLCONF=broken):
        assert url_permission_problems({**EXPECTED, "admin-like": ADMIN, "gone": OPERATOR}) == [
            "gone: listed, but there is no such URL", "admin-like: not wrapped by AdminSite.admin_view"]
        assert anonymous_problems(APIClient(), route_named("admin-like"), ADMIN) == [
            "admin-like: anonymous GET answered 200 '', not the admin login"]
