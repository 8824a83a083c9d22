from django.apps import AppConfig


class RuntimeOutboxConfig(AppConfig):
    name = "runtime_outbox"
    verbose_name = "Runtime outbox"
