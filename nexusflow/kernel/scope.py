"""Trusted scope objects (ARCHITECTURE.md section 6, "Trusted scope").

Scope is built by authentication or by a worker from a row it loaded, never
from a request payload. Repository methods take a scope plus an id, never an
id alone.
"""
from __future__ import annotations

from dataclasses import dataclass

from .identity import validate_key


@dataclass(frozen=True, slots=True)
class OrgScope:
    """The tenant a durable row belongs to.

    ``org_id`` is a canonical key (see :func:`validate_key`).
    """

    org_id: str

    def __post_init__(self) -> None:
        validate_key(self.org_id, field="org_id", max_length=64)


@dataclass(frozen=True, slots=True)
class TrustedRuntimeWorkScope:
    """Full Runtime work scope carried by messages and wake signals.

    Seed 004 section 10.0: org, app installation, runtime capability and the
    digest of the complete RuntimeWorkBinding.
    """

    org_id: str
    app_installation_id: str
    runtime_capability_id: str
    binding_digest: str

    def __post_init__(self) -> None:
        validate_key(self.org_id, field="org_id", max_length=64)
        validate_key(self.app_installation_id, field="app_installation_id", max_length=128)
        validate_key(self.runtime_capability_id, field="runtime_capability_id", max_length=128)
        validate_key(self.binding_digest, field="binding_digest", max_length=128)

    @property
    def org(self) -> OrgScope:
        return OrgScope(self.org_id)
