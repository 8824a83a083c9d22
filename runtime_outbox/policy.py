"""The versioned runtime policy: admission, pressure, ingress-shedding and retry bounds (seed 004 sections
16.1-16.3; issue "Admission lanes, fairness and backpressure", item 1).

A policy is authored as immutable generations (:class:`~runtime_outbox.models.RuntimePolicyGeneration`,
``manage.py runtime_policy publish``), like the other configuration: one chain for the environment (scope
``*``) and one per org. The policy in force for an org is the built-in defaults (the settings of the same
names, so a deployment without a published policy behaves as before), overlaid by the environment's latest
generation, overlaid by the org's latest generation.

Document (every section and key optional; unknown keys are refused)::

    {"pressure": {"active_statements": 32, "connection_share": 0.8, "read_seconds": 1.0,
                  "lock_waits": 16, "expired_leases": 16},                                   # environment only
     "ingress": {"shed_active_statements": 64, "shed_connection_share": 0.95,
                 "retry_after_seconds": 5, "shed_queue_age_seconds": 600},                  # environment only
     "retries": {"max_attempts": 5, "retry_base_seconds": 2.0, "max_per_minute": 600},
     "plans": {"<flow api name>": {"max_attempts": 3, "max_active": 8}},
     "plan_bounds": {"atomic_max_reads": 10, "atomic_max_writes": 10},
     "execution": {"max_fan_out": 200},
     "queues": {"durable_mutation": {"max_active": 16}},
     "resource_classes": {"<object api name>": {"max_active": 4}}}

- ``pressure``: new durable mutation work (a Flow step claim) waits while this account runs at least
  ``active_statements`` statements on the database or holds ``connection_share`` of ``max_connections``,
  while ``lock_waits`` transactions wait for a row lock, or while ``expired_leases`` step leases expired
  and are not yet recovered (:mod:`nexusflow.kernel.pressure`); read at most every ``read_seconds``.
- ``ingress``: at the higher ``shed_*`` bounds the webhook ingress sheds: it answers 503 ``ingress_shed``
  with ``Retry-After: retry_after_seconds`` and admits nothing, so nothing accepted is lost and the provider
  redelivers later. Below them it answers as always. ``shed_queue_age_seconds`` (no default: off) sheds
  one org's ingress alone while its oldest due durable work (a Flow run, an inbound execution) has waited
  that long, so a tenant whose backlog outgrows the workers gets backpressure and the others do not
  (:func:`nexusflow.kernel.pressure.ingress_queue_admission`).
- ``retries`` / ``plans``: attempts a Flow step gets before its run fails ``retry_exhausted`` (a plan's own
  bound wins), and the first retry's delay (seconds; doubled per attempt, capped, jittered);
  ``max_per_minute``: the retry budget of one org: once its steps started this many retries (attempts after
  the first) in the last 60 seconds of the database clock, its claim rounds take first attempts only, so a
  retry storm is contained at this rate while new work keeps moving (no budget by default).
- ``execution``: ``max_fan_out``, the largest collection a Flow's loop or Get/Delete Records may handle in
  one step or before-save interview (a larger one fails the run ``flow_budget_exhausted`` rather than
  running unbounded); default ``NEXUS_FLOW_MAX_FAN_OUT`` (200). A run-time bound: changing it recompiles
  nothing.
- ``queues`` / ``plans.<flow>.max_active`` / ``resource_classes``: admission budgets of the durable mutation
  queue class (seed 004 sections 16.1-16.2): at most ``max_active`` Flow runs of one org executing a step at
  once (``Running``), of one plan (Flow) of the org, or of the org's Flows triggered by one object (the
  resource class). A claim round skips an org, plan or object at its budget, so the others take the worker
  (:func:`nexusflow.flows.services.claim.flow_step_claim_batch`). No budget is set by default: a number is
  established by benchmark evidence and published (seed 004 section 16.3). The other queue classes
  (dependency wakeups, effect completions, recovery) are the reserved share: they never ask for admission.
- ``plan_bounds``: the reads and writes a Bounded Atomic plan may declare (plan eligibility, seed 004
  section 9.2). A generation that changes them for an org recompiles that org's active Flows (the
  ``policy published`` hook the flows app registers, :func:`register_policy_published`).

The policy is read through a per-process cache refreshed at most every ``NEXUS_POLICY_READ_SECONDS``
(default 2; 0: every read), so a published generation applies within that time, without a restart.
"""
from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from django.db import IntegrityError, transaction

from nexusflow.kernel import canonical_json
from nexusflow.kernel.clock import db_now
from nexusflow.kernel.digests import digest_v2
from nexusflow.kernel.errors import NexusError
from nexusflow.kernel.models import insert
from nexusflow.kernel.pressure import PressureBounds, pressure_bounds
from nexusflow.kernel.tuning import setting_number

from .models import RuntimePolicyGeneration

#: The scope of the environment's chain (every org).
ENVIRONMENT = "*"
#: The version a deployment without any published generation reports.
BUILTIN_VERSION = "runtime.policy.builtin"
#: Sections only the environment's chain may carry (they bound shared resources: the database, the ingress).
ENVIRONMENT_SECTIONS = frozenset({"pressure", "ingress"})
_SCHEMA: dict[str, dict[str, tuple[type, float, float]]] = {
    # section -> key -> (type, minimum, maximum)
    "pressure": {"active_statements": (int, 1, 100_000), "connection_share": (float, 0.01, 1.0),
                 "read_seconds": (float, 0.0, 60.0), "lock_waits": (int, 1, 100_000),
                 "expired_leases": (int, 1, 100_000)},
    "ingress": {"shed_active_statements": (int, 1, 100_000), "shed_connection_share": (float, 0.01, 1.0),
                "retry_after_seconds": (int, 1, 3600), "shed_queue_age_seconds": (int, 1, 30 * 86400)},
    "retries": {"max_attempts": (int, 1, 100), "retry_base_seconds": (float, 0.0, 3600.0),
                "max_per_minute": (int, 1, 1_000_000)},
    "plan_bounds": {"atomic_max_reads": (int, 1, 1000), "atomic_max_writes": (int, 1, 1000)},
    "execution": {"max_fan_out": (int, 1, 100_000)},
}
_PLAN_KEYS = {"max_attempts": (int, 1, 100), "max_active": (int, 1, 100_000)}
#: Queue classes whose admission a budget bounds (seed 004 section 16.1; the others are the reserved share).
QUEUE_CLASSES = {"durable_mutation": {"max_active": (int, 1, 100_000)}}
_RESOURCE_KEYS = {"max_active": (int, 1, 100_000)}
#: Sections keyed by a name (a Flow, a queue class, an object), each naming its keys.
_NAMED_SECTIONS = ("plans", "queues", "resource_classes")
#: A plan is named by its Flow's API name.
FLOW_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,79}")


class RuntimePolicyInvalid(NexusError):
    """A runtime policy document is malformed (names the key): nothing is published."""

    code = "runtime_policy_invalid"
    definite = True
    http_status = 400


@dataclass(frozen=True)
class IngressBounds:
    """When the ingress sheds: ``shed_active_statements`` (count), ``shed_connection_share`` (0..1], and the
    ``retry_after_seconds`` it answers with."""

    shed_active_statements: int
    shed_connection_share: float
    retry_after_seconds: int
    #: Seconds an org's oldest due durable work may wait before its ingress sheds (``None``: never).
    shed_queue_age_seconds: int | None = None

    def as_pressure(self, read_seconds: float) -> PressureBounds:
        """The ingress's bounds as pressure bounds (lock waits never shed ingress: admission takes no row lock
        a mutation holds)."""
        return PressureBounds(self.shed_active_statements, self.shed_connection_share, read_seconds,
                              lock_waits=10**9, expired_leases=10**9)


class AdmissionBudget(NamedTuple):
    """Running Flow runs one org may have at once: in all (``org``, ``None``: unbounded), per Flow API name
    (``plans``) and per trigger object (``objects``)."""

    org: int | None
    plans: dict[str, int]
    objects: dict[str, int]


@dataclass(frozen=True)
class RuntimePolicy:
    """The policy in force for one org (module docstring): ``version`` names the generations it is built from
    (``runtime.policy.builtin``, or ``env.<n>`` / ``org.<m>`` joined with ``+``)."""

    version: str
    pressure: PressureBounds
    ingress: IngressBounds
    max_attempts_default: int
    retry_base_seconds: float
    #: Retries one org's steps may start per minute (``None``: unbounded).
    retries_per_minute: int | None = None
    #: Flow API name -> ``{"max_attempts": n, "max_active": n}`` (either optional).
    plans: dict[str, dict[str, int]] = field(default_factory=dict)
    #: ``{"atomic_max_reads", "atomic_max_writes"}``: the plan-eligibility bounds (``{}``: the compiler's own).
    plan_bounds: dict[str, int] = field(default_factory=dict)
    #: The largest collection a loop or record lookup may handle (``execution.max_fan_out``).
    max_fan_out: int = 200
    #: Queue class -> ``{"max_active": n}`` (module docstring).
    queues: dict[str, dict[str, int]] = field(default_factory=dict)
    #: Object API name -> ``{"max_active": n}``: the resource-class budgets of the org's Flows by trigger object.
    resource_classes: dict[str, dict[str, int]] = field(default_factory=dict)

    def max_attempts(self, flow_api_name: str | None = None) -> int:
        """Attempts a step of ``flow_api_name`` gets (its plan's bound, else the policy's)."""
        return self.plans.get(flow_api_name or "", {}).get("max_attempts", self.max_attempts_default)

    def admission_budget(self) -> AdmissionBudget | None:
        """The durable-mutation admission budget of the org (``None``: no budget applies)."""
        org = self.queues.get("durable_mutation", {}).get("max_active")
        plans = {name: b["max_active"] for name, b in self.plans.items() if "max_active" in b}
        objects = {name: b["max_active"] for name, b in self.resource_classes.items()}
        if org is None and not plans and not objects:
            return None
        return AdmissionBudget(org, plans, objects)


    def as_json(self) -> dict[str, Any]:
        return {"version": self.version,
                "pressure": {"active_statements": self.pressure.active_statements,
                             "connection_share": self.pressure.connection_share,
                             "read_seconds": self.pressure.read_seconds,
                             "lock_waits": self.pressure.lock_waits,
                             "expired_leases": self.pressure.expired_leases},
                "ingress": {"shed_active_statements": self.ingress.shed_active_statements,
                            "shed_connection_share": self.ingress.shed_connection_share,
                            "retry_after_seconds": self.ingress.retry_after_seconds,
                            **({} if self.ingress.shed_queue_age_seconds is None
                               else {"shed_queue_age_seconds": self.ingress.shed_queue_age_seconds})},
                "retries": {"max_attempts": self.max_attempts_default,
                            "retry_base_seconds": self.retry_base_seconds,
                            **({} if self.retries_per_minute is None else {"max_per_minute": self.retries_per_minute})},
                "plans": {name: dict(sorted(bounds.items())) for name, bounds in sorted(self.plans.items())},
                "plan_bounds": dict(sorted(self.plan_bounds.items())),
                "execution": {"max_fan_out": self.max_fan_out},
                "queues": {name: dict(sorted(bounds.items())) for name, bounds in sorted(self.queues.items())},
                "resource_classes": {name: dict(sorted(bounds.items()))
                                     for name, bounds in sorted(self.resource_classes.items())}}


def _number(value: Any, kind: type, low: float, high: float, where: str) -> int | float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        raise RuntimePolicyInvalid(f"{where} must be {'an integer' if kind is int else 'a number'}")
    if not low <= value <= high:
        raise RuntimePolicyInvalid(f"{where} must be between {low:g} and {high:g}, got {value}")
    return kind(value)


def validate_policy_document(document: Any, *, scope: str) -> dict[str, Any]:
    """The canonical form of ``document`` for ``scope`` (``*`` or an org id).

    Raises:
        RuntimePolicyInvalid: not an object, an unknown section or key, a value of the wrong type or out of
            range, an environment-only section in an org's document, an invalid plan name, or an empty
            document.
    """
    if not isinstance(document, dict) or not document:
        raise RuntimePolicyInvalid("a runtime policy is a non-empty JSON object")
    out: dict[str, Any] = {}
    for section, body in document.items():
        if section not in _SCHEMA and section not in _NAMED_SECTIONS:
            raise RuntimePolicyInvalid(f"unknown section {section!r}; sections: "
                                       f"{', '.join(sorted([*_SCHEMA, *_NAMED_SECTIONS]))}")
        if section in ENVIRONMENT_SECTIONS and scope != ENVIRONMENT:
            raise RuntimePolicyInvalid(f"{section} bounds a shared resource: only the environment policy "
                                       f"(--scope '*') sets it")
        if not isinstance(body, dict) or not body:
            raise RuntimePolicyInvalid(f"{section} is a non-empty JSON object")
        if section in _NAMED_SECTIONS:
            out[section] = _named_section(section, body)
            continue
        unknown = sorted(set(body) - set(_SCHEMA[section]))
        if unknown:
            raise RuntimePolicyInvalid(f"unknown key {section}.{unknown[0]}; keys: {', '.join(_SCHEMA[section])}")
        out[section] = {k: _number(v, *_SCHEMA[section][k], f"{section}.{k}") for k, v in body.items()}
    return out


def _named_section(section: str, body: dict) -> dict[str, dict[str, int | float]]:
    """A section keyed by Flow API name (``plans``), queue class (``queues``) or object API name
    (``resource_classes``), each name's bounds checked against its keys."""
    named = {}
    for name, bounds in body.items():
        if section == "queues":
            if name not in QUEUE_CLASSES:
                raise RuntimePolicyInvalid(f"queues: {name!r} is not a budgeted queue class; classes: "
                                           f"{', '.join(QUEUE_CLASSES)}")
            keys = QUEUE_CLASSES[name]
        else:
            if not isinstance(name, str) or not FLOW_NAME.fullmatch(name):
                raise RuntimePolicyInvalid(f"{section}: {name!r} is not "
                                           f"{'a Flow' if section == 'plans' else 'an object'} API name")
            keys = _PLAN_KEYS if section == "plans" else _RESOURCE_KEYS
        if not isinstance(bounds, dict) or not bounds or set(bounds) - set(keys):
            raise RuntimePolicyInvalid(f"{section}.{name} takes {', '.join(keys)}")
        named[name] = {k: _number(v, *keys[k], f"{section}.{name}.{k}") for k, v in bounds.items()}
    return named


def policy_version_of(scope: str, generation: int) -> str:
    """The name of one generation in a policy version (``env.3``, ``org.2``)."""
    return f"{'env' if scope == ENVIRONMENT else 'org'}.{generation}"


class Published(NamedTuple):
    """What a publish did: the ``generation`` in force for the scope, whether this call ``created`` it, and
    what the registered hooks did with it (``effects``: e.g. the Flows recompiled under new plan bounds)."""

    generation: RuntimePolicyGeneration
    created: bool
    effects: list


#: ``hook(*, scope) -> list[dict]``, called once a new generation of ``scope`` committed.
_PUBLISHED_HOOKS: list[Callable[..., list]] = []


def register_policy_published(hook: Callable[..., list]) -> None:
    """Call ``hook(scope=...)`` after each new generation commits (idempotent registration). The flows app
    recompiles the active Flows whose plan bounds changed (:mod:`nexusflow.flows.services.policy_recompile`).
    """
    if hook not in _PUBLISHED_HOOKS:
        _PUBLISHED_HOOKS.append(hook)


def runtime_policy_publish(*, scope: str, document: Any, authored_by: str, reason: str) -> Published:
    """Publish ``document`` as the next generation of ``scope``'s chain and run the published hooks.

    A document equal to the scope's latest generation returns that generation (``created`` False): a
    retried publish writes nothing and runs no hook. Two concurrent publishes of one scope get distinct
    generation numbers. Inside a caller's transaction the hooks run once it commits (``effects`` empty).

    Raises:
        RuntimePolicyInvalid: see :func:`validate_policy_document`; an empty ``authored_by`` or ``reason``.
    """
    from nexusflow.kernel.errors import InvalidIdentity
    from nexusflow.kernel.identity import validate_key

    if scope != ENVIRONMENT:
        try:
            validate_key(scope, field="org", max_length=64)
        except InvalidIdentity as exc:
            raise RuntimePolicyInvalid(str(exc)) from None
    if not authored_by.strip() or not reason.strip():
        raise RuntimePolicyInvalid("a policy generation names who authored it and why")
    canonical = validate_policy_document(document, scope=scope)
    digest = digest_v2("runtime.policy", [("scope", scope), ("document", canonical_json.dumps(canonical))]).hexdigest
    for _ in range(3):
        latest = RuntimePolicyGeneration.objects.filter(scope=scope).order_by("-generation").first()
        if latest is not None and latest.digest == digest:
            return Published(latest, False, [])
        number = (latest.generation if latest else 0) + 1
        try:
            with transaction.atomic():
                row = insert(RuntimePolicyGeneration, scope=scope, generation=number, document=canonical,
                             digest=digest, policy_version=policy_version_of(scope, number),
                             authored_by=authored_by[:120], reason=reason[:240], created_at=db_now())
        except IntegrityError:
            continue  # a concurrent publish took this number (or published the same document): read again
        policy_cache_clear()
        return Published(row, True, _published(scope))
    raise RuntimePolicyInvalid(f"policy scope {scope} is being published concurrently; retry")


def _published(scope: str) -> list:
    if transaction.get_connection().in_atomic_block:
        transaction.on_commit(lambda: [hook(scope=scope) for hook in list(_PUBLISHED_HOOKS)], robust=True)
        return []
    return [effect for hook in list(_PUBLISHED_HOOKS) for effect in hook(scope=scope)]


def _defaults() -> dict[str, Any]:
    pressure = pressure_bounds()
    return {
        "pressure": {"active_statements": pressure.active_statements,
                     "connection_share": pressure.connection_share, "read_seconds": pressure.read_seconds,
                     "lock_waits": pressure.lock_waits, "expired_leases": pressure.expired_leases},
        "ingress": {"shed_active_statements": int(setting_number("NEXUS_INGRESS_SHED_ACTIVE_STATEMENTS",
                                                                 2 * pressure.active_statements)),
                    "shed_connection_share": setting_number("NEXUS_INGRESS_SHED_CONNECTION_SHARE", 0.95),
                    "retry_after_seconds": int(setting_number("NEXUS_INGRESS_RETRY_AFTER_SECONDS", 5))},
        "retries": {"max_attempts": int(setting_number("NEXUS_FLOW_MAX_ATTEMPTS", 5)),
                    "retry_base_seconds": setting_number("NEXUS_FLOW_RETRY_BASE_SECONDS", 2.0)},
        "plans": {},
        "plan_bounds": {},
        "execution": {"max_fan_out": int(setting_number("NEXUS_FLOW_MAX_FAN_OUT", 200))},
        "queues": {},
        "resource_classes": {},
    }


#: scope -> (read at, the scope's latest generation's version and document, or None)
_CACHE: dict[str, tuple[float, tuple[str, dict] | None]] = {}


def policy_cache_clear() -> None:
    """Forget the cached generations of this process (the next read goes to the database)."""
    _CACHE.clear()


def _latest(scope: str) -> tuple[str, dict] | None:
    ttl = setting_number("NEXUS_POLICY_READ_SECONDS", 2.0)
    now = time.monotonic()
    cached = _CACHE.get(scope)
    if cached is not None and now - cached[0] < ttl:
        return cached[1]
    row = (RuntimePolicyGeneration.objects.filter(scope=scope).order_by("-generation")
           .values_list("policy_version", "document").first())
    _CACHE[scope] = (now, row)
    return row


def runtime_policy(org_id: str | None = None) -> RuntimePolicy:
    """The policy in force for ``org_id`` (``None``: the environment's): the built-in defaults (read now)
    overlaid by the latest generations, read through the process cache (module docstring)."""
    key = org_id or ENVIRONMENT
    merged = _defaults()
    versions = []
    for scope in ([ENVIRONMENT] if key == ENVIRONMENT else [ENVIRONMENT, key]):
        latest = _latest(scope)
        if latest is None:
            continue
        version, document = latest
        versions.append(version)
        for section, body in document.items():
            if section in _NAMED_SECTIONS:  # a name's bounds merge key by key (an org's plan keeps env keys)
                merged[section] = {**merged[section], **{name: {**merged[section].get(name, {}), **bounds}
                                                         for name, bounds in body.items()}}
            else:
                merged[section] = {**merged[section], **body}
    return RuntimePolicy(
        version="+".join(versions) or BUILTIN_VERSION,
        pressure=PressureBounds(**merged["pressure"]),
        ingress=IngressBounds(**merged["ingress"]),
        max_attempts_default=merged["retries"]["max_attempts"],
        retry_base_seconds=merged["retries"]["retry_base_seconds"],
        retries_per_minute=merged["retries"].get("max_per_minute"),
        plans=merged["plans"], plan_bounds=dict(merged["plan_bounds"]), queues=merged["queues"],
        max_fan_out=merged["execution"]["max_fan_out"],
        resource_classes=merged["resource_classes"])
