"""Worker roles, kept importable here: the registry is :mod:`nexusflow.kernel.workers`.

Each app registers its roles in its ``AppConfig.ready()``
(:func:`nexusflow.kernel.workers.register_role`); ``ROLES`` is the registered
role names, in order.
"""
from __future__ import annotations

from nexusflow.kernel.workers import Unit, roles, units_for

__all__ = ["ROLES", "Unit", "units_for"]


def __getattr__(name: str):
    if name == "ROLES":
        return roles()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
