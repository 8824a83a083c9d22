from django.apps import AppConfig


class CutoverConfig(AppConfig):
    name = "cutover"
    verbose_name = "Cutover"
