"""Flow documents the capacity bench cases run (Salesforce Flow metadata, built from ``tests.flows.flowxml``).

Every flow here runs on the demo metadata view's ``Contact`` object or is
autolaunched; none of its record writes re-triggers it, so one save or one
start is exactly one run.
"""
from __future__ import annotations

from tests.flows import flowxml as fx

OBJECT = "Contact"
STAGE = "lifecyclestage"
CUSTOMER = "customer"
PROMOTED = "promoted"

_CUSTOMER_FILTER = (f"<filterLogic>and</filterLogic><filters><field>{STAGE}</field><operator>EqualTo</operator>"
                    f"<value><stringValue>{CUSTOMER}</stringValue></value></filters>")


def before_save_stamp(value: str = "Stamped") -> bytes:
    """Embedded Before-Save on a customer Contact: assign its lastname in the caller's transaction."""
    stamp = fx.assignment("Stamp", None, [("$Record.lastname", "Assign", f"<stringValue>{value}</stringValue>")])
    return fx.flow(stamp, start=fx.start("Stamp", trigger="RecordBeforeSave", obj=OBJECT, filters=_CUSTOMER_FILTER))


def atomic_promote() -> bytes:
    """After-save Bounded Atomic on a customer Contact: one mutation step moving it to ``promoted`` (the
    re-save no longer matches the trigger, so it admits no further run)."""
    update = ("<recordUpdates><name>Promote</name><label>Promote</label>"
              "<locationX>1</locationX><locationY>2</locationY>"
              f"<inputAssignments><field>{STAGE}</field><value><stringValue>{PROMOTED}</stringValue></value>"
              "</inputAssignments><inputReference>$Record</inputReference></recordUpdates>")
    return fx.flow(update, start=fx.start("Promote", trigger="RecordAfterSave", obj=OBJECT, filters=_CUSTOMER_FILTER))


def durable_chain(steps: int) -> bytes:
    """Autolaunched Durable Orchestration: ``steps`` assignments in a row, each adding 1 to ``counter``
    (one durable step and one checkpoint per assignment, then the Terminal step)."""
    names = [f"Add_{i:03d}" for i in range(1, steps + 1)]
    elements = [fx.assignment(name, names[i + 1] if i + 1 < steps else None,
                              [("counter", "Add", "<numberValue>1</numberValue>")]) for i, name in enumerate(names)]
    return fx.flow(fx.variable("counter", data_type="Number", is_input=True), *elements,
                   start=fx.start(names[0]), profile="DurableOrchestration")


def wait_days(days: int) -> bytes:
    """Autolaunched Durable Orchestration: a Wait element for ``days`` days after the interview's current time
    (one ``runtime.clock`` dependency), then one assignment."""
    wait = ("<waits><name>Pause</name><label>Pause</label><locationX>1</locationX><locationY>1</locationY>"
            "<defaultConnectorLabel>None</defaultConnectorLabel><waitEvents><name>Later</name>"
            "<conditionLogic>and</conditionLogic>" + fx.conn("Done") + "<eventType>AlarmEvent</eventType>"
            "<inputParameters><name>AlarmTime</name><value><elementReference>$Flow.CurrentDateTime"
            "</elementReference></value></inputParameters>"
            f"<inputParameters><name>TimeOffset</name><value><numberValue>{days}</numberValue></value>"
            "</inputParameters>"
            "<inputParameters><name>TimeOffsetUnit</name><value><stringValue>Days</stringValue></value>"
            "</inputParameters><label>Later</label></waitEvents></waits>")
    done = fx.assignment("Done", None, [("elapsed", "Assign", "<booleanValue>true</booleanValue>")])
    return fx.flow(wait, done, fx.variable("elapsed", data_type="Boolean"), start=fx.start("Pause"))
