from django.apps import AppConfig


class CutoverConfig(AppConfig):
    name = "cutover"
    verbose_name = "Cutover"

    def ready(self) -> None:
        from . import reasons  # noqa: F401  register the cutover reason codes
