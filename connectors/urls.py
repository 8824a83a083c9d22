from django.urls import path

from connectors.inbound.ingress_api import HealthApi, IngressAdmitApi
from connectors.inbound.replay_api import ReplayCreateApi, ReplayDetailApi

urlpatterns = [
    path("health/", HealthApi.as_view(), name="health"),
    path("ingress/<str:account_key>/<str:channel>/", IngressAdmitApi.as_view(), name="ingress-admit"),
    path("replays/", ReplayCreateApi.as_view(), name="replay-create"),
    path("replays/<str:account_key>/<str:replay_id>/", ReplayDetailApi.as_view(), name="replay-detail"),
]
