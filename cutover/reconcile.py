"""``cutover reconcile``: resolve interrupted V1 provider calls with exact evidence, never by dispatching.

Seed 003 "Offline V1 shutdown, cold rollback, and V2 cutover", steps 3-4;
proofs S003-RP-41 and S003-RP-42. A V1 call whose pre-I/O row has no final
outcome is resolved only by evidence the operator established with the
provider (one answer per call, on the command line or in a JSON file):

| call state | ``remote_finalized`` | ``no_effect`` |
| --- | --- | --- |
| ``prepared`` (no marker: nothing sent) | refused: no I/O can have happened | ``abandoned`` |
| ``sending`` (marker committed, no answer) | ``confirmed`` | ``refused`` (``v1_not_performed``) |
| ``ambiguous`` (I/O without a proven answer) | ``confirmed`` | ``refused`` (``v1_not_performed``) |

A ``prepared`` or ``sending`` row may still be moved by a live V1 process, so
those are reconciled only once every gate is ``v1_stopped`` (the generations
are proven gone and denied egress); a parked ``ambiguous`` row may also be
reconciled in ``halting_v1``. Each answer commits in one transaction that
locks every gate of the org first, requires that state, then locks the call,
terminalizes it through its CAS store and appends one ``v1_reconciliation``
evidence row. ``cutover certify`` locks the same gate rows, so a
reconciliation either commits before the certificate's inventory or finds the
gates ``v1_drained`` and writes nothing (S003-RP-42). Nothing is sent.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from django.db import transaction

from connectors.models import V1ProviderCall
from connectors.reasons import V1_NOT_PERFORMED
from connectors.store import AccountServingGateStore
from connectors.v1.store import V1ProviderCallStore
from nexusflow.kernel import canonical_json
from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.identity import validate_key
from nexusflow.kernel.scope import OrgScope

from .models import CutoverEvidence
from .services import CutoverRefused, _evidence
from .v1_shutdown import attempt_certificate

OUTCOMES = ("remote_finalized", "no_effect")
#: (call state, outcome) -> the call's terminal state and reason code.
_TERMINAL = {
    ("prepared", "no_effect"): ("abandoned", ""),
    ("sending", "remote_finalized"): ("confirmed", ""),
    ("sending", "no_effect"): ("refused", V1_NOT_PERFORMED),
    ("ambiguous", "remote_finalized"): ("confirmed", ""),
    ("ambiguous", "no_effect"): ("refused", V1_NOT_PERFORMED),
}


class ReconciliationInvalid(NexusError):
    """An answer is malformed or contradicts the call (exit 2)."""

    code = "reconciliation_invalid"
    http_status = 400


class ReconciliationConflict(NexusError):
    """The call was already reconciled with another answer, or settled without one (exit 3)."""

    code = "reconciliation_conflict"


@dataclass
class ReconcileReport:
    """``reconciled``: ``[{"call_id", "from_state", "to_state", "outcome", "evidence_digest"}]``; ``already``: call
    ids whose identical answer was recorded before."""

    attempt_key: str
    reconciled: list[dict] = field(default_factory=list)
    already: list[int] = field(default_factory=list)


def validate_answers(answers) -> list[dict]:
    """Check operator answers ``[{"call_id": int, "outcome": OUTCOMES, "evidence": str, "remote_id"?: str}]``.

    ``evidence`` says how the answer was established with the provider (a lookup reference, a ticket);
    ``remote_id`` (``remote_finalized`` only) is the provider's id of the finalized object.

    Raises:
        ReconciliationInvalid: not that shape, an empty evidence text, or a call answered twice.
    """
    if not isinstance(answers, list) or not answers:
        raise ReconciliationInvalid('answers must be a non-empty list of {"call_id", "outcome", "evidence"}')
    out, seen = [], set()
    for index, answer in enumerate(answers):
        if not isinstance(answer, dict) or not set(answer) <= {"call_id", "outcome", "evidence", "remote_id"}:
            raise ReconciliationInvalid(f"answers[{index}] needs call_id, outcome, evidence (and remote_id)")
        call_id, outcome, evidence = answer.get("call_id"), answer.get("outcome"), answer.get("evidence")
        if not isinstance(call_id, int) or isinstance(call_id, bool) or call_id <= 0:
            raise ReconciliationInvalid(f"answers[{index}].call_id must be a positive integer")
        if outcome not in OUTCOMES:
            raise ReconciliationInvalid(f"answers[{index}].outcome must be one of {', '.join(OUTCOMES)}")
        if not isinstance(evidence, str) or not evidence.strip() or len(evidence) > 1000:
            raise ReconciliationInvalid(f"answers[{index}].evidence must say how the answer was established")
        remote_id = answer.get("remote_id", "")
        if remote_id and outcome != "remote_finalized":
            raise ReconciliationInvalid(f"answers[{index}].remote_id belongs to a remote_finalized answer")
        if remote_id:
            remote_id = validate_key(remote_id, field="remote_id", max_length=160)
        if call_id in seen:
            raise ReconciliationInvalid(f"call {call_id} is answered twice")
        seen.add(call_id)
        out.append({"call_id": call_id, "outcome": outcome, "evidence": evidence, "remote_id": remote_id})
    return out


def _reconcile_one(org: OrgScope, attempt_key: str, answer: dict) -> dict | None:
    """One answer in one transaction: gates, then the call; returns the record, or ``None`` when already done."""
    subject = f"call:{answer['call_id']}"
    with transaction.atomic(durable=True):
        gates = AccountServingGateStore.lock_all(org.org_id)
        states = {g.state for g in gates}
        if not gates or not states <= {"halting_v1", "v1_stopped"}:
            raise CutoverRefused(f"reconciliation needs every gate halting_v1 or v1_stopped; gates are "
                                 f"{', '.join(sorted(states)) or 'none'} (after v1_drained no V1 row changes)")
        prior = CutoverEvidence.objects.filter(org_id=org.org_id, attempt_key=attempt_key, kind="v1_reconciliation",
                                               account_key=subject).first()
        if prior is not None:
            if {k: prior.payload["answer"][k] for k in answer} != answer:
                raise ReconciliationConflict(f"call {answer['call_id']} was reconciled with another answer "
                                             f"(evidence {prior.digest[:16]})")
            return None
        try:
            call = V1ProviderCallStore.lock(org.org_id, answer["call_id"])
        except V1ProviderCall.DoesNotExist:
            raise ReconciliationInvalid(f"org {org.org_id} has no V1 provider call {answer['call_id']}") from None
        if call.state not in ("prepared", "sending", "ambiguous"):
            raise ReconciliationConflict(f"call {call.pk} is {call.state}: it has its outcome and needs no "
                                         "reconciliation")
        if call.state != "ambiguous" and states != {"v1_stopped"}:
            raise CutoverRefused(f"call {call.pk} is {call.state} and a V1 process may still move it; reconcile it "
                                 "after cutover stop (every gate v1_stopped)")
        target = _TERMINAL.get((call.state, answer["outcome"]))
        if target is None:
            raise ReconciliationInvalid(f"call {call.pk} is prepared: its pre-I/O marker never committed, so no "
                                        "request left V1 and it cannot be remote_finalized")
        dst, reason = target
        fields = {"reason_code": reason}
        if answer["remote_id"]:
            fields["remote_id"] = answer["remote_id"]
        V1ProviderCallStore.transition(org_id=org.org_id, pk=call.pk, src=call.state, dst=dst, version=call.version,
                                       set_fields=fields)
        proof = _evidence(org, attempt_key, "v1_reconciliation", subject, {
            "answer": answer, "call_site": call.call_site, "from_state": call.state, "to_state": dst,
            "reason_code": reason, "request_digest": call.request_digest,
            "io_may_have_started_at": None if call.io_may_have_started_at is None
            else call.io_may_have_started_at.isoformat(),
            "gate_states": sorted(states)})
    return {"call_id": answer["call_id"], "from_state": call.state, "to_state": dst, "outcome": answer["outcome"],
            "evidence_digest": proof["digest"]}


def cutover_reconcile(*, org: OrgScope, attempt_key: str, answers: list[dict]) -> ReconcileReport:
    """Terminalize interrupted V1 provider calls of ``org`` from operator-established evidence.

    Args:
        attempt_key: the cutover attempt the evidence belongs to.
        answers: see :func:`validate_answers`; each commits on its own, in the given order.

    Returns:
        :class:`ReconcileReport`.

    Raises:
        InvalidIdentity / CertificateMissing: see :func:`cutover.v1_shutdown.attempt_certificate`.
        ReconciliationInvalid: a malformed answer, an unknown call, ``remote_finalized`` for a ``prepared`` call.
        ReconciliationConflict: another answer was recorded, or the call already has its outcome.
        CutoverRefused: the gates are not ``halting_v1``/``v1_stopped`` (notably after ``v1_drained``), or a
            ``prepared``/``sending`` call while V1 may still run.

    Seed 003 "Offline V1 shutdown, cold rollback, and V2 cutover" (steps 3-4); proofs S003-RP-41, S003-RP-42.
    """
    attempt_key, _ = attempt_certificate(org, attempt_key)
    report = ReconcileReport(attempt_key)
    for answer in validate_answers(answers):
        canonical_json.dumps(answer)  # stored as evidence: strict JSON only
        done = _reconcile_one(org, attempt_key, answer)
        if done is None:
            report.already.append(answer["call_id"])
        else:
            report.reconciled.append(done)
    return report
