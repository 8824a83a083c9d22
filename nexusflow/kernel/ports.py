"""Ports: how a lower app asks a question only a higher app can answer (ARCHITECTURE.md section 2).

Imports point one way (kernel < records < runtime_outbox < {flows,
connectors} < cutover < packs). Where a lower app needs an answer from a
higher one, the lower app declares a :class:`Port` at module level with a
``register_<x>(...)`` function over it, and the one app that answers
registers into it in its ``AppConfig.ready()``.

A port has exactly one provider:

- registering a second, different provider raises :class:`PortAlreadyRegistered`
  (registering the same provider again is a no-op, so a repeated ``ready()``
  is harmless);
- asking a port that nobody registered raises :class:`PortNotRegistered`,
  naming the app expected to provide it.

Registries with several providers (the record hooks of
:mod:`nexusflow.records.services`, the worker roles of
:mod:`nexusflow.kernel.workers`) keep their own ordered lists.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class PortNotRegistered(RuntimeError):
    """A port was asked before its provider registered (the app is not installed, or its ``ready()`` did not run)."""


class PortAlreadyRegistered(RuntimeError):
    """A second, different provider tried to register into a single-provider port."""


class Port(Generic[T]):
    """One single-provider slot.

    Args:
        name: what the port answers, for messages (e.g. ``"push-binding freezer"``).
        provider: the app expected to register into it (e.g. ``"connectors"``).
    """

    def __init__(self, name: str, *, provider: str) -> None:
        self.name = name
        self.provider = provider
        self._impl: T | None = None

    def register(self, impl: T) -> None:
        """Install ``impl`` as the port's one provider.

        Raises:
            PortAlreadyRegistered: another provider is registered already.
        """
        current = self._impl
        if current is not None and current is not impl and current != impl:
            raise PortAlreadyRegistered(f"the {self.name} port already has a provider ({current!r}); "
                                        f"only one app may answer it")
        self._impl = impl

    def get(self) -> T:
        """The registered provider.

        Raises:
            PortNotRegistered: nothing is registered.
        """
        if self._impl is None:
            raise PortNotRegistered(f"no {self.name} is registered: the {self.provider} app registers it in its "
                                    f"AppConfig.ready() (is it in INSTALLED_APPS?)")
        return self._impl

    @property
    def registered(self) -> bool:
        return self._impl is not None

    @contextlib.contextmanager
    def replaced(self, impl: T | None) -> Iterator[None]:
        """Tests only: answer with ``impl`` inside the block (``None``: as if nothing were registered)."""
        previous, self._impl = self._impl, impl
        try:
            yield
        finally:
            self._impl = previous

    def __repr__(self) -> str:
        return f"Port({self.name!r}, provider={self.provider!r}, registered={self.registered})"
