"""Flow documents the executor tests run: Bounded Atomic, Durable and Embedded Before-Save on the demo object."""
from __future__ import annotations

from . import flowxml as fx

STAGE_FILTER = ("<filterLogic>and</filterLogic><filters><field>lifecyclestage</field><operator>EqualTo</operator>"
                "<value><stringValue>customer</stringValue></value></filters>")


def _update_record(name: str, target: str | None, field: str, value_xml: str) -> str:
    return (f"<recordUpdates><name>{name}</name><label>{name}</label><locationX>1</locationX><locationY>2</locationY>"
            f"{fx.conn(target)}<inputAssignments><field>{field}</field><value>{value_xml}</value></inputAssignments>"
            "<inputReference>$Record</inputReference></recordUpdates>")


def _update_where(name: str, target: str | None, *, email: str, field: str, value_xml: str) -> str:
    return (f"<recordUpdates><name>{name}</name><label>{name}</label><locationX>1</locationX><locationY>2</locationY>"
            f"{fx.conn(target)}<filterLogic>and</filterLogic><filters><field>email</field><operator>EqualTo</operator>"
            f"<value><stringValue>{email}</stringValue></value></filters>"
            f"<inputAssignments><field>{field}</field><value>{value_xml}</value></inputAssignments>"
            "<object>Contact</object></recordUpdates>")


def atomic_set_firstname(value: str = "Flowed") -> bytes:
    """After-save, Bounded Atomic: one mutation step setting the trigger record's firstname."""
    return fx.flow(_update_record("Set_Name", None, "firstname", f"<stringValue>{value}</stringValue>"),
                   start=fx.start("Set_Name", trigger="RecordAfterSave", filters=STAGE_FILTER))


def atomic_touch_partners(email: str = "partner@example.com") -> bytes:
    """After-save, Bounded Atomic: update every Contact with ``email`` (records outside the trigger)."""
    return fx.flow(_update_where("Touch_Partners", None, email=email, field="lifecyclestage",
                                 value_xml="<stringValue>touched</stringValue>"),
                   start=fx.start("Touch_Partners", trigger="RecordAfterSave", filters=STAGE_FILTER))


def durable_counter() -> bytes:
    """After-save, Durable Orchestration: assignment -> decision on the variable -> update of the trigger record."""
    decision = ("<decisions><name>Is_One</name><label>Is_One</label><locationX>1</locationX><locationY>2</locationY>"
                "<defaultConnectorLabel>Other</defaultConnectorLabel><rules><name>One</name>"
                "<conditionLogic>and</conditionLogic><conditions><leftValueReference>counter</leftValueReference>"
                "<operator>EqualTo</operator><rightValue><numberValue>1</numberValue></rightValue></conditions>"
                f"{fx.conn('Mark')}<label>One</label></rules></decisions>")
    return fx.flow(fx.variable("counter", data_type="Number"),
                   fx.assignment("Count", "Is_One", [("counter", "Add", "<numberValue>1</numberValue>")]),
                   decision,
                   _update_record("Mark", None, "lastname", "<stringValue>counted-once</stringValue>"),
                   start=fx.start("Count", trigger="RecordAfterSave", filters=STAGE_FILTER),
                   profile="DurableOrchestration")


def before_save_set_lastname(value: str = "Before-Saved") -> bytes:
    """Before-save, Embedded: assign the trigger record's lastname in the caller's transaction."""
    return fx.flow(fx.assignment("Stamp", None, [("$Record.lastname", "Assign", f"<stringValue>{value}</stringValue>")]),
                   start=fx.start("Stamp", trigger="RecordBeforeSave", filters=STAGE_FILTER))


def atomic_password_variable() -> bytes:
    """Durable: an assignment into a variable named like a credential (the checkpoint refuses it)."""
    return fx.flow(fx.variable("password"),
                   fx.assignment("Keep", "Set_Name", [("password", "Assign", "<stringValue>hunter2</stringValue>")]),
                   _update_record("Set_Name", None, "firstname", "<stringValue>Flowed</stringValue>"),
                   start=fx.start("Keep", trigger="RecordAfterSave", filters=STAGE_FILTER),
                   profile="DurableOrchestration")
