from django.urls import path

from .api import RecordDeleteApi

urlpatterns = [
    path("<str:object_name>/<str:record_key>/", RecordDeleteApi.as_view(), name="record-delete"),
]
