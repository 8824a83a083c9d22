"""WSGI entry point for the ``web`` process."""
import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "nexusflow.settings")
application = get_wsgi_application()
