from django.apps import AppConfig


class RecordsConfig(AppConfig):
    name = "nexusflow.records"
    label = "records"
    verbose_name = "CRM records"
