"""The registry of CAS stores, one per state machine (ARCHITECTURE.md section 6, "State changes").

:class:`nexusflow.kernel.store.CasStore` registers each concrete store here
when its class is defined; :func:`nexusflow.kernel.models.insert` reads it to
check a new row's initial state. It sits below both, so the model bases and
the store base do not import each other.
"""
from __future__ import annotations

from .transitions import import_app_modules

#: ``{machine name: store class}`` for every concrete :class:`~nexusflow.kernel.store.CasStore`;
#: one store per machine.
STORES: dict[str, type] = {}


def register_store(store: type) -> None:
    """Record ``store`` (a CasStore subclass with ``model`` and ``machine``) under its machine's name.

    Raises:
        TypeError: another store class already serves that machine.
    """
    name = store.machine.name
    if name in STORES and STORES[name] is not store:
        raise TypeError(f"{name} already has store {STORES[name].__qualname__}")
    STORES[name] = store


def load_all_stores() -> dict[str, type]:
    """Return ``{machine name: store}``, importing each app's ``store`` module first."""
    import_app_modules("store")
    return STORES
