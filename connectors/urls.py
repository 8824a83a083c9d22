from django.urls import path

from .api import IngressAdmitApi

urlpatterns = [
    path("ingress/<str:account_key>/<str:channel>/", IngressAdmitApi.as_view(), name="ingress-admit"),
]
