from django.urls import path

from .api import HealthApi, IngressAdmitApi

urlpatterns = [
    path("health/", HealthApi.as_view(), name="health"),
    path("ingress/<str:account_key>/<str:channel>/", IngressAdmitApi.as_view(), name="ingress-admit"),
]
