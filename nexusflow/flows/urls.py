from django.urls import path

from .api import FlowRunIdOnlyReadApi, FlowRunSupportReadApi

urlpatterns = [
    path("orgs/<str:org_id>/runs/<str:run_id>/", FlowRunSupportReadApi.as_view(), name="flow-run-support-read"),
    path("runs/<str:run_id>/", FlowRunIdOnlyReadApi.as_view(), name="flow-run-id-only-read"),
]
