"""Numeric runtime settings: a Django setting, else the environment variable of the same name, else a default."""
from __future__ import annotations

import os

from django.conf import settings


def setting_number(name: str, default: float) -> float:
    """The number set as ``settings.<name>`` or ``$<name>`` (the setting wins; empty means unset), else ``default``.

    Read on every call, so a changed setting applies at once.

    Raises:
        ValueError: the value set is not a number.
    """
    value = getattr(settings, name, None)
    if value is None:
        value = os.environ.get(name)
    return default if value is None or value == "" else float(value)
