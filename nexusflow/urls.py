"""URL map: the ingress API, the REST API schema and its interactive page (Swagger UI), the Prometheus metrics
(operators only) and the read-only admin."""
from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from nexusflow.kernel.api import MetricsApi
from nexusflow.records import token_schema  # noqa: F401  the OpenAPI security scheme of operator tokens

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("metrics", MetricsApi.as_view(), name="metrics"),
    path("api/v1/", include("connectors.v1.urls")),
    path("api/v2/", include("connectors.urls")),
    path("api/v2/flows/", include("nexusflow.flows.urls")),
    path("api/v2/records/", include("nexusflow.records.transfer_urls")),
    path("api/v2/records/", include("nexusflow.records.urls")),
]
