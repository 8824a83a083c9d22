"""Management commands that serve no URL and no admin page: which system checks run before them.

Every operator command and ``run_workers`` derive from :class:`OperatorCommand`. The model, URL, admin and
substrate-exposure checks belong to the web deployment (``manage.py check``, ``check --deploy``); such a
command runs only the message-family check (every Runtime message family has its one consumer), so it
starts without importing the URL map. The web drivers (``demo``, ``journeys``, ``bench``,
``capacity_plan``) start the web server and keep every check.
"""
from __future__ import annotations

from django.core.management.base import BaseCommand

__all__ = ["MESSAGE_FAMILY_CHECK", "OperatorCommand"]

#: The system-check tag of the message-family check (``runtime_outbox`` registers it under this tag).
MESSAGE_FAMILY_CHECK = "runtime_outbox"


class OperatorCommand(BaseCommand):
    """A management command that serves no URL: only the :data:`MESSAGE_FAMILY_CHECK` checks run first."""

    requires_system_checks = [MESSAGE_FAMILY_CHECK]
