"""Who may do what: the access policy document and the pure access decisions (seed 004 section 17).

An org's access policy is an immutable generation (``records.AccessPolicyGeneration``) of one document::

    {"users": [{"id": "u1", "active": true, "email": "a@example.org", "name": "A",
                "permission_sets": ["sales"], "fields": {<attribute>: <text>}}],
     "permission_sets": {"sales": {"objects": {<object>: ["create", "read", "edit", "delete"]},
                                   "fields": {<object>: {<field>: ["read", "edit"]}},
                                   "view_all": [<object>], "modify_all": [<object>]}},
     "sharing": {<object>: "private" | "public_read" | "public_read_write"},
     "integration_user": "u1", "integration_users": {<account key>: "u2"},
     "operators": {<operator login name>: "u1"}}

- object permissions: what a user may do with an object's records at all (``edit`` implies ``read``,
  ``delete`` implies ``edit``, ``create`` implies ``read``); ``view_all`` reads every record of the object,
  ``modify_all`` reads, edits and deletes every record of it;
- field-level security (FLS): which fields a user may read or edit (``edit`` implies ``read``); a field no
  permission set of the user lists is neither readable nor editable; ``view_all``/``modify_all`` do not
  widen it;
- record access (RLS): the org-wide default of the object (an object ``sharing`` does not list is
  ``private``), then ownership (the owner reads, edits and deletes), then explicit shares (``read`` or
  ``edit``; a share never grants deletion); every record decision needs the object permission first;
- an inactive user, and a user the document does not declare, may do nothing;
- inbound application of a connector account runs as the account's user in ``integration_users``, else as
  the org's ``integration_user`` (each must be a declared user);
- an authenticated operator (a Django login) acts on the record REST endpoints as the user ``operators``
  maps its login name to; an operator the org's policy does not map may do nothing there;
- a user's ``fields`` are the attributes a Flow running as them reads as ``$User.<attribute>`` (text).

This module is pure (no database): :func:`validate_access_document` builds the canonical document,
:class:`AccessPolicy` reads one generation, :meth:`AccessPolicy.principal` resolves a user, and
:func:`object_access`, :func:`field_access`, :func:`record_access` decide. Without any generation an org is
unrestricted (:meth:`Principal.unrestricted`): every decision allows, as before access policies existed.
Every decision carries the authorization-context digest (the generation's digest; ``""`` unrestricted),
which a Flow run can pin (seed 004 section 17.1).
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any

from nexusflow.kernel import canonical_json
from nexusflow.kernel.digests import digest_v2
from nexusflow.kernel.errors import InvalidIdentity, NexusError
from nexusflow.kernel.identity import validate_key

CREATE, READ, EDIT, DELETE = "create", "read", "edit", "delete"
OBJECT_OPS = (CREATE, READ, EDIT, DELETE)
FIELD_OPS = (READ, EDIT)
PRIVATE, PUBLIC_READ, PUBLIC_READ_WRITE = "private", "public_read", "public_read_write"
SHARING_MODELS = (PRIVATE, PUBLIC_READ, PUBLIC_READ_WRITE)
#: Share access levels: a grant (``read``, ``edit``) or a revocation (``none``).
SHARE_READ, SHARE_EDIT, SHARE_NONE = "read", "edit", "none"
SHARE_LEVELS = (SHARE_READ, SHARE_EDIT, SHARE_NONE)

#: What an object permission implies (the canonical document stores the closure).
_OBJECT_IMPLIES = {CREATE: {READ}, READ: set(), EDIT: {READ}, DELETE: {EDIT, READ}}
_FIELD_IMPLIES = {READ: set(), EDIT: {READ}}
_DOCUMENT_KEYS = {"users", "permission_sets", "sharing", "integration_user", "integration_users", "operators"}
#: The longest operator login name (Django's ``User.username``).
OPERATOR_NAME_MAX = 150
_USER_KEYS = {"id", "active", "email", "name", "permission_sets", "fields"}
_SET_KEYS = {"objects", "fields", "view_all", "modify_all"}


class AccessPolicyInvalid(NexusError):
    """An access policy document (or its publication) is refused; the message names the key at fault."""

    code = "access_policy_invalid"
    http_status = 400
    definite = True


#: The policy user a save is made for while it runs (an operator over REST, an account's integration user):
#: the runs it admits record it as their initiating principal (seed 004 section 17.1). ``None``: unknown.
ACTING_PRINCIPAL: contextvars.ContextVar[str | None] = contextvars.ContextVar("records_acting_principal",
                                                                             default=None)


@contextlib.contextmanager
def acting_as(user_id: str | None):
    """Record ``user_id`` as who the saves inside the block are made for (nothing when ``None``)."""
    token = ACTING_PRINCIPAL.set(user_id) if user_id else None
    try:
        yield
    finally:
        if token is not None:
            ACTING_PRINCIPAL.reset(token)


class AccessDenied(NexusError):
    """The calling user may not do this to the record (object permission, field-level security or record
    access under the org's access policy); nothing was written (HTTP 403)."""

    code = "access_denied"
    http_status = 403
    definite = True


def _fail(message: str):
    raise AccessPolicyInvalid(message)


def _key(value: Any, where: str, max_length: int = 80) -> str:
    if not isinstance(value, str):
        _fail(f"{where} must be text")
    try:
        return validate_key(value, field=where, max_length=max_length)
    except InvalidIdentity as exc:
        raise AccessPolicyInvalid(f"{where}: {exc}") from None


def _ops(value: Any, allowed: tuple[str, ...], implies: dict[str, set[str]], where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(op, str) for op in value):
        _fail(f"{where} must be a list of {', '.join(allowed)}")
    unknown = sorted(set(value) - set(allowed))
    if unknown:
        _fail(f"{where}: unknown permission {unknown[0]!r}; one of {', '.join(allowed)}")
    closure = set(value)
    for op in value:
        closure |= implies[op]
    return [op for op in allowed if op in closure]


def validate_access_document(document: Any, *, objects: Mapping[str, Iterable[str]]) -> dict:
    """Return the canonical form of an access policy ``document`` (module docstring) or refuse it.

    Args:
        document: the parsed JSON document.
        objects: ``{object name: its field names}`` of the metadata view; every object and field the
            document names must be among them.

    Returns:
        The canonical document: every key present, users sorted by id, permission lists closed under
        their implications and in a fixed order, object lists sorted.

    Raises:
        AccessPolicyInvalid: not an object; an unknown key; a user without a unique canonical id, a boolean
            ``active`` or text ``email``/``name``; an undeclared permission set; an unknown object, field,
            permission or sharing model; an ``integration_user`` that is not a declared user.

    Seed 004 section 17 (identity and authorization context).
    """
    if not isinstance(document, dict):
        _fail("an access policy is a JSON object")
    unknown = sorted(set(document) - _DOCUMENT_KEYS)
    if unknown:
        _fail(f"unknown key {unknown[0]!r}; one of {', '.join(sorted(_DOCUMENT_KEYS))}")

    def _object(name: Any, where: str) -> str:
        name = _key(name, where)
        if name not in objects:
            _fail(f"{where}: no object {name!r} in the metadata view")
        return name

    raw_sets = document.get("permission_sets", {})
    if not isinstance(raw_sets, dict):
        _fail("permission_sets must be an object of name to permission set")
    sets: dict[str, dict] = {}
    for set_name, body in sorted(raw_sets.items()):
        where = f"permission_sets.{set_name}"
        _key(set_name, "permission set name")
        if not isinstance(body, dict):
            _fail(f"{where} must be an object")
        extra = sorted(set(body) - _SET_KEYS)
        if extra:
            _fail(f"unknown key {where}.{extra[0]}; one of {', '.join(sorted(_SET_KEYS))}")
        granted = body.get("objects", {})
        if not isinstance(granted, dict):
            _fail(f"{where}.objects must be an object of object name to permissions")
        object_perms = {_object(name, f"{where}.objects"): _ops(ops, OBJECT_OPS, _OBJECT_IMPLIES,
                                                                 f"{where}.objects.{name}")
                        for name, ops in granted.items()}
        raw_fields = body.get("fields", {})
        if not isinstance(raw_fields, dict):
            _fail(f"{where}.fields must be an object of object name to fields")
        field_perms: dict[str, dict[str, list[str]]] = {}
        for name, per_field in raw_fields.items():
            name = _object(name, f"{where}.fields")
            if not isinstance(per_field, dict):
                _fail(f"{where}.fields.{name} must be an object of field name to permissions")
            field_perms[name] = {}
            for field_name, ops in per_field.items():
                if field_name not in set(objects[name]):
                    _fail(f"{where}.fields.{name}: no field {field_name!r} on {name}")
                field_perms[name][field_name] = _ops(ops, FIELD_OPS, _FIELD_IMPLIES,
                                                     f"{where}.fields.{name}.{field_name}")
        lists = {}
        for key in ("view_all", "modify_all"):
            value = body.get(key, [])
            if not isinstance(value, list):
                _fail(f"{where}.{key} must be a list of object names")
            lists[key] = sorted({_object(name, f"{where}.{key}") for name in value})
        sets[set_name] = {"objects": object_perms, "fields": field_perms, **lists}

    raw_users = document.get("users", [])
    if not isinstance(raw_users, list):
        _fail("users must be a list of users")
    users = []
    for index, user in enumerate(raw_users):
        where = f"users[{index}]"
        if not isinstance(user, dict):
            _fail(f"{where} must be an object")
        extra = sorted(set(user) - _USER_KEYS)
        if extra:
            _fail(f"unknown key {where}.{extra[0]}; one of {', '.join(sorted(_USER_KEYS))}")
        user_id = _key(user.get("id"), f"{where}.id", max_length=64)
        active = user.get("active", True)
        if not isinstance(active, bool):
            _fail(f"{where}.active must be true or false")
        text = {}
        for key in ("email", "name"):
            value = user.get(key, "")
            if not isinstance(value, str):
                _fail(f"{where}.{key} must be text")
            text[key] = value
        attributes = user.get("fields", {})
        if not isinstance(attributes, dict) or not all(isinstance(k, str) and k and isinstance(v, str)
                                                       for k, v in attributes.items()):
            _fail(f"{where}.fields must be an object of attribute name to text")
        names = user.get("permission_sets", [])
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            _fail(f"{where}.permission_sets must be a list of permission set names")
        missing = sorted(set(names) - set(sets))
        if missing:
            _fail(f"{where}.permission_sets: no permission set {missing[0]!r}")
        users.append({"id": user_id, "active": active, **text, "permission_sets": sorted(set(names)),
                      "fields": dict(sorted(attributes.items()))})
    ids = [u["id"] for u in users]
    if len(set(ids)) != len(ids):
        _fail(f"users: user {sorted(i for i in ids if ids.count(i) > 1)[0]!r} is declared twice")
    users.sort(key=lambda u: u["id"])

    raw_sharing = document.get("sharing", {})
    if not isinstance(raw_sharing, dict):
        _fail("sharing must be an object of object name to sharing model")
    sharing = {}
    for name, model in raw_sharing.items():
        name = _object(name, "sharing")
        if model not in SHARING_MODELS:
            _fail(f"sharing.{name}: {model!r} is not one of {', '.join(SHARING_MODELS)}")
        sharing[name] = model

    integration_user = document.get("integration_user")
    if integration_user is not None and integration_user not in ids:
        _fail(f"integration_user: {integration_user!r} is not a declared user")
    raw_accounts = document.get("integration_users", {})
    if not isinstance(raw_accounts, dict):
        _fail("integration_users must be an object of connector account key to user id")
    accounts = {}
    for account_key, user_id in sorted(raw_accounts.items()):
        account_key = _key(account_key, "integration_users account key")
        if user_id not in ids:
            _fail(f"integration_users.{account_key}: {user_id!r} is not a declared user")
        accounts[account_key] = user_id
    raw_operators = document.get("operators", {})
    if not isinstance(raw_operators, dict):
        _fail("operators must be an object of operator login name to user id")
    operators = {}
    for login, user_id in sorted(raw_operators.items()):
        if not isinstance(login, str) or not login.strip() or len(login) > OPERATOR_NAME_MAX:
            _fail(f"operators: {login!r} is not an operator login name (1..{OPERATOR_NAME_MAX} characters)")
        if user_id not in ids:
            _fail(f"operators.{login}: {user_id!r} is not a declared user")
        operators[login] = user_id
    canonical = {"users": users, "permission_sets": sets, "sharing": sharing, "integration_user": integration_user,
                 "integration_users": accounts}
    if operators:  # only when given, so documents without it keep their digest
        canonical["operators"] = operators
    return canonical


def access_document_digest(org_id: str, canonical: dict) -> str:
    """The authorization-context digest of an org's canonical access document (64 hex)."""
    return digest_v2("records.access-policy", [("org", org_id),
                                               ("document", canonical_json.dumps(canonical))]).hexdigest


@dataclass(frozen=True)
class Principal:
    """One user as an access policy sees them: their aggregated permissions (or no restriction at all).

    ``restricted`` False: the org has no access policy (everything is allowed). ``known`` False: the
    policy does not declare the user (nothing is allowed).
    """

    user_id: str
    restricted: bool
    known: bool = False
    active: bool = False
    objects: Mapping[str, frozenset[str]] = dataclass_field(default_factory=dict)
    fields: Mapping[str, Mapping[str, frozenset[str]]] = dataclass_field(default_factory=dict)
    view_all: frozenset[str] = frozenset()
    modify_all: frozenset[str] = frozenset()
    sharing: Mapping[str, str] = dataclass_field(default_factory=dict)
    email: str = ""
    name: str = ""
    #: The generation digest the principal was resolved under (``""`` unrestricted).
    context_digest: str = ""
    generation: int = 0

    @classmethod
    def unrestricted(cls, user_id: str) -> Principal:
        """A user of an org without an access policy: every decision allows."""
        return cls(user_id=user_id, restricted=False)


@dataclass(frozen=True)
class AccessPolicy:
    """One generation of an org's access policy, read (see the module docstring for the document)."""

    org_id: str
    generation: int
    digest: str
    document: Mapping[str, Any]

    def integration_user(self, account_key: str | None = None) -> str | None:
        """The user inbound application of ``account_key`` runs as: the account's, else the org's, else ``None``."""
        accounts = self.document.get("integration_users") or {}
        return accounts.get(account_key) if account_key in accounts else self.document.get("integration_user")

    def operator_user(self, login: str) -> str | None:
        """The declared user an authenticated operator (its login name) acts as over REST, or ``None``."""
        return (self.document.get("operators") or {}).get(login)

    def user(self, user_id: str) -> dict | None:
        return next((u for u in self.document["users"] if u["id"] == user_id), None)

    def principal(self, user_id: str) -> Principal:
        """Resolve ``user_id``: the union of their permission sets, the org-wide defaults, their state."""
        user = self.user(user_id)
        base = {"user_id": user_id, "restricted": True, "context_digest": self.digest,
                "generation": self.generation, "sharing": dict(self.document["sharing"])}
        if user is None:
            return Principal(**base)
        objects: dict[str, set[str]] = {}
        fields: dict[str, dict[str, set[str]]] = {}
        view_all: set[str] = set()
        modify_all: set[str] = set()
        for name in user["permission_sets"]:
            body = self.document["permission_sets"][name]
            for obj, ops in body["objects"].items():
                objects.setdefault(obj, set()).update(ops)
            for obj, per_field in body["fields"].items():
                for field_name, ops in per_field.items():
                    fields.setdefault(obj, {}).setdefault(field_name, set()).update(ops)
            view_all.update(body["view_all"])
            modify_all.update(body["modify_all"])
        for obj in modify_all:  # modify all: every object permission on the object
            objects.setdefault(obj, set()).update(OBJECT_OPS)
        for obj in view_all:
            objects.setdefault(obj, set()).add(READ)
        return Principal(**base, known=True, active=user["active"],
                         objects={k: frozenset(v) for k, v in objects.items()},
                         fields={k: {f: frozenset(o) for f, o in v.items()} for k, v in fields.items()},
                         view_all=frozenset(view_all | modify_all), modify_all=frozenset(modify_all),
                         email=user["email"], name=user["name"])


@dataclass(frozen=True)
class AccessDecision:
    """One decision: may ``user_id`` do ``op`` on ``object_name`` (a record of it); ``basis`` says why.

    ``basis`` is one of ``no_policy``, ``unknown_user``, ``inactive_user``, ``object_denied``,
    ``object_granted``, ``modify_all``, ``view_all``, ``owner``, ``org_wide_default``, ``share``,
    ``no_record_access``.
    """

    allowed: bool
    basis: str
    user_id: str
    object_name: str
    op: str
    context_digest: str


@dataclass(frozen=True)
class FieldDecision:
    """Which of the asked fields ``user_id`` may ``op`` (``read`` / ``edit``) on ``object_name``."""

    allowed: tuple[str, ...]
    denied: tuple[str, ...]
    basis: str
    user_id: str
    object_name: str
    op: str
    context_digest: str


def _check_op(op: str, ops: tuple[str, ...]) -> None:
    if op not in ops:
        raise ValueError(f"unknown operation {op!r}; one of {', '.join(ops)}")


def _decision(principal: Principal, object_name: str, op: str, allowed: bool, basis: str) -> AccessDecision:
    return AccessDecision(allowed, basis, principal.user_id, object_name, op, principal.context_digest)


def _gate(principal: Principal) -> str | None:
    """The basis of a decision made before looking at permissions, if any."""
    if not principal.restricted:
        return "no_policy"
    if not principal.known:
        return "unknown_user"
    if not principal.active:
        return "inactive_user"
    return None


def object_access(principal: Principal, object_name: str, op: str) -> AccessDecision:
    """Decide whether ``principal`` may ``op`` (create/read/edit/delete) records of ``object_name`` at all.

    Raises:
        ValueError: ``op`` is not an object operation.
    """
    _check_op(op, OBJECT_OPS)
    gate = _gate(principal)
    if gate is not None:
        return _decision(principal, object_name, op, gate == "no_policy", gate)
    granted = op in principal.objects.get(object_name, frozenset())
    return _decision(principal, object_name, op, granted, "object_granted" if granted else "object_denied")


def field_access(principal: Principal, object_name: str, fields: Iterable[str], op: str) -> FieldDecision:
    """Split ``fields`` of ``object_name`` into those ``principal`` may ``op`` (read/edit) and the others.

    A field needs the object permission (``read``, or ``edit`` for an edit) and a permission set granting
    the field ``op``. Unrestricted: every field is allowed.

    Raises:
        ValueError: ``op`` is not a field operation.
    """
    _check_op(op, FIELD_OPS)
    names = sorted(set(fields))
    gate = _gate(principal)
    if gate is None and op not in principal.objects.get(object_name, frozenset()):
        gate = "object_denied"
    if gate is not None:
        allowed = gate == "no_policy"
        return FieldDecision(tuple(names) if allowed else (), () if allowed else tuple(names), gate,
                             principal.user_id, object_name, op, principal.context_digest)
    granted = principal.fields.get(object_name, {})
    allowed_fields = tuple(n for n in names if op in granted.get(n, frozenset()))
    denied = tuple(n for n in names if n not in allowed_fields)
    return FieldDecision(allowed_fields, denied, "field_level_security", principal.user_id, object_name, op,
                         principal.context_digest)


def record_access(principal: Principal, record: Any, op: str, *, share: str | None = None) -> AccessDecision:
    """Decide whether ``principal`` may ``op`` (read/edit/delete) one record.

    Args:
        record: anything with ``object_name`` and ``owner_id`` (``None``: the record has no owner).
        share: the access level of the share in force from the record to this user (``read``, ``edit``),
            or ``None`` / ``none`` for no share.

    Order: the user's state, the object permission, ``modify_all``, ``view_all`` (read), ownership, the
    org-wide default (``public_read``: read; ``public_read_write``: read and edit), the share. Deletion
    needs ownership or ``modify_all``. ``create`` is the object permission alone.

    Raises:
        ValueError: ``op`` is not an object operation.
    """
    object_name = record.object_name
    obj = object_access(principal, object_name, op)
    if not obj.allowed or not principal.restricted or op == CREATE:
        return obj
    if object_name in principal.modify_all:
        return _decision(principal, object_name, op, True, "modify_all")
    if op == READ and object_name in principal.view_all:
        return _decision(principal, object_name, op, True, "view_all")
    if record.owner_id is not None and record.owner_id == principal.user_id:
        return _decision(principal, object_name, op, True, "owner")
    default = principal.sharing.get(object_name, PRIVATE)
    if (op == READ and default in (PUBLIC_READ, PUBLIC_READ_WRITE)) or (op == EDIT and default == PUBLIC_READ_WRITE):
        return _decision(principal, object_name, op, True, "org_wide_default")
    if (op == READ and share in (SHARE_READ, SHARE_EDIT)) or (op == EDIT and share == SHARE_EDIT):
        return _decision(principal, object_name, op, True, "share")
    return _decision(principal, object_name, op, False, "no_record_access")


def access_document_from_view(view: Any, *, system_users: Iterable[str] = ()) -> dict:
    """A starting access policy equal to what an org without one may do (for ``records access draft``).

    Every object: every object permission and ``modify_all`` (deletion without owners), sharing
    ``public_read_write``; every field without ``read_access``: read and edit for everyone (permission set
    ``all``); a field with ``read_access``: read and edit only for the users it lists (permission set
    ``fields-<user>``). Users: the view's declared users (their active flag and ``$User`` fields), every
    user a ``read_access`` list names, and ``system_users``.

    Args:
        view: a :class:`nexusflow.records.metadata.MetadataView`.
        system_users: user ids the runtime acts as (the system context user) to declare as well.

    Returns:
        A document :func:`validate_access_document` accepts (not yet canonical).
    """
    open_fields: dict[str, dict[str, list[str]]] = {}
    listed: dict[str, dict[str, dict[str, list[str]]]] = {}
    for name, definition in sorted(view.objects.items()):
        for field_name, field in sorted(definition.fields.items()):
            if field.read_access is None:
                open_fields.setdefault(name, {})[field_name] = [READ, EDIT]
            else:
                for user_id in field.read_access:
                    listed.setdefault(user_id, {}).setdefault(name, {})[field_name] = [READ, EDIT]
    sets = {"all": {"objects": {name: list(OBJECT_OPS) for name in sorted(view.objects)}, "fields": open_fields,
                    "view_all": [], "modify_all": sorted(view.objects)}}
    for user_id, fields in sorted(listed.items()):
        sets[f"fields-{user_id}"] = {"objects": {}, "fields": fields, "view_all": [], "modify_all": []}
    user_ids = sorted(set(view.users) | set(listed) | set(system_users))
    users = []
    for user_id in user_ids:
        declared = view.users.get(user_id)
        users.append({"id": user_id, "active": declared.active if declared is not None else True,
                      "email": "", "name": "",
                      "permission_sets": ["all"] + ([f"fields-{user_id}"] if user_id in listed else []),
                      "fields": dict(declared.fields) if declared is not None else {}})
    return {"users": users, "permission_sets": sets,
            "sharing": {name: PUBLIC_READ_WRITE for name in sorted(view.objects)},
            "integration_user": None, "integration_users": {}}
