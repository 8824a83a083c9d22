"""Small builders of Flow metadata documents for compiler tests, plus a reformatter.

``reformat`` rewrites a document the way a different editor or a Salesforce
retrieve could: other indentation, other canvas coordinates, and top-level
elements in another order (Salesforce accepts top-level elements in any
order; child order inside an element is semantic and kept).
"""
from __future__ import annotations

import xml.etree.ElementTree as ET

NS = "http://soap.sforce.com/2006/04/metadata"


def flow(*elements: str, start: str = "", process_type: str = "AutoLaunchedFlow", profile: str | None = None,
         extra: str = "") -> bytes:
    pmv = ""
    if profile == "RunAtomically":
        pmv = ("<processMetadataValues><name>RunAtomically</name><value><booleanValue>true</booleanValue>"
               "</value></processMetadataValues>")
    elif profile is not None:
        pmv = (f"<processMetadataValues><name>ExecutionProfile</name><value><stringValue>{profile}</stringValue>"
               "</value></processMetadataValues>")
    body = "\n    ".join(elements)
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<Flow xmlns="{NS}">
    <apiVersion>62.0</apiVersion>
    {body}
    <label>Test Flow</label>
    {pmv}
    <processType>{process_type}</processType>
    {start}
    <status>Active</status>
    {extra}
</Flow>
""".encode()


def start(target: str | None, *, trigger: str | None = None, obj: str = "Contact", rtt: str = "CreateAndUpdate",
          filters: str = "") -> str:
    conn = f"<connector><targetReference>{target}</targetReference></connector>" if target else ""
    if trigger is None:
        return f"<start><locationX>50</locationX><locationY>0</locationY>{conn}</start>"
    return (f"<start><locationX>50</locationX><locationY>0</locationY>{conn}{filters}<object>{obj}</object>"
            f"<recordTriggerType>{rtt}</recordTriggerType><triggerType>{trigger}</triggerType></start>")


def conn(target: str | None, tag: str = "connector") -> str:
    return f"<{tag}><targetReference>{target}</targetReference></{tag}>" if target else ""


def variable(name: str, *, data_type: str = "String", collection: bool = False, is_input: bool = False) -> str:
    return (f"<variables><name>{name}</name><dataType>{data_type}</dataType>"
            f"<isCollection>{str(collection).lower()}</isCollection><isInput>{str(is_input).lower()}</isInput>"
            f"<isOutput>false</isOutput></variables>")


def assignment(name: str, target: str | None, items: list[tuple[str, str, str]]) -> str:
    """items: (assignToReference, operator, value xml such as '<stringValue>x</stringValue>')."""
    xml_items = "".join(f"<assignmentItems><assignToReference>{ref}</assignToReference><operator>{op}</operator>"
                        f"<value>{val}</value></assignmentItems>" for ref, op, val in items)
    return (f"<assignments><name>{name}</name><label>{name}</label><locationX>1</locationX><locationY>2</locationY>"
            f"{xml_items}{conn(target)}</assignments>")


def push(name: str, target: str | None, *, fault: str | None = None) -> str:
    return (f"<actionCalls><name>{name}</name><label>{name}</label><locationX>3</locationX><locationY>4</locationY>"
            "<actionName>PushToConnector</actionName><actionType>apex</actionType>"
            f"{conn(target)}{conn(fault, 'faultConnector')}"
            "<inputParameters><name>contract</name><value><stringValue>crm.sync</stringValue></value></inputParameters>"
            "<inputParameters><name>recordId</name><value><elementReference>$Record.Id</elementReference></value>"
            "</inputParameters></actionCalls>")


def email(name: str, target: str | None) -> str:
    return (f"<actionCalls><name>{name}</name><label>{name}</label><locationX>3</locationX><locationY>4</locationY>"
            "<actionName>emailSimple</actionName><actionType>emailSimple</actionType>"
            f"{conn(target)}"
            "<inputParameters><name>emailSubject</name><value><stringValue>Hi</stringValue></value></inputParameters>"
            "<inputParameters><name>emailBody</name><value><stringValue>Body</stringValue></value></inputParameters>"
            "<inputParameters><name>emailAddresses</name><value><stringValue>a@example.com</stringValue></value>"
            "</inputParameters></actionCalls>")


def subflow(name: str, flow_name: str, target: str | None) -> str:
    return (f"<subflows><name>{name}</name><label>{name}</label><locationX>5</locationX><locationY>6</locationY>"
            f"{conn(target)}<flowName>{flow_name}</flowName></subflows>")


def lookup(name: str, target: str | None, *, obj: str = "Contact", first_only: bool = False) -> str:
    return (f"<recordLookups><name>{name}</name><label>{name}</label><locationX>7</locationX><locationY>8</locationY>"
            f"<assignNullValuesIfNoRecordsFound>false</assignNullValuesIfNoRecordsFound>{conn(target)}"
            f"<getFirstRecordOnly>{str(first_only).lower()}</getFirstRecordOnly><object>{obj}</object>"
            "<storeOutputAutomatically>true</storeOutputAutomatically></recordLookups>")


def update(name: str, target: str | None, input_reference: str) -> str:
    return (f"<recordUpdates><name>{name}</name><label>{name}</label><locationX>9</locationX><locationY>9</locationY>"
            f"{conn(target)}<inputReference>{input_reference}</inputReference></recordUpdates>")


def loop(name: str, collection: str, next_target: str | None, done_target: str | None) -> str:
    return (f"<loops><name>{name}</name><label>{name}</label><locationX>1</locationX><locationY>1</locationY>"
            f"<collectionReference>{collection}</collectionReference><iterationOrder>Asc</iterationOrder>"
            f"{conn(next_target, 'nextValueConnector')}{conn(done_target, 'noMoreValuesConnector')}</loops>")


def reformat(source: bytes, *, indent: str = "\t", reverse: bool = True, move: int = 1000) -> bytes:
    """Re-indent, move every element on the canvas and reorder top-level elements."""
    ET.register_namespace("", NS)
    root = ET.fromstring(source)
    for el in root.iter():
        tag = el.tag.rsplit("}", 1)[-1]
        if tag in ("locationX", "locationY") and el.text and el.text.strip().lstrip("-").isdigit():
            el.text = str(int(el.text) + move)
    children = list(root)
    for c in children:
        root.remove(c)

    def key(el):
        name = el.find(f"{{{NS}}}name")
        return (el.tag, name.text if name is not None and name.text else "")

    for c in sorted(children, key=key, reverse=reverse):
        root.append(c)
    for el in root.iter():  # drop old layout whitespace, then indent anew
        if len(el):
            el.text = None
        el.tail = None
    ET.indent(root, space=indent)
    return b'<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="utf-8") + b"\n"
