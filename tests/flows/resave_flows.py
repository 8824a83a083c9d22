"""Flow documents for the prior-value and recursive-save tests (docs/operations.md "Flows that save their own records").

Every builder returns Salesforce Flow metadata for the test metadata view:
the demo ``Contact`` object, plus ``Affiliation`` where a flow creates one.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from xml.sax.saxutils import escape

from django.conf import settings

from . import flowxml as fx

#: A child object of the re-save story: the flow under test creates one per account change.
AFFILIATION = {
    "object": "Affiliation",
    "label": "Affiliation",
    "key_prefix": "a0A",
    "fields": [
        {"name": "contact_id", "type": "lookup", "references": "Contact", "max_length": 18},
        {"name": "account_id", "type": "lookup", "references": "Account", "max_length": 18},
    ],
}


def metadata_with_affiliation(directory: Path) -> Path:
    """A metadata directory: the project's objects plus ``Affiliation``; returns ``directory``."""
    objects = directory / "objects"
    objects.mkdir(parents=True, exist_ok=True)
    for path in (Path(settings.BASE_DIR) / "metadata" / "objects").glob("*.object.json"):
        shutil.copy(path, objects / path.name)
    (objects / "Affiliation.object.json").write_text(json.dumps(AFFILIATION), encoding="utf-8")
    return directory


def formula(name: str, data_type: str, expression: str) -> str:
    return (f"<formulas><name>{name}</name><dataType>{data_type}</dataType>"
            f"<expression>{escape(expression)}</expression></formulas>")


def decision(name: str, formula_name: str, yes: str | None, default: str | None) -> str:
    """A decision whose one rule ``Yes`` holds when the Boolean formula ``formula_name`` is true."""
    return (f"<decisions><name>{name}</name><label>{name}</label><locationX>1</locationX><locationY>2</locationY>"
            f"{fx.conn(default, 'defaultConnector')}<defaultConnectorLabel>Other</defaultConnectorLabel>"
            "<rules><name>Yes</name><conditionLogic>and</conditionLogic><conditions>"
            f"<leftValueReference>{formula_name}</leftValueReference><operator>EqualTo</operator>"
            "<rightValue><booleanValue>true</booleanValue></rightValue></conditions>"
            f"{fx.conn(yes)}<label>Yes</label></rules></decisions>")


def update_trigger(name: str, target: str | None, *assignments: tuple[str, str]) -> str:
    """Update Records on ``$Record``: ``(field, value xml)`` assignments."""
    items = "".join(f"<inputAssignments><field>{f}</field><value>{v}</value></inputAssignments>" for f, v in assignments)
    return (f"<recordUpdates><name>{name}</name><label>{name}</label><locationX>1</locationX><locationY>2</locationY>"
            f"{fx.conn(target)}{items}<inputReference>$Record</inputReference></recordUpdates>")


def create_record(name: str, target: str | None, obj: str, assignments: dict[str, str]) -> str:
    """Create Records of ``obj`` from ``{field: element reference}``."""
    items = "".join(f"<inputAssignments><field>{f}</field><value><elementReference>{ref}</elementReference>"
                    f"</value></inputAssignments>" for f, ref in assignments.items())
    return (f"<recordCreates><name>{name}</name><label>{name}</label><locationX>1</locationX><locationY>2</locationY>"
            f"{fx.conn(target)}{items}<object>{obj}</object></recordCreates>")


def mark_if_changed(field: str, *, profile: str | None = None, rtt: str = "Update") -> bytes:
    """After-save: ``firstname`` := "changed" when ``ISCHANGED($Record.<field>)``, else "unchanged".

    The same write sets ``lastname`` := ``PRIORVALUE($Record.<field>)`` and
    ``lifecyclestage`` := ``$Record__Prior.<field>``, so one run shows what the
    three prior-value forms saw.
    """
    ref = "{!$Record." + field + "}"
    # A create trigger has no $Record__Prior (the compiler refuses it there, as Salesforce does).
    record_prior = ("<stringValue>create</stringValue>" if rtt == "Create"
                    else f"<elementReference>$Record__Prior.{field}</elementReference>")

    def marks(name: str, mark: str) -> str:
        return update_trigger(name, None, ("firstname", f"<stringValue>{mark}</stringValue>"),
                              ("lastname", "<elementReference>Prior_Value</elementReference>"),
                              ("lifecyclestage", record_prior))

    elements = [
        formula("Field_Changed", "Boolean", f"ISCHANGED({ref})"),
        formula("Prior_Value", "String", f"PRIORVALUE({ref})"),
        decision("Changed", "Field_Changed", "Mark_Changed", "Mark_Unchanged"),
        marks("Mark_Changed", "changed"),
        marks("Mark_Unchanged", "unchanged"),
    ]
    return fx.flow(*elements, start=fx.start("Changed", trigger="RecordAfterSave", rtt=rtt), profile=profile)


def before_save_mark_if_changed(field: str) -> bytes:
    """Before-save (Embedded): the same marks as :func:`mark_if_changed`, assigned to ``$Record`` in the save."""
    ref = "{!$Record." + field + "}"
    elements = [
        formula("Field_Changed", "Boolean", f"ISCHANGED({ref})"),
        formula("Prior_Value", "String", f"PRIORVALUE({ref})"),
        decision("Changed", "Field_Changed", "Mark_Changed", "Mark_Unchanged"),
        fx.assignment("Mark_Changed", "Keep_Prior", [("$Record.firstname", "Assign", "<stringValue>changed</stringValue>")]),
        fx.assignment("Mark_Unchanged", "Keep_Prior",
                      [("$Record.firstname", "Assign", "<stringValue>unchanged</stringValue>")]),
        fx.assignment("Keep_Prior", None, [
            ("$Record.lastname", "Assign", "<elementReference>Prior_Value</elementReference>"),
            ("$Record.lifecyclestage", "Assign", f"<elementReference>$Record__Prior.{field}</elementReference>"),
        ]),
    ]
    return fx.flow(*elements, start=fx.start("Changed", trigger="RecordBeforeSave", rtt="CreateAndUpdate"))


def self_updating() -> bytes:
    """After-save on update, no entry condition: flips its own trigger record's ``lastname`` (A <-> B) every run.

    Every run changes the value, so every run re-saves the record; the value
    never grows, so nothing but the recursion bound stops the chain.
    """
    return fx.flow(
        formula("Flipped", "String", 'IF({!$Record.lastname} = "A", "B", "A")'),
        update_trigger("Flip", None, ("lastname", "<elementReference>Flipped</elementReference>")),
        start=fx.start("Flip", trigger="RecordAfterSave", rtt="Update"),
    )


def normalize_email() -> bytes:
    """Flow A of the re-save story: after-save on update, writes the lower-cased email back to its record."""
    return fx.flow(
        formula("Lower_Email", "String", "LOWER({!$Record.email})"),
        update_trigger("Write_Back", None, ("email", "<elementReference>Lower_Email</elementReference>")),
        start=fx.start("Write_Back", trigger="RecordAfterSave", rtt="Update"),
    )


def affiliate_on_account_change() -> bytes:
    """Flow B of the re-save story: ``ISCHANGED(account_id)`` -> create one Affiliation (contact, account)."""
    return fx.flow(
        formula("Account_Changed", "Boolean", "ISCHANGED({!$Record.account_id})"),
        decision("Changed", "Account_Changed", "Affiliate", None),
        create_record("Affiliate", None, "Affiliation", {"contact_id": "$Record.Id", "account_id": "$Record.account_id"}),
        start=fx.start("Changed", trigger="RecordAfterSave", rtt="Update"),
    )
