"""Worker roles, kept importable here: the registry is :mod:`nexusflow.kernel.workers`.

Each app registers its roles in its ``AppConfig.ready()``
(:func:`nexusflow.kernel.workers.register_role`); :func:`roles` gives the
registered role names, in order.
"""
from __future__ import annotations

from nexusflow.kernel.workers import Unit, roles, units_for

__all__ = ["Unit", "roles", "units_for"]

