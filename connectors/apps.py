from django.apps import AppConfig


class ConnectorsConfig(AppConfig):
    name = "connectors"
    verbose_name = "Connector V2"

    def ready(self) -> None:
        from . import reasons  # noqa: F401  register the connector reason codes
