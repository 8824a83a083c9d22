from django.apps import AppConfig


class FlowsConfig(AppConfig):
    name = "nexusflow.flows"
    label = "flows"
    verbose_name = "Flow Runtime V2"
