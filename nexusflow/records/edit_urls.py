"""URLs of the local record edit endpoints (included at ``api/v2/records/``)."""
from django.urls import path

from .edit_api import RecordCreateApi, RecordUpdateApi

urlpatterns = [
    path("<str:object_name>/", RecordCreateApi.as_view(), name="record-create"),
    path("<str:object_name>/<str:record_key>/", RecordUpdateApi.as_view(), name="record-update"),
]
