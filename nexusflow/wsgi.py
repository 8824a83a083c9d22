"""WSGI entry point for the ``web`` process."""
import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "nexusflow.settings")
application = get_wsgi_application()


def _warm_schema() -> None:
    # drf-spectacular loads its extensions lazily, and two first requests
    # racing through that load can fail; build the schema once at start-up.
    from drf_spectacular.generators import SchemaGenerator

    SchemaGenerator().get_schema(request=None, public=True)


_warm_schema()
