"""URLs of the record endpoints (included at ``api/v2/records/``): create, update, delete.

The identity transfer endpoints (``.../merge/``, ``.../convert/``) are in
:mod:`nexusflow.records.transfer_urls`.
"""
from django.urls import path

from .api import RecordDetailApi
from .edit_api import RecordCreateApi

urlpatterns = [
    path("<str:object_name>/", RecordCreateApi.as_view(), name="record-create"),
    path("<str:object_name>/<str:record_key>/", RecordDetailApi.as_view(), name="record-detail"),
]
