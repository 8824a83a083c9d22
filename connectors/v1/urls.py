"""The V1 runtime's own routes (mounted at ``api/v1/``)."""
from django.urls import path

from connectors.v1.api import V1IngressAdmitApi

urlpatterns = [
    path("ingress/<str:account_key>/<str:channel>/", V1IngressAdmitApi.as_view(), name="v1-ingress-admit"),
]
