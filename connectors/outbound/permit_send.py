"""Egress step 2, send: lock credential gate -> Permit, win ``granted -> sending`` (``io_may_have_started``),
commit, then make the one provider call; no transaction spans it (seed 003 "Transaction and crash rules").
"""
from __future__ import annotations

import json
import logging

import httpx
from django.db import OperationalError, transaction

from connectors.contracts import outcomes
from connectors.models import (
    DispatchPermit,
    RemoteEffect,
    RemoteEffectAttempt,
)
from connectors.outbound.egress_common import (
    FP_AFTER_SENDING,
    FP_SENDING_BEFORE_COMMIT,
    RETRY_AFTER_STATUSES,
    Grant,
    Response,
    bearer,
    content_type,
    frozen_contract,
)
from connectors.serving.gates import CredentialUnavailable, resolve_frozen_secret
from connectors.store import (
    CredentialDispatchGateStore,
    DispatchPermitStore,
    RemoteEffectAttemptStore,
    RemoteEffectStore,
)
from nexusflow.kernel import failpoints, locks
from nexusflow.kernel.clock import db_now
from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.logs import traceparent_for
from nexusflow.kernel.rows import get_joined, get_row
from nexusflow.kernel.tls import tls_context

log = logging.getLogger(__name__)

def permit_send(grant: Grant, *, client: httpx.Client | None = None) -> Response | None:
    """Win ``granted -> sending`` and make the one provider call.

    Returns:
        The provider response, or ``None`` when this caller lost the one-shot
        transition (another caller sent, or the Permit was closed).
    """
    effect = get_joined(RemoteEffect, ("command",), org_id=grant.org_id, pk=grant.effect_id)
    binding, contract, profile = frozen_contract(effect)
    attempt = get_row(RemoteEffectAttempt, {"org_id": grant.org_id, "pk": grant.attempt_id})
    owned = client is None
    # The whole request is built while the Permit is still provably pre-I/O: anything that cannot
    # be sent (missing or unusable material, an unbuildable request) closes the Permit before
    # ``sending``; after ``sending`` nothing but the provider call itself may fail.
    try:
        headers = {"Content-Type": content_type(contract), "Accept": "application/json"}
        traceparent = traceparent_for(grant.trace_id)
        if traceparent:  # the provider call continues the trace of the work that authored the effect
            headers["traceparent"] = traceparent
        if profile.get("auth", {}).get("kind") == "bearer":
            headers["Authorization"] = bearer(
                resolve_frozen_secret(org_id=grant.org_id, frozen=binding["credential_generation"]))
        header = outcomes.policy(profile).idempotency_header
        if attempt.idempotency_key and header:
            headers[header] = attempt.idempotency_key
        url = binding["base_url"].rstrip("/") + attempt.path
        if owned:
            client = httpx.Client(timeout=outcomes.timeout_seconds(profile), verify=tls_context())
        request = client.build_request(attempt.method, url, content=bytes(attempt.request_body), headers=headers)
    except (CredentialUnavailable, ValueError, TypeError, httpx.HTTPError, httpx.InvalidURL) as exc:
        if owned and client is not None:
            client.close()
        why = exc.code if isinstance(exc, NexusError) else f"request_unbuildable: {type(exc).__name__}: {exc}"
        _self_abandon_pre_io(grant, {"proof": "holder_released_before_sending", "why": why[:200]})
        return None
    try:
        try:
            with transaction.atomic(durable=True):
                permit = get_row(DispatchPermit, {"pk": grant.permit_id, "org_id": grant.org_id})
                credential_gate = CredentialDispatchGateStore.lock_shared(grant.org_id, permit.credential_gate_id)
                if credential_gate.state != "enabled" or credential_gate.fence_token != permit.credential_fence_token:
                    return None
                permit = DispatchPermitStore.lock(grant.org_id, grant.permit_id)
                if permit.state != "granted" or permit.holder_fence != grant.holder_fence:
                    return None
                DispatchPermitStore.transition(org_id=grant.org_id, pk=permit.pk, src="granted", dst="sending",
                                               version=permit.version, fences={"holder_fence": grant.holder_fence},
                                               set_fields={"io_may_have_started_at": db_now()})
                failpoints.hit(FP_SENDING_BEFORE_COMMIT)
        except OperationalError as exc:
            # The ``granted -> sending`` transaction rolled back (a deadlock victim, a lock wait
            # timeout): nothing was sent. The holder closes its own Permit now instead of leaving it
            # ``granted`` until its process ends; the effect is granted afresh.
            proof = {"proof": "holder_released_before_sending",
                     "why": f"sending_transition_failed: {exc.args[0] if exc.args else exc}"}
            for tries_left in (2, 1, 0):
                try:
                    _self_abandon_pre_io(grant, proof)
                    break
                except OperationalError:
                    if not tries_left:
                        raise  # the Permit stays ``granted``; holder-termination recovery closes it
            return None
        failpoints.hit(FP_AFTER_SENDING)
        reply = client.send(request)
        limits = outcomes.rate_limit(profile)
        return Response(reply.status_code, reply.content, "",
                        retry_after=reply.headers.get("Retry-After") if reply.status_code in RETRY_AFTER_STATUSES
                        else None,
                        rate_scope=reply.headers.get(limits.daily_header)
                        if limits.daily_header and reply.status_code in limits.statuses else None)
    except httpx.ConnectError as exc:
        return Response(None, b"", f"connect: {exc}", connect_failed=True)
    except httpx.HTTPError as exc:
        return Response(None, b"", f"{type(exc).__name__}: {exc}"[:255])
    finally:
        if owned:
            client.close()


def _self_abandon_pre_io(grant: Grant, proof: dict) -> None:
    """The holder itself closes its still-``granted`` Permit: it never sent, and never will.

    Legal only for the holder (holder fence) and only from ``granted``:
    the effect returns to ``prepared``, the Attempt records ``no_effect``.
    """
    with transaction.atomic(durable=True):
        effect, permit, attempt = locks.acquire([
            locks.store_resource(RemoteEffectStore, grant.org_id, grant.effect_id),
            locks.store_resource(DispatchPermitStore, grant.org_id, grant.permit_id),
            locks.store_resource(RemoteEffectAttemptStore, grant.org_id, grant.attempt_id),
        ])
        if permit.state != "granted" or permit.holder_fence != grant.holder_fence or effect.state != "dispatching":
            return
        close_pre_io(effect, permit, attempt, proof=proof, error=proof.get("why", "released"))


def close_pre_io(effect: RemoteEffect, permit: DispatchPermit, attempt: RemoteEffectAttempt, *, proof: dict,
                  error: str) -> None:
    """Abandon a locked ``granted`` Permit with ``proof`` of no I/O; effect ``dispatching -> prepared``."""
    DispatchPermitStore.transition(org_id=permit.org_id, pk=permit.pk, src="granted", dst="abandoned",
                                   version=permit.version, set_fields={"closed_evidence": json.dumps(proof)})
    RemoteEffectAttemptStore.transition(org_id=attempt.org_id, pk=attempt.pk, src="started", dst="no_effect",
                                        version=attempt.version, set_fields={"error": error[:255]})
    RemoteEffectStore.transition(org_id=effect.org_id, pk=effect.pk, src="dispatching", dst="prepared",
                                 version=effect.version, set_fields={"reason_code": ""})
