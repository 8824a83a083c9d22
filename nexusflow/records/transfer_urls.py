"""URLs of the identity transfer endpoints (included at ``api/v2/records/``)."""
from django.urls import path

from .transfer_api import RecordConvertApi, RecordMergeApi

urlpatterns = [
    path("<str:object_name>/<str:record_key>/merge/", RecordMergeApi.as_view(), name="record-merge"),
    path("<str:object_name>/<str:record_key>/convert/", RecordConvertApi.as_view(), name="record-convert"),
]
