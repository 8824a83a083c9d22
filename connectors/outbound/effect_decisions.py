"""Operator work on RemoteEffects: reconciliation and quarantine (seed 003 "State machines",
"Transaction and crash rules"; ARCHITECTURE.md section 4).

Reconciliation appends a :class:`RemoteEffectEvidence` row and then moves the
effect along an allowed transition; it never rewrites an Attempt, earlier
evidence or an ``uncertain`` Attempt's outcome:

- ``uncertain -> remote_confirmed``: the operator proved the remote identity
  (a create gets its RemoteLink now; a confirmed update advances its link's
  last pushed version, as a provider-confirmed one does; local finalization
  follows without a provider call);
- ``uncertain -> no_effect``: the operator proved the provider performed
  nothing (terminal; a successor EffectGeneration may follow by a separate
  business intent). Runtime's result is ``quarantined``, not ``no_effect``:
  the Attempt was ambiguous, so it is no definite pre-dispatch refusal
  (seed 000 "A validated NO_EFFECT resource result");
- ``uncertain -> prepared``: proved no effect and the frozen policy still
  permits another Attempt (``retry=True``);
- ``prepared | uncertain -> quarantined``: parked for good by an operator.

An effect in ``dispatching`` has an open DispatchPermit: it is settled by its
holder or abandoned with holder-termination proof, never by an operator.
"""
from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction

from connectors import reasons
from connectors.contracts import outcomes
from connectors.models import RemoteEffect, RemoteLink
from connectors.store import RemoteEffectStore, RemoteLinkStore
from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.rows import first_row


class EffectOperationRefused(NexusError):
    code = "effect_operation_refused"


@dataclass(frozen=True)
class EffectChange:
    effect_id: int
    from_state: str
    to_state: str
    evidence_id: int


def _locked(org_id: str, effect_id: int) -> RemoteEffect:
    if not RemoteEffect.objects.filter(org_id=org_id, pk=effect_id).exists():
        raise EffectOperationRefused(f"no remote effect {effect_id} in org {org_id}", code="effect_unknown")
    return RemoteEffectStore.lock(org_id, effect_id)


def effect_reconcile(*, org_id: str, effect_id: int, outcome: str, actor: str, note: str,
                     remote_id: str | None = None, retry: bool = False) -> EffectChange:
    """Resolve one ``uncertain`` effect with operator evidence.

    Args:
        outcome: ``confirmed`` (with ``remote_id``) or ``no_effect``.
        remote_id: the provider's id of the object the uncertain call created
            or updated (byte-exact; required for ``confirmed``).
        retry: with ``no_effect``: return to ``prepared`` for another Attempt
            instead of terminal ``no_effect`` (only while the frozen retry
            policy has Attempts left).
        actor / note: who proved it and how; both required.

    Returns:
        The :class:`EffectChange`.

    Raises:
        EffectOperationRefused: unknown effect (``effect_unknown``), not
            ``uncertain`` (``effect_not_uncertain``), missing actor/note/remote
            id (``reconcile_evidence_missing``), a remote id another link holds
            (``remote_id_conflict``), or retry attempts exhausted
            (``retry_not_permitted``).
    """
    from connectors.outbound.egress_common import EgressRefused, append_evidence, frozen_contract
    from connectors.outbound.permit_settle import link_create
    from runtime_outbox.services import intent_result_record

    if outcome not in ("confirmed", "no_effect"):
        raise EffectOperationRefused(f"outcome must be confirmed or no_effect, not {outcome!r}",
                                     code="reconcile_outcome_invalid")
    if not actor.strip() or not note.strip() or (outcome == "confirmed" and not remote_id):
        raise EffectOperationRefused("reconciliation needs --actor, --note and, for confirmed, the remote id",
                                     code="reconcile_evidence_missing")
    if remote_id is not None and (remote_id != remote_id.strip() or "\x00" in remote_id):
        raise EffectOperationRefused("a remote id is byte-exact: no surrounding whitespace or NUL",
                                     code="reconcile_evidence_missing")
    with transaction.atomic(durable=True):
        effect = _locked(org_id, effect_id)
        if effect.state != "uncertain":
            raise EffectOperationRefused(f"effect {effect_id} is {effect.state}; only an uncertain effect is "
                                         "reconciled", code="effect_not_uncertain")
        effect = RemoteEffect.objects.select_related("command").get(org_id=org_id, pk=effect_id)
        _binding, contract, profile = frozen_contract(effect)
        detail = {"outcome": outcome, "note": note.strip(), "remote_id": remote_id or "", "retry": retry,
                  "attempt_count": effect.attempt_count}
        if outcome == "confirmed":
            last = effect.attempts.order_by("-attempt_number").first()
            if last is not None and last.operation == "create":
                try:
                    link_create(effect, contract, remote_id)
                except EgressRefused as exc:
                    raise EffectOperationRefused(str(exc), code="remote_id_conflict") from None
            else:
                link = first_row(RemoteLink, org_id=org_id, link_key=effect.link_key)
                if link is None or link.remote_id != remote_id:
                    raise EffectOperationRefused(f"the link of this slot names {link.remote_id if link else None!r}, "
                                                 f"not {remote_id!r}", code="remote_id_conflict")
                # As for a PATCH the provider confirmed: this version reached the remote, so an
                # older one delivered later is superseded, never sent (seed 002 "Before PATCH").
                link = RemoteLinkStore.lock(org_id, link.pk)
                if effect.lane_sequence > link.last_pushed_version:
                    RemoteLinkStore.touch(org_id=org_id, pk=link.pk, state=link.state, version=link.version,
                                          set_fields={"last_pushed_version": effect.lane_sequence})
            evidence = append_evidence(effect, kind="operator_confirmed", actor=actor, to_state="remote_confirmed",
                                       detail=detail)
            RemoteEffectStore.transition(org_id=org_id, pk=effect.pk, src="uncertain", dst="remote_confirmed",
                                         version=effect.version, set_fields={"reason_code": "", "remote_id": remote_id})
            return EffectChange(effect_id, "uncertain", "remote_confirmed", int(evidence.pk))
        if retry:
            if effect.attempt_count >= outcomes.policy(profile).max_attempts:
                raise EffectOperationRefused(f"effect {effect_id} used {effect.attempt_count} of "
                                             f"{outcomes.policy(profile).max_attempts} Attempts",
                                             code="retry_not_permitted")
            evidence = append_evidence(effect, kind="operator_no_effect", actor=actor, to_state="prepared",
                                       detail=detail)
            RemoteEffectStore.transition(org_id=org_id, pk=effect.pk, src="uncertain", dst="prepared",
                                         version=effect.version, set_fields={"reason_code": "", "next_attempt_at": None})
            return EffectChange(effect_id, "uncertain", "prepared", int(evidence.pk))
        evidence = append_evidence(effect, kind="operator_no_effect", actor=actor, to_state="no_effect", detail=detail)
        RemoteEffectStore.transition(org_id=org_id, pk=effect.pk, src="uncertain", dst="no_effect",
                                     version=effect.version, set_fields={"reason_code": reasons.OPERATOR_PROVED_NO_EFFECT})
        # The effect is terminal ``no_effect`` for Connector (a successor may follow by operator intent), but an
        # operator's proof after an ambiguous Attempt is not a definite pre-dispatch refusal: Runtime's result
        # is ``quarantined`` (seed 000: ambiguous delivery cannot produce a NO_EFFECT receipt).
        intent_result_record(command=effect.command, outcome="quarantined", remote_id="",
                             evidence={"reason": reasons.OPERATOR_PROVED_NO_EFFECT, "evidence_id": int(evidence.pk)})
        return EffectChange(effect_id, "uncertain", "no_effect", int(evidence.pk))


def effect_quarantine(*, org_id: str, effect_id: int, actor: str, note: str) -> EffectChange:
    """Park a ``prepared`` or ``uncertain`` effect for good (terminal ``quarantined``).

    Raises:
        EffectOperationRefused: unknown effect, missing actor/note, or a state
            other than ``prepared``/``uncertain`` (``effect_not_quarantinable``;
            a ``dispatching`` effect has an open Permit).
    """
    from connectors.outbound.egress_common import append_evidence
    from runtime_outbox.services import intent_result_record

    if not actor.strip() or not note.strip():
        raise EffectOperationRefused("quarantine needs --actor and --note", code="reconcile_evidence_missing")
    with transaction.atomic(durable=True):
        effect = _locked(org_id, effect_id)
        if effect.state not in ("prepared", "uncertain"):
            raise EffectOperationRefused(f"effect {effect_id} is {effect.state}; only prepared or uncertain effects "
                                         "are quarantined", code="effect_not_quarantinable")
        src = effect.state
        evidence = append_evidence(effect, kind="operator_quarantine", actor=actor, to_state="quarantined",
                                   detail={"note": note.strip(), "previous_reason": effect.reason_code})
        RemoteEffectStore.transition(org_id=org_id, pk=effect.pk, src=src, dst="quarantined", version=effect.version,
                                     set_fields={"reason_code": reasons.OPERATOR_QUARANTINE})
        command = RemoteEffect.objects.select_related("command").get(org_id=org_id, pk=effect_id).command
        intent_result_record(command=command, outcome="quarantined", remote_id="",
                             evidence={"reason": reasons.OPERATOR_QUARANTINE, "evidence_id": int(evidence.pk)})
        return EffectChange(effect_id, src, "quarantined", int(evidence.pk))
