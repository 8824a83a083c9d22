from django.apps import AppConfig


class CutoverConfig(AppConfig):
    name = "cutover"
    verbose_name = "Cutover"

    def ready(self) -> None:
        from connectors.v1.generations import register_v1_start_check

        from . import reasons  # noqa: F401  register the cutover reason codes
        from .restore import v1_start_refusals

        register_v1_start_check(v1_start_refusals)

        from connectors.serving.credential_gates import register_urgent_revocation_abort

        from .activate import urgent_revocation_abort

        register_urgent_revocation_abort(urgent_revocation_abort)
