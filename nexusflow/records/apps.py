from django.apps import AppConfig


class RecordsConfig(AppConfig):
    name = "nexusflow.records"
    label = "records"
    verbose_name = "CRM records"
    # The OpenAPI security scheme of operator tokens (token_schema) is imported by nexusflow/urls.py, with
    # the schema views that use it: a worker process, which serves no URL, does not load drf-spectacular.
