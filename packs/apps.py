from django.apps import AppConfig


class PacksConfig(AppConfig):
    """L1 packs: provider data, sandboxes and the demo harness (no models)."""

    name = "packs"
    verbose_name = "L1 packs"
