"""The producer contracts a Flow wait may depend on (seed 004 section 14.1).

Every ``FlowDependency.producer_kind`` and every ``FlowWakeSignal`` names a
registered :class:`ProducerContract`: who the producer is, how it notifies,
what identifies one wake, what evidence resolves the wait, how the wait
expires and whether an operator may signal it by hand. A dependency on an
unregistered producer is refused before it is written (:func:`producer_contract`),
so no wait can poll a producer that does not exist.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from nexusflow.kernel.errors import NexusError


class UnknownProducer(NexusError):
    """A wait or signal names a producer kind that is not registered (seed 004 sections 10.5 and 14.1)."""

    code = "flow_producer_unknown"


@dataclass(frozen=True)
class ProducerContract:
    """One producer kind's published contract (seed 004 section 14.1)."""

    #: Stable producer identity, stored on dependencies and signals.
    kind: str
    #: How the wait learns of the producer's outcome.
    notification: str
    #: What makes one wake idempotent.
    wake_identity: str
    #: The safe evidence the resolution records.
    resolution_receipt: str
    #: The compiled expiry policy a wait on it carries, and what it means.
    expiry: str
    #: What an operator's hand signal means (``manage.py flows signal``), or ``None`` when refused.
    operator_signal: str | None

    def as_dict(self) -> dict[str, str | None]:
        return asdict(self)


#: ``ProducerKind`` of an EffectCompletion wait: the Runtime's intent result receipt.
PRODUCER_RUNTIME_INTENT = "runtime.intent_result"
#: ``ProducerKind`` of a time wait: the database clock.
PRODUCER_CLOCK = "runtime.clock"
#: ``ProducerKind`` of a Wait element's record event (:func:`change_event_object`).
PRODUCER_RECORD = "record.condition"
#: ``ProducerKind`` of a subflow step: the end of the child FlowRun it started.
PRODUCER_SUBFLOW = "subflow"

PRODUCERS: dict[str, ProducerContract] = {c.kind: c for c in (
    ProducerContract(
        kind=PRODUCER_RUNTIME_INTENT,
        notification="same-transaction FlowWakeSignal written by the effect owner's finalize (intent.completed)",
        wake_identity="one signal per (work scope, run, dependency key = the OutboundCommand id)",
        resolution_receipt="the Runtime IntentResultReceipt id",
        expiry="quarantine: the remote effect may or may not have happened",
        operator_signal=None,
    ),
    ProducerContract(
        kind=PRODUCER_CLOCK,
        notification="the database clock: the flow.resume_due sweep resolves a wait at its deadline",
        wake_identity="the dependency itself (one per waiting step invocation)",
        resolution_receipt="the event that fired, when it was due and when it resolved",
        expiry="fires: the deadline is the wait's time",
        operator_signal="resume now, along the earliest event, as if its time had come",
    ),
    ProducerContract(
        kind=PRODUCER_RECORD,
        notification=("same-transaction FlowWakeSignal written by every save (or deletion) of the run's trigger "
                      "record while the run lives, whether or not the run waits yet"),
        wake_identity=("one signal per (work scope, run, dependency key = object/record key, wake version = the "
                       "record version the save wrote); an older version than the wait's is stale"),
        resolution_receipt="the event, the record version that met the condition and the signal that woke it",
        expiry=("fires along the Wait's earliest AlarmEvent when it has one, else the runtime policy's maximum "
                "wait age; a deleted record takes the fault path, or fails the run"),
        operator_signal="resume now, along the record event, as if the record met its condition",
    ),
    ProducerContract(
        kind=PRODUCER_SUBFLOW,
        notification=("same-transaction FlowWakeSignal written by the transaction that moves the child run into "
                      "a terminal state (FlowRunStore), matched right after it commits"),
        wake_identity="one signal per (work scope, parent run, dependency key = subflow:<child run id>)",
        resolution_receipt="the child run: its terminal state, reason code and final output variables",
        expiry=("terminal_failure after the runtime policy's maximum wait age; cancelling the parent cancels "
                "the child"),
        operator_signal=None,
    ),
)}


#: The ``inputParameters`` name of a record event that says which record it watches.
RECORD_ID_INPUT = "RecordId"
#: The one ``RecordId`` this engine generation watches: the flow's triggering record.
TRIGGER_RECORD_ID = "$Record.Id"


def change_event_object(event_type: object) -> str | None:
    """The object a Wait event's ``eventType`` watches, or ``None`` when it is not a record event.

    A record event uses the Change Data Capture name of its object:
    ``<Object>ChangeEvent`` for a standard object, ``<Name>__ChangeEvent`` for
    the custom object ``<Name>__c`` (docs/operations.md "Waiting for a
    record"). Pure; no metadata lookup.
    """
    if not isinstance(event_type, str) or not event_type.endswith("ChangeEvent"):
        return None
    stem = event_type[: -len("ChangeEvent")]
    if stem.endswith("__"):
        stem = f"{stem}c"
    return stem or None


def producer_contract(kind: str) -> ProducerContract:
    """The registered contract of ``kind``.

    Raises:
        UnknownProducer: ``kind`` is not registered.
    """
    try:
        return PRODUCERS[kind]
    except KeyError:
        raise UnknownProducer(f"producer {kind!r} is not registered; one of: {', '.join(sorted(PRODUCERS))}") \
            from None
