"""Object and field metadata read from ``metadata/objects/*.object.json``.

The metadata view is immutable once loaded and carries a v2 digest, so a
compiled Flow plan can pin the exact view it was compiled against
(seed 004 section 7.1, ``RuntimeMetadataView``).
"""
from __future__ import annotations

import datetime as dt
import functools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path

from django.conf import settings

from nexusflow.kernel import canonical_json
from nexusflow.kernel.digests import digest_v2
from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.identity import InvalidIdentity, validate_key

#: Field type of a reference to another object's record (its record key); the field names ``references``.
LOOKUP = "lookup"
#: Field type of a closed set of text values; the field names its ``values``.
PICKLIST = "picklist"
_NUMBER = re.compile(r"-?(\d+(\.\d*)?|\.\d+)")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")
_PHONE = re.compile(r"\+?[0-9 ().\-]{3,40}")


def _valid_datetime(value: str) -> bool:
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        return False
    return "T" in value and parsed.tzinfo is not None


#: Field type -> check of a non-empty value (text as stored). Values are stored as the text given.
FIELD_TYPES: dict[str, Callable[[str], bool] | None] = {
    "text": None, "textarea": None, LOOKUP: None, PICKLIST: None,  # checked by max length, key, values
    "number": _NUMBER.fullmatch, "currency": _NUMBER.fullmatch, "percent": _NUMBER.fullmatch,
    "boolean": lambda v: v in ("true", "false"),
    "date": lambda v: bool(_DATE.fullmatch(v)) and _valid_date(v),
    "datetime": _valid_datetime,
    "email": _EMAIL.fullmatch, "phone": _PHONE.fullmatch,
}


def _valid_date(value: str) -> bool:
    try:
        dt.date.fromisoformat(value)
    except ValueError:
        return False
    return True


class UnknownObject(NexusError):
    code = "unknown_object"
    http_status = 404


class UnknownField(NexusError):
    code = "unknown_field"
    http_status = 400


class InvalidFieldValue(NexusError):
    code = "invalid_field_value"
    http_status = 400


@dataclass(frozen=True)
class FieldDefinition:
    name: str
    type: str
    max_length: int
    #: User ids allowed to read the field (field-level security); ``None``: every user may.
    read_access: tuple[str, ...] | None = None
    #: For ``type`` ``lookup``: the object whose record key the field holds; ``None`` otherwise.
    references: str | None = None
    #: For ``type`` ``picklist``: the values it accepts; ``None`` otherwise.
    values: tuple[str, ...] | None = None


@dataclass(frozen=True)
class MirrorFieldDefinition:
    name: str
    owner_pack: str
    push_contract: str


@dataclass(frozen=True)
class ConversionDefinition:
    """A declared object conversion (identity transfer, seed 000 "Transfer").

    ``field_map`` maps a source field to the target object's field that a
    newly created target record takes at conversion; ``source_values`` are
    the source fields set on the converted (then soft-deleted) source.
    """

    target_object: str
    field_map: dict[str, str]
    source_values: dict[str, str] = dataclass_field(default_factory=dict)


@dataclass(frozen=True)
class ObjectDefinition:
    name: str
    key_prefix: str
    fields: dict[str, FieldDefinition]
    mirror_fields: dict[str, MirrorFieldDefinition]
    #: ``{target object: ConversionDefinition}``: the conversions this object declares.
    conversions: dict[str, ConversionDefinition] = dataclass_field(default_factory=dict)
    #: The fields whose changes the record's field history keeps (``track_history``: ``true`` for every
    #: field, or a list); empty: no history.
    tracked_fields: frozenset[str] = frozenset()

    def clean_value(self, field: str, value: object) -> str | None:
        """Validate one field value against its definition.

        A ``lookup`` field holds the record key of a record of the object it
        ``references`` (or ``None`` / ``""`` for no reference); the key must be
        canonical (ARCHITECTURE.md section 6, "Canonical identity"). Whether that record exists is
        not a metadata question: consumers resolve it when they read it. A typed
        field (:data:`FIELD_TYPES`) holds text in its type's form: ``number``,
        ``currency`` and ``percent`` a plain decimal (``-12.50``), ``boolean``
        ``true`` or ``false``, ``date`` ``YYYY-MM-DD``, ``datetime`` ISO 8601
        with its offset (``2026-03-01T06:30:00Z``), ``picklist`` one of its
        ``values``, ``email`` and ``phone`` an address and a number. ``None``
        and ``""`` are "no value" for every type.

        Raises:
            UnknownField: ``field`` is not defined on this object.
            InvalidFieldValue: not text/None, longer than ``max_length``, a
                lookup value that is not a canonical record key, or a value not
                in its type's form.
        """
        definition = self.fields.get(field)
        if definition is None:
            raise UnknownField(f"{self.name}.{field} is not a defined field")
        if value is None:
            return None
        if not isinstance(value, str):
            raise InvalidFieldValue(f"{self.name}.{field}: expected text")
        if len(value) > definition.max_length:
            raise InvalidFieldValue(f"{self.name}.{field}: longer than {definition.max_length}")
        if definition.type == LOOKUP and value != "":
            try:
                validate_key(value, field=f"{self.name}.{field}", max_length=definition.max_length)
            except InvalidIdentity as exc:
                raise InvalidFieldValue(str(exc)) from None
        check = FIELD_TYPES.get(definition.type)
        if value != "" and (
                (check is not None and not check(value))
                or (definition.type == PICKLIST and value not in (definition.values or ()))):
            raise InvalidFieldValue(f"{self.name}.{field}: {value!r} is not a {definition.type} value")
        return value


@dataclass(frozen=True)
class QuickActionDefinition:
    """A record-creating quick action (``quick_actions/*.quickaction.json``): a Flow's ``quickAction`` call
    creates one ``target_object`` record with ``field_defaults``, the action's ``contextId`` input in
    ``context_field`` (if it has one) and any other input named after a field of the target."""

    name: str
    target_object: str
    context_field: str | None
    field_defaults: dict[str, str]


@dataclass(frozen=True)
class UserDefinition:
    """A user the view declares (``users/*.user.json``): its id, whether it is active, and the attribute
    values a Flow reads as ``$User.<Field>`` (``{"Email": "ops@example.org", "Name": ...}``, text)."""

    user_id: str
    active: bool
    fields: dict[str, str]


@dataclass(frozen=True)
class MetadataView:
    objects: dict[str, ObjectDefinition]
    digest: str
    #: ``{action name: QuickActionDefinition}``: the record-creating quick actions the view declares.
    quick_actions: dict[str, QuickActionDefinition] = dataclass_field(default_factory=dict)
    #: ``{user id: UserDefinition}``: the users the view declares.
    users: dict[str, UserDefinition] = dataclass_field(default_factory=dict)

    def object(self, name: str) -> ObjectDefinition:
        try:
            return self.objects[name]
        except KeyError:
            raise UnknownObject(f"no object named {name!r} in the metadata view") from None


def _parse(doc: dict) -> ObjectDefinition:
    name = validate_key(doc["object"], field="object")
    fields = {
        f["name"]: FieldDefinition(validate_key(f["name"], field="field"), f.get("type", "text"),
                                   int(f.get("max_length", 255)),
                                   tuple(f["read_access"]) if f.get("read_access") is not None else None,
                                   f.get("references"),
                                   tuple(f["values"]) if f.get("values") is not None else None)
        for f in doc.get("fields", [])
    }
    for definition in fields.values():
        if definition.type not in FIELD_TYPES:
            raise ValueError(f"{name}.{definition.name}: unknown field type {definition.type!r}; one of "
                             f"{', '.join(sorted(FIELD_TYPES))}")
        if (definition.type == PICKLIST) != (definition.values is not None):
            raise ValueError(f"{name}.{definition.name}: a picklist field lists its values, and only a picklist does")
    for f in doc.get("fields", []):  # the values are a list of distinct, non-empty texts
        values = f.get("values")
        if values is not None and (not isinstance(values, list) or not values
                                   or not all(isinstance(v, str) and v for v in values)
                                   or len(set(values)) != len(values)):
            raise ValueError(f"{name}.{f['name']}: a picklist field lists its values as distinct, non-empty texts")
    for definition in fields.values():
        if (definition.type == LOOKUP) != (definition.references is not None):
            raise ValueError(f"{name}.{definition.name}: a lookup field names the object it references, "
                             f"and only a lookup field does")
    mirrors = {
        m["name"]: MirrorFieldDefinition(validate_key(m["name"], field="mirror_field"), m["owner_pack"], m["push_contract"])
        for m in doc.get("mirror_fields", [])
    }
    conversions = {}
    for c in doc.get("conversions", []):
        target = validate_key(c["target_object"], field="conversion target_object")
        if target in conversions:
            raise ValueError(f"{name}: conversion to {target} declared twice")
        conversions[target] = ConversionDefinition(target, {validate_key(k, field="conversion field"):
                                                            validate_key(v, field="conversion field")
                                                            for k, v in c.get("field_map", {}).items()},
                                                   dict(c.get("source_values", {})))
    tracked = doc.get("track_history")
    if tracked is True:
        tracked_fields = frozenset(fields)
    elif isinstance(tracked, list) and all(f in fields for f in tracked):
        tracked_fields = frozenset(tracked)
    elif tracked in (None, False):
        tracked_fields = frozenset()
    else:
        raise ValueError(f"{name}: track_history is true or a list of its fields")
    return ObjectDefinition(name, doc.get("key_prefix", "a00"), fields, mirrors, conversions, tracked_fields)


def _quick_actions(directory: Path, objects: dict[str, ObjectDefinition]) -> tuple[dict, list]:
    actions: dict[str, QuickActionDefinition] = {}
    docs = []
    for path in sorted((directory / "quick_actions").glob("*.quickaction.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        name = str(doc.get("name") or "")
        if doc.get("type") != "Create" or not name or name in actions:
            raise ValueError(f"{path}: a quick action has a unique name and type Create")
        target = objects.get(doc.get("target_object"))
        if target is None:
            raise ValueError(f"quick action {name} creates unknown object {doc.get('target_object')!r}")
        context_field = doc.get("context_field")
        defaults = {str(k): v for k, v in (doc.get("field_defaults") or {}).items()}
        for field_name in [*defaults, *([context_field] if context_field else [])]:
            if field_name not in target.fields:
                raise ValueError(f"quick action {name}: {target.name} has no field {field_name!r}")
        for field_name, value in defaults.items():
            target.clean_value(field_name, value)
        actions[name] = QuickActionDefinition(name, target.name, context_field, defaults)
        docs.append(doc)
    return actions, docs


def _users(directory: Path) -> tuple[dict[str, UserDefinition], list]:
    users: dict[str, UserDefinition] = {}
    docs = []
    for path in sorted((directory / "users").glob("*.user.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        user_id = validate_key(str(doc.get("id") or ""), field="user id")
        fields = doc.get("fields") or {}
        if user_id in users or not isinstance(fields, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in fields.items()):
            raise ValueError(f"{path}: a user has a unique id and text fields")
        users[user_id] = UserDefinition(user_id, doc.get("active", True) is True, dict(fields))
        docs.append(doc)
    return users, docs


def load_view(directory: Path) -> MetadataView:
    """Load every ``*.object.json`` under ``directory/objects``, every ``*.quickaction.json`` under
    ``directory/quick_actions`` and every ``*.user.json`` under ``directory/users``.

    Raises:
        ValueError: duplicate object names, unreadable JSON, a lookup field
            that references no object of the view, a conversion naming an
            unknown object or field, or a quick action that is not a unique
            ``Create`` of a known object with known fields, or a user without
            a unique id and text fields.
    """
    objects: dict[str, ObjectDefinition] = {}
    docs = []
    for path in sorted((directory / "objects").glob("*.object.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        definition = _parse(doc)
        if definition.name in objects:
            raise ValueError(f"object {definition.name} defined twice ({path})")
        objects[definition.name] = definition
        docs.append(doc)
    for definition in objects.values():
        for field in definition.fields.values():
            if field.references is not None and field.references not in objects:
                raise ValueError(f"{definition.name}.{field.name} references unknown object {field.references!r}")
        for conversion in definition.conversions.values():
            target = objects.get(conversion.target_object)
            if target is None:
                raise ValueError(f"{definition.name} converts to unknown object {conversion.target_object!r}")
            for source_field, target_field in conversion.field_map.items():
                if source_field not in definition.fields or target_field not in target.fields:
                    raise ValueError(f"{definition.name} -> {target.name}: conversion maps unknown field "
                                     f"{source_field!r} -> {target_field!r}")
            for source_field, value in conversion.source_values.items():
                definition.clean_value(source_field, value)
    quick_actions, action_docs = _quick_actions(directory, objects)
    parts = [("objects", canonical_json.dumps(docs))]
    if action_docs:  # a view without quick actions keeps the digest it always had
        parts.append(("quick_actions", canonical_json.dumps(action_docs)))
    users, user_docs = _users(directory)
    if user_docs:  # likewise without users
        parts.append(("users", canonical_json.dumps(user_docs)))
    return MetadataView(objects, digest_v2("records.metadata-view", parts).hexdigest, quick_actions, users)


@functools.cache
def current_view() -> MetadataView:
    """The metadata view of this process (loaded once from settings)."""
    return load_view(Path(settings.NEXUS_METADATA_DIR))
