"""Serving gates and epochs (seed 003 "State machines", "Generation and replay").

- generations are authored and read by their owners in
  :mod:`connectors.serving.generations` (:func:`service_configuration_apply` is
  re-exported here);
- :func:`epoch_prepare` / :func:`epoch_verify` (:mod:`connectors.serving.epoch`) build
  and externally verify a ServingEpoch candidate in the V2 preimage order;
- :func:`resolve_secret` reads the exact secret version of a credential generation;
- :func:`gate_transition` moves one AccountServingGate with evidence;
- :func:`serving_lock` is the lock every production V2 write takes first (shared for outbound writes).
"""
from __future__ import annotations

from dataclasses import dataclass

from connectors.models import AccountServingGate, CredentialGeneration, GateTransitionEvidence, ServingEpoch
from connectors.serving import secret_store
from connectors.serving.epoch import EpochVerificationDeferred, EpochVerificationFailed, epoch_prepare, epoch_verify
from connectors.serving.generations import ConfigurationError, service_configuration_apply
from connectors.store import AccountServingGateStore, ServingEpochStore
from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.models import insert
from nexusflow.kernel.rows import first_row

#: Seconds a caller waits before retrying work the account does not admit now (HTTP ``Retry-After``).
RETRY_AFTER_SECONDS = 5


class NotServing(NexusError):
    """The account is not admitting V2 work (gate mode, fence or epoch): retry later (HTTP 503 + Retry-After)."""

    code = "not_serving"
    http_status = 503
    retry_after = RETRY_AFTER_SECONDS


class CredentialUnavailable(NexusError):
    """The exact secret version of a credential generation cannot be read (HTTP 503 + Retry-After)."""

    code = "credential_unavailable"
    http_status = 503
    retry_after = RETRY_AFTER_SECONDS


def resolve_secret(credential: CredentialGeneration) -> bytes:
    """Read the secret bytes of exactly this credential generation's version (never stored, never 'latest').

    Raises:
        CredentialUnavailable: the exact version file is missing, unreadable or empty.
    """
    try:
        return secret_store.secret_read(org_id=credential.org_id, account_key=credential.account_key,
                                        credential_ref=credential.credential_ref,
                                        secret_version=credential.secret_version)
    except secret_store.SecretUnavailable as exc:
        raise CredentialUnavailable(str(exc)) from None


def resolve_frozen_secret(*, org_id: str, frozen: dict) -> bytes:
    """Read the secret of the exact credential generation an epoch or dispatch binding froze.

    Args:
        frozen: ``{"id", "digest", "secret_version"}`` as frozen in the epoch's reader index.

    Raises:
        CredentialUnavailable: the generation is gone, its digest or version
            reference differs from the frozen one, or the exact version file is unreadable.
    """
    credential = first_row(CredentialGeneration, org_id=org_id, pk=frozen["id"])
    if credential is None or credential.digest != frozen.get("digest") \
            or credential.secret_version != frozen.get("secret_version"):
        raise CredentialUnavailable(f"credential generation {frozen['id']} does not match its frozen reference")
    return resolve_secret(credential)


# --- Gates --------------------------------------------------------------------
def gate_transition(*, gate: AccountServingGate, dst: str, evidence: dict,
                    epoch: ServingEpoch | None = None, reason_code: str = "") -> AccountServingGate:
    """Move a locked gate to ``dst``, bump its fence and append the evidence row.

    Must run inside a transaction that locked ``gate``. The gate stores
    ``reason_code`` while it is not serving and clears it when it serves again.

    Args:
        reason_code: registered code of why the account stops serving; required
            when ``dst`` is a non-serving state (``ACCOUNT_SERVING_GATE.reason_required``).

    Raises:
        IllegalTransition: not a listed gate transition.
        ReasonRequired: ``dst`` is a non-serving state and ``reason_code`` is empty.
        FenceRejected: the gate moved since it was locked.
    """
    set_fields = {"fence_token": gate.fence_token + 1, "reason_code": reason_code}
    if epoch is not None:
        set_fields.update({"epoch_id": epoch.pk, "epoch_digest": epoch.digest})
    AccountServingGateStore.transition(org_id=gate.org_id, pk=gate.pk, src=gate.state, dst=dst,
                                       version=gate.version, set_fields=set_fields)
    insert(GateTransitionEvidence, org_id=gate.org_id, gate=gate, from_state=gate.state, to_state=dst,
           fence_token=gate.fence_token + 1, evidence=evidence)
    return AccountServingGate.objects.get(org_id=gate.org_id, pk=gate.pk)


@dataclass(frozen=True)
class ServingContext:
    """A locked gate and its exact active epoch, plus the account's frozen facts."""

    gate: AccountServingGate
    epoch: ServingEpoch

    @property
    def account(self) -> dict:
        for account in self.epoch.document["accounts"]:
            if account["account_key"] == self.gate.account_key:
                return account
        raise NotServing(f"account {self.gate.account_key} is not in epoch {self.epoch.pk}")


def serving_lock(*, org_id: str, account_key: str, shared: bool = False) -> ServingContext:
    """Lock AccountServingGate then its exact ServingEpoch and require V2 serving.

    Seed 003 "State machines": every production V2 admission, claim, outbound
    authoring and Permit acquisition locks the gate and its exact epoch and
    requires ``v2_serving``, an exact gate-to-epoch id and digest match and
    epoch state ``active``.

    The gate is a readers-writer fence (docs/performance.md, "The account
    gate as a readers-writer fence"). With ``shared`` the two rows are read ``LOCK IN SHARE MODE``:
    callers that only need the gate to stay as they saw it until they commit
    (outbound authoring and Permit acquisition, whose mutual order is decided
    by the rows they write) run side by side instead of one after the other.
    Without it they are locked ``FOR UPDATE``, as every gate or epoch
    transition, every operator decision that changes what those callers decide
    on (a link rebind or adoption) and every inbound write (whose races are
    still ordered by the gate) does; so a transition waits until each shared
    holder committed or rolled back, and no shared holder passes while a
    transition waits or runs. A shared holder never locks the gate or epoch
    ``FOR UPDATE`` later in the same transaction.

    Raises:
        NotServing: unknown account, wrong gate mode, or epoch mismatch.
    """
    try:
        gate = (AccountServingGateStore.share_lock_by_account(org_id, account_key) if shared
                else AccountServingGateStore.lock_by_account(org_id, account_key))
    except AccountServingGate.DoesNotExist:
        raise NotServing(f"unknown account {account_key!r}") from None
    if gate.state != "v2_serving" or gate.epoch_id is None:
        raise NotServing(f"account {account_key} gate is {gate.state}")
    epoch = (ServingEpochStore.lock_shared if shared else ServingEpochStore.lock)(org_id, gate.epoch_id)
    if epoch.state != "active" or epoch.digest != gate.epoch_digest:
        raise NotServing(f"account {account_key} epoch {epoch.pk} is {epoch.state}")
    return ServingContext(gate, epoch)


def find_account_org(account_key: str) -> str | None:
    """Return the org owning ``account_key`` (account keys are globally unique ingress paths)."""
    orgs = list(AccountServingGate.objects.filter(account_key=account_key).values_list("org_id", flat=True)[:2])
    if len(orgs) != 1:
        return None
    return orgs[0]


__all__ = [
    "ConfigurationError", "CredentialUnavailable", "EpochVerificationDeferred", "EpochVerificationFailed", "NotServing", "ServingContext",
    "epoch_prepare", "epoch_verify", "find_account_org", "gate_transition", "resolve_frozen_secret", "resolve_secret",
    "service_configuration_apply", "serving_lock",
]
