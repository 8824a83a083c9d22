from django.apps import AppConfig


class RecordsConfig(AppConfig):
    name = "nexusflow.records"
    label = "records"
    verbose_name = "CRM records"

    def ready(self) -> None:
        from . import token_schema  # noqa: F401  the OpenAPI security scheme of operator tokens
