"""The Flow Runtime work binding and its scope constants (seed 004 sections 7.1 and 10.0).

A compiled plan, its catalog generation and every durable run row are bound
to one complete ``RuntimeWorkBinding``: the trusted org, the app installation,
the runtime capability, the engine generation and the exact
``RuntimeMetadataView`` digest. Its digest is the fourth component of the
``TrustedRuntimeWorkScope`` carried by wake signals and Runtime messages.

The installation and capability identities of the in-process Flow Runtime
live here and nowhere else.
"""
from __future__ import annotations

from dataclasses import dataclass

from nexusflow.kernel.digests import digest_v2
from nexusflow.kernel.identity import validate_key
from nexusflow.kernel.scope import TrustedRuntimeWorkScope

# The one place the Flow Runtime's trusted installation/capability live.
FLOW_APP_INSTALLATION_ID = "core"
FLOW_RUNTIME_CAPABILITY_ID = "flow-runtime"
# Engine generation: bump when the executor's step semantics change.
FLOW_ENGINE_GENERATION = "flows.engine.v1"

BINDING_DOMAIN = "flows.runtime-work-binding"


@dataclass(frozen=True, slots=True)
class RuntimeWorkBinding:
    """The complete binding a plan is compiled against (seed 004 section 7.4)."""

    org_id: str
    app_installation_id: str
    runtime_capability_id: str
    engine_generation: str
    metadata_view_digest: str

    def __post_init__(self) -> None:
        validate_key(self.org_id, field="org_id", max_length=64)
        validate_key(self.app_installation_id, field="app_installation_id", max_length=128)
        validate_key(self.runtime_capability_id, field="runtime_capability_id", max_length=128)
        validate_key(self.engine_generation, field="engine_generation", max_length=64)
        validate_key(self.metadata_view_digest, field="metadata_view_digest", max_length=64)

    @property
    def digest(self) -> str:
        return digest_v2(BINDING_DOMAIN, [
            ("org_id", self.org_id),
            ("app_installation_id", self.app_installation_id),
            ("runtime_capability_id", self.runtime_capability_id),
            ("engine_generation", self.engine_generation),
            ("metadata_view_digest", self.metadata_view_digest),
        ]).hexdigest

    @property
    def scope(self) -> TrustedRuntimeWorkScope:
        return TrustedRuntimeWorkScope(
            org_id=self.org_id,
            app_installation_id=self.app_installation_id,
            runtime_capability_id=self.runtime_capability_id,
            binding_digest=self.digest,
        )

    def as_dict(self) -> dict[str, str]:
        return {
            "org_id": self.org_id,
            "app_installation_id": self.app_installation_id,
            "runtime_capability_id": self.runtime_capability_id,
            "engine_generation": self.engine_generation,
            "metadata_view_digest": self.metadata_view_digest,
        }


def flow_runtime_binding(*, org_id: str, metadata_view_digest: str) -> RuntimeWorkBinding:
    """Return the Flow Runtime binding of ``org_id`` over one metadata view.

    Raises:
        InvalidIdentity: ``org_id`` or the view digest is not a canonical key.
    """
    return RuntimeWorkBinding(
        org_id=org_id,
        app_installation_id=FLOW_APP_INSTALLATION_ID,
        runtime_capability_id=FLOW_RUNTIME_CAPABILITY_ID,
        engine_generation=FLOW_ENGINE_GENERATION,
        metadata_view_digest=metadata_view_digest,
    )


def scope_of(row) -> TrustedRuntimeWorkScope:
    """Rebuild the persisted ``TrustedRuntimeWorkScope`` of a run-scoped row."""
    return TrustedRuntimeWorkScope(
        org_id=row.org_id,
        app_installation_id=row.app_installation_id,
        runtime_capability_id=row.runtime_capability_id,
        binding_digest=row.binding_digest,
    )
