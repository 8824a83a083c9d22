"""The V1 runtime's one provider-I/O call site, behind a durable pre-I/O row (seed 003 "V1 concepts to retire").

Every V1 provider call (a push PATCH, a stream fetch) is one
:class:`~connectors.v1.models.V1ProviderCall`: the caller commits it ``prepared``
with the full request (:func:`v1_call_prepare`); :func:`v1_call_send` commits
``prepared -> sending`` with ``io_may_have_started_at`` (the pre-I/O marker)
*before* the HTTP call, then makes the call outside any transaction and settles
the row. A process killed between the marker and the answer leaves the row
``sending``: an interrupted V1 call the cutover reconciles before certification
(seed 003 "Offline V1 shutdown, cold rollback, and V2 cutover").

Once ``cutover stop`` denied the org's V1 egress (:class:`~connectors.v1.models.V1EgressDenial`),
a process of a denied generation (or one that started no generation) can neither commit a
new pre-I/O row nor cross the marker of a ``prepared`` one: the row is ``abandoned`` (provably
nothing sent) and :class:`V1EgressDenied` is raised before any I/O.

The egress manifest (:mod:`connectors.v1.egress_manifest`) is generated from this
code: each function that calls the HTTP client declares itself with
:func:`provider_io` (its effect row and its pre-I/O marker), and each
``v1_call_prepare(call_site=...)`` names its manifest entry.
"""
from __future__ import annotations

from dataclasses import dataclass

import httpx
from django.db import transaction

from connectors.contracts import outcomes
from connectors.reasons import DEFINITE_REFUSAL, RESPONSE_AMBIGUOUS, UNCLASSIFIED_RESPONSE, V1_NOT_PERFORMED
from connectors.v1.generations import current_generation_id
from connectors.v1.models import V1ProviderCall
from connectors.v1.store import V1ProviderCallStore, v1_egress_denied
from nexusflow.kernel import failpoints
from nexusflow.kernel.clock import db_now
from nexusflow.kernel.digests import digest_v2
from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.tls import tls_context

#: The V1 call crossed the pre-I/O marker (``sending`` committed) and is about to call the provider.
FP_AFTER_SENDING = failpoints.declare("v1.call.after_sending")

#: Provider outcome class -> (V1ProviderCall state, reason code).
_SETTLE = {
    outcomes.CONFIRMED: ("confirmed", ""),
    outcomes.REFUSED: ("refused", DEFINITE_REFUSAL),
    outcomes.NOT_PERFORMED: ("refused", V1_NOT_PERFORMED),
    outcomes.AMBIGUOUS: ("ambiguous", RESPONSE_AMBIGUOUS),
    outcomes.UNCLASSIFIED: ("ambiguous", UNCLASSIFIED_RESPONSE),
}


def provider_io(*, effect: str, marker: str):
    """Declare the decorated function a V1 provider-I/O call site (read statically by the egress manifest).

    Args:
        effect: the effect row model, ``"app_label.Model"``.
        marker: the column whose committed value is the pre-I/O marker.
    """
    def mark(fn):
        fn.provider_io = {"effect": effect, "marker": marker}
        return fn
    return mark


class V1EgressDenied(NexusError):
    """This process's V1 generation lost its provider egress for the org (``cutover stop``): nothing was sent."""

    code = "v1_egress_denied"
    http_status = 503
    definite = True


def _require_egress(org_id: str) -> None:
    """Refuse, inside the caller's transaction, a process whose V1 generation is denied egress for ``org_id``."""
    denial = v1_egress_denied(org_id, current_generation_id())
    if denial is not None:
        raise V1EgressDenied(f"V1 provider egress of {org_id} was denied by cutover attempt {denial.attempt_key} "
                             f"(generations up to {denial.through_generation})")


@dataclass(frozen=True)
class V1CallResult:
    """The settled call: ``state`` (confirmed | refused | ambiguous), the HTTP status and body when one arrived."""

    call_id: V1ProviderCall.Id
    state: str
    status: int | None
    body: bytes


def v1_call_prepare(*, org_id: str, account_key: str, call_site: str, kind: str, subject: str, method: str,
                    url: str, body: bytes, root_barrier: str = "") -> V1ProviderCall:
    """Commit the durable pre-I/O row of one provider call in state ``prepared`` and return it.

    Args:
        call_site: the egress manifest entry (e.g. ``"v1.push.update"``); a string literal at every caller.
        kind: ``push`` or ``poll``; subject: the record key (push) or route key (poll).
        method / url / body: the complete request, frozen before any I/O.
        root_barrier: the maintenance barrier a new root request must pass (``"root_outbound"``), checked
            in the row's own transaction; empty for calls of work V1 already accepted.

    Raises:
        RuntimeError: called inside a transaction (the row must be durable on its own).
        InvalidIdentity: a non-canonical key (before SQL).
        V1MaintenanceClosed: ``root_barrier`` is closed (no row written, nothing sent).
        V1EgressDenied: this process's generation is denied egress for the org (no row written).
    """
    if transaction.get_connection().in_atomic_block:
        raise RuntimeError("a V1 provider call row commits on its own, before any I/O")
    digest = digest_v2("connectors.v1.request", [("method", method), ("url", url), ("body", body)]).hexdigest
    with transaction.atomic(durable=True):
        if root_barrier:
            from connectors.v1.barriers import v1_barrier_admit

            v1_barrier_admit(org_id=org_id, kind=root_barrier)
        _require_egress(org_id)
        return V1ProviderCallStore.create(org_id=org_id, account_key=account_key, call_site=call_site, kind=kind,
                                          subject=subject[:160], method=method, url=url[:500], request_body=body,
                                          request_digest=digest, state="prepared")


def _mark_sending(call: V1ProviderCall) -> int:
    """Commit ``prepared -> sending`` with ``io_may_have_started_at``: the pre-I/O marker. Returns the new version.

    Raises:
        V1EgressDenied: the generation is denied egress; the row was committed ``abandoned`` instead.
    """
    denied = None
    with transaction.atomic(durable=True):
        try:
            _require_egress(call.org_id)
        except V1EgressDenied as exc:
            denied = exc
            V1ProviderCallStore.transition(org_id=call.org_id, pk=call.pk, src="prepared", dst="abandoned",
                                           version=call.version, set_fields={"error": str(exc)[:255]})
        else:
            return V1ProviderCallStore.transition(org_id=call.org_id, pk=call.pk, src="prepared", dst="sending",
                                                  version=call.version,
                                                  set_fields={"io_may_have_started_at": db_now()})
    raise denied


def _settle(call: V1ProviderCall, version: int, *, state: str, reason: str, status: int | None, body: bytes,
            error: str) -> None:
    with transaction.atomic(durable=True):
        V1ProviderCallStore.transition(
            org_id=call.org_id, pk=call.pk, src="sending", dst=state, version=version,
            set_fields={"reason_code": reason, "response_status": status, "response_body": body,
                        "error": error[:255]})


@provider_io(effect="connectors.V1ProviderCall", marker="io_may_have_started_at")
def v1_call_send(call: V1ProviderCall, *, headers: dict[str, str], profile: dict,
                 client: httpx.Client | None = None) -> V1CallResult:
    """Cross the pre-I/O marker, make the one provider call, and settle the row.

    Args:
        call: the ``prepared`` row from :func:`v1_call_prepare`.
        headers: request headers (credentials included; never stored).
        profile: the callout profile whose ``outcomes`` classify the answer (closed L0 classes).
        client: an httpx client to reuse (tests); a short-lived one otherwise.

    Returns:
        :class:`V1CallResult`.

    Raises:
        RuntimeError: called inside a transaction.
        FenceRejected / StaleVersion: the row is no longer ``prepared`` at this version (nothing was sent).
        V1EgressDenied: the generation is denied egress; the row is ``abandoned`` and nothing was sent.
    """
    if transaction.get_connection().in_atomic_block:
        raise RuntimeError("a V1 provider call never runs inside a transaction")
    version = _mark_sending(call)
    failpoints.hit(FP_AFTER_SENDING)
    owned = client is None
    client = client or httpx.Client(timeout=outcomes.timeout_seconds(profile), verify=tls_context())
    status, body, error, connect_failed = None, b"", "", False
    try:
        reply = client.request(call.method, call.url, content=bytes(call.request_body) or None, headers=headers)
        status, body = reply.status_code, reply.content
    except httpx.ConnectError as exc:
        error, connect_failed = f"connect: {exc}", True
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}"
    finally:
        if owned:
            client.close()
    state, reason = _SETTLE[outcomes.classify(profile, status=status, connect_failed=connect_failed)]
    _settle(call, version, state=state, reason=reason, status=status, body=body, error=error)
    return V1CallResult(call.pk, state, status, body)
