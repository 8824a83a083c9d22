"""Flow metadata front end: ``.flow-meta.xml`` -> normalized, versioned JSON (seed 004 section 7.2 step 1).

:func:`parse_flow_document` reads one Flow metadata document with DOCTYPE and
ENTITY declarations refused and returns a :class:`FlowDocument`: a plain JSON
value (schema ``flows.metadata.v1``) that no longer depends on formatting.

Normalization rules (what "non-semantic formatting" means here):

- element order at the top level is free: named elements are grouped by kind
  and keyed by their ``<name>``;
- ``locationX``/``locationY`` and builder-only ``processMetadataValues`` are
  dropped (a ``RunAtomically`` / ``ExecutionProfile`` entry is kept as the
  flow's requested profile);
- whitespace around leaf text is dropped, except in ``stringValue`` and
  ``text`` values, which are data;
- repeated children keyed by name (input/output parameters and assignments,
  queried fields) are sorted; ordered lists (rules, conditions, filters,
  assignment items, wait events) keep document order because the order is
  evaluated.

The namespace is data: elements are matched by XML local name.
"""
from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any
from xml.parsers import expat

from nexusflow.kernel import canonical_json
from nexusflow.kernel.digests import digest_json_v2

METADATA_SCHEMA = "flows.metadata.v1"
MAX_SOURCE_BYTES = 1_000_000
XSI_NIL = "{http://www.w3.org/2001/XMLSchema-instance}nil"

LAYOUT_TAGS = frozenset({"locationX", "locationY"})
BUILDER_TAGS = frozenset({"processMetadataValues"})
VERBATIM_TAGS = frozenset({"stringValue", "text"})

#: Top-level element kinds keyed by ``<name>``.
NAMED_KINDS = (
    "actionCalls", "apexPluginCalls", "assignments", "choices", "collectionProcessors", "constants",
    "customErrors", "decisions", "dynamicChoiceSets", "formulas", "loops", "orchestratedStages",
    "recordCreates", "recordDeletes", "recordLookups", "recordRollbacks", "recordUpdates", "screens", "stages",
    "steps", "subflows", "textTemplates", "transforms", "variables", "waits",
)
#: Top-level singletons kept as scalars (or one normalized object).
SINGLETONS = {
    "apiVersion": "api_version", "processType": "process_type", "label": "label", "status": "status",
    "runInMode": "run_in_mode", "startElementReference": "start_element_reference", "start": "start",
    "triggerOrder": "trigger_order", "interviewLabel": "interview_label", "description": "description",
    "isTemplate": "is_template", "environments": "environments", "timeZoneSidKey": "time_zone_sid_key",
}
#: Children that may repeat: always a list.
REPEATABLE = frozenset({
    "rules", "conditions", "filters", "inputParameters", "outputParameters", "inputAssignments",
    "outputAssignments", "assignmentItems", "waitEvents", "queriedFields", "scheduledPaths", "fields",
    "stageSteps", "capabilityTypes", "dataTypeMappings", "exitActionInputParameters", "entryActionInputParameters",
    "choiceReferences", "errorMessages", "sortOptions", "actions", "visibilityRule",
})
#: Repeatable children whose order is not evaluated: sorted canonically.
UNORDERED = frozenset({
    "inputParameters", "outputParameters", "inputAssignments", "outputAssignments", "queriedFields",
    "dataTypeMappings", "capabilityTypes", "exitActionInputParameters", "entryActionInputParameters",
})
#: ``processMetadataValues`` names that carry a profile request (seed 004 section 9.2).
PROFILE_REQUEST_NAMES = {"RunAtomically", "ExecutionProfile"}
PROFILE_REQUEST_VALUES = {"BoundedAtomic": "bounded_atomic", "DurableOrchestration": "durable_orchestration"}


class FrontEndError(Exception):
    """The document cannot be read as Flow metadata; ``code`` is stable."""

    def __init__(self, code: str, detail: str, element: str | None = None):
        self.code, self.detail, self.element = code, detail, element
        super().__init__(f"{code}: {detail}")


@dataclass(frozen=True)
class FlowDocument:
    """The normalized metadata form plus front-end findings.

    ``data`` is JSON: ``{"schema", "process_type", "start", "elements":
    {kind: {name: body}}, "other": {tag: [...]}, "requested_profile", ...}``.
    ``findings`` are ``(code, element, detail)`` triples the compiler turns
    into diagnostics (duplicate names, unnamed elements, bad requests).
    """

    data: dict[str, Any]
    findings: tuple[tuple[str, str | None, str], ...] = field(default=())

    @property
    def digest(self) -> str:
        """v2 digest of the canonical JSON form: the Flow version's metadata digest."""
        return digest_json_v2("flows.flow-metadata", canonical_json.dumps(self.data)).hexdigest

    def elements(self, kind: str) -> dict[str, Any]:
        return self.data["elements"].get(kind, {})


class _ForbiddenDeclaration(Exception):
    pass


def _forbid(*_args: Any) -> None:
    raise _ForbiddenDeclaration()


def parse_xml(source: bytes | str) -> ET.Element:
    """Parse Flow XML with DOCTYPE/ENTITY declarations refused.

    Raises:
        FrontEndError: ``xml_too_large``, ``xml_forbidden_declaration`` or ``xml_malformed``.
    """
    if isinstance(source, str):
        source = source.encode("utf-8")
    if not isinstance(source, (bytes, bytearray)):
        raise FrontEndError("xml_malformed", "source must be bytes")
    source = bytes(source)
    if len(source) > MAX_SOURCE_BYTES:
        raise FrontEndError("xml_too_large", f"more than {MAX_SOURCE_BYTES} bytes")
    upper = source.upper()
    if b"<!DOCTYPE" in upper or b"<!ENTITY" in upper:
        raise FrontEndError("xml_forbidden_declaration", "DOCTYPE and ENTITY are refused")
    scanner = expat.ParserCreate()
    scanner.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
    scanner.StartDoctypeDeclHandler = _forbid
    scanner.EntityDeclHandler = _forbid
    scanner.UnparsedEntityDeclHandler = _forbid
    scanner.ExternalEntityRefHandler = _forbid
    try:
        scanner.Parse(source, True)
    except _ForbiddenDeclaration:
        raise FrontEndError("xml_forbidden_declaration", "DOCTYPE and ENTITY are refused") from None
    except expat.ExpatError as exc:
        raise FrontEndError("xml_malformed", str(exc)) from None
    try:
        return ET.fromstring(source)
    except ET.ParseError as exc:
        raise FrontEndError("xml_malformed", str(exc)) from None


def local(tag: Any) -> str:
    """XML local name of ``tag`` ("" for comments and processing instructions)."""
    if not isinstance(tag, str):
        return ""
    return tag.rsplit("}", 1)[-1]


def _sort_key(value: Any) -> bytes:
    return canonical_json.dumps(value)


def normalize_node(el: ET.Element) -> Any:
    """Normalize one element: leaf -> text, container -> ``{tag: value | [values]}``; nil -> None."""
    if el.attrib.get(XSI_NIL) == "true":
        return None
    kids = [c for c in el if local(c.tag) and local(c.tag) not in LAYOUT_TAGS and local(c.tag) not in BUILDER_TAGS]
    if not kids:
        if any(local(c.tag) for c in el):
            return {}  # only layout children: an empty container
        text = el.text or ""
        return text if local(el.tag) in VERBATIM_TAGS else text.strip()
    out: dict[str, Any] = {}
    duplicated: set[str] = set()
    for child in kids:
        tag = local(child.tag)
        value = normalize_node(child)
        if tag in REPEATABLE:
            out.setdefault(tag, []).append(value)
        elif tag in out:
            duplicated.add(tag)  # the first one wins; the compiler reports the duplicate
        else:
            out[tag] = value
    if duplicated:
        out["__duplicated__"] = sorted(duplicated)
    for tag in UNORDERED & out.keys():
        out[tag] = sorted(out[tag], key=_sort_key)
    return out


def _profile_request(root: ET.Element) -> tuple[str | None, list[tuple[str, str | None, str]]]:
    findings: list[tuple[str, str | None, str]] = []
    requested = None
    for pmv in root:
        if local(pmv.tag) != "processMetadataValues":
            continue
        body = normalize_node(pmv)
        if not isinstance(body, dict) or body.get("name") not in PROFILE_REQUEST_NAMES:
            continue
        value = body.get("value") if isinstance(body.get("value"), dict) else {}
        if body["name"] == "RunAtomically":
            flag = value.get("booleanValue")
            if flag == "true":
                requested = "bounded_atomic"
            elif flag != "false":
                findings.append(("invalid_profile_request", None, "RunAtomically needs a booleanValue"))
        else:
            wanted = PROFILE_REQUEST_VALUES.get(value.get("stringValue", ""))
            if wanted is None:
                findings.append(("invalid_profile_request", None,
                                 f"ExecutionProfile must be one of {', '.join(sorted(PROFILE_REQUEST_VALUES))}"))
            else:
                requested = wanted
    return requested, findings


def parse_flow_document(source: bytes | str) -> FlowDocument:
    """Parse and normalize one ``.flow-meta.xml`` document.

    Args:
        source: the document bytes (or text), at most 1 MB.

    Returns:
        The :class:`FlowDocument`; identical semantics give byte-identical
        ``data`` whatever the indentation, element order or canvas layout.

    Raises:
        FrontEndError: unreadable XML (``xml_*``) or a root that is not ``<Flow>`` (``not_a_flow``).
    """
    root = parse_xml(source)
    if local(root.tag) != "Flow":
        raise FrontEndError("not_a_flow", f"root element is {local(root.tag)!r}")
    requested, findings = _profile_request(root)
    data: dict[str, Any] = {"schema": METADATA_SCHEMA, "requested_profile": requested}
    for key in SINGLETONS.values():
        data[key] = None
    elements: dict[str, dict[str, Any]] = {}
    other: dict[str, list[Any]] = {}
    seen_names: dict[str, str] = {}
    for child in root:
        tag = local(child.tag)
        if not tag or tag in BUILDER_TAGS or tag in LAYOUT_TAGS:
            continue
        if tag in SINGLETONS:
            key = SINGLETONS[tag]
            if data[key] is not None:
                findings.append(("duplicate_element", tag, f"<{tag}> appears more than once"))
                continue
            data[key] = normalize_node(child)
        elif tag in NAMED_KINDS:
            body = normalize_node(child)
            name = body.get("name") if isinstance(body, dict) else None
            if not isinstance(name, str) or not name:
                findings.append(("missing_element_name", tag, f"a <{tag}> element has no <name>"))
                continue
            if name in seen_names:
                findings.append(("duplicate_element", name, f"name used by <{seen_names[name]}> and <{tag}>"))
                continue
            seen_names[name] = tag
            elements.setdefault(tag, {})[name] = body
        else:
            other.setdefault(tag, []).append(normalize_node(child))
    data["elements"] = {k: dict(sorted(v.items())) for k, v in sorted(elements.items())}
    data["other"] = {k: sorted(v, key=_sort_key) for k, v in sorted(other.items())}
    return FlowDocument(data=data, findings=tuple(findings))


def value_of(value: Any) -> tuple[str, Any] | None:
    """Return ``(kind, text)`` of a normalized ``<value>`` (``stringValue``, ``elementReference``, ...).

    ``None`` for an absent or nil value; ``("invalid", ...)`` when it holds
    more than one typed child.
    """
    if value is None:
        return None
    if not isinstance(value, dict):
        return ("invalid", value)
    if len(value) != 1:
        return ("invalid", value) if value else None
    (kind, text), = value.items()
    return (kind, text)
