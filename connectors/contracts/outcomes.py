"""Provider outcome classification: the closed L0 interpretation of a pack's callout profile.

Seed 003 "State machines" (RemoteEffect: ``dispatching -> prepared`` only on
proven no effect; ``uncertain -> prepared`` only with proof or the frozen
exact-repeat idempotency contract) and "Transaction and crash rules".

A callout profile (L1, ``packs/<pack>/pack.json``) declares which provider
statuses mean what; L0 knows only these closed classes:

``confirmed``
    2xx: the provider performed the request (fixed by L0, not declarable).
``refused``
    the provider proves it performed nothing and will not on a repeat
    (validation, authorization, "already exists" without creation):
    terminal ``no_effect``.
``not_performed``
    the provider proves it performed nothing and a later Attempt may
    succeed (rate limit, idempotency key busy): ``prepared`` again while the
    frozen retry policy has Attempts left, terminal ``no_effect`` after.
``ambiguous``
    the request may have been performed (5xx after send): ``uncertain``.

Transport facts are fixed by L0 and never declarable: a refused TCP connect
sent no byte (``not_performed``); a timeout or reset after the request was
written is ``ambiguous``. A status the profile does not list is ambiguous
and parked for an operator (``unclassified_response``): an unknown answer is
never guessed to be safe.

Profile keys read here::

    "outcomes": {"refused": [400, ...], "not_performed": [429, ...], "ambiguous": [500, ...]},
    "retry": {"max_attempts": 8},
    "idempotency": {"header": "Idempotency-Key", "replay_safe": true},  # or {"replay_safe": false}
    "timeout_seconds": 5,                                              # optional, (0, 300], default 10
    "rate_limit": {"statuses": [429],                                  # optional; default [429]
                   "daily": {"header": "X-RateLimit-Scope", "value": "daily", "reset_hour_utc": 0}}

A rate-limit answer (:func:`rate_limit`) must be a ``not_performed`` status:
it performed nothing, pauses the credential's dispatch lane for its
``Retry-After`` (or, when its ``daily.header`` carries ``daily.value``, until
the next ``reset_hour_utc`` o'clock UTC) and never counts toward
``retry.max_attempts`` (seed 004 section 16; issue 22 item 3).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

CONFIRMED = "confirmed"
REFUSED = "refused"
NOT_PERFORMED = "not_performed"
AMBIGUOUS = "ambiguous"
UNCLASSIFIED = "unclassified"

DECLARABLE = (REFUSED, NOT_PERFORMED, AMBIGUOUS)
MAX_ATTEMPTS_LIMIT = 100
MAX_TIMEOUT_SECONDS = 300
#: RFC 9110 field-name: a token.
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


@dataclass(frozen=True)
class Policy:
    """The frozen outcome policy of one callout profile."""

    refused: frozenset[int]
    not_performed: frozenset[int]
    ambiguous: frozenset[int]
    max_attempts: int
    replay_safe: bool
    idempotency_header: str | None


def validate_profile(profile: dict) -> None:
    """Check a callout profile's outcome, retry and idempotency blocks.

    Raises:
        ValueError: a missing block, a status outside 100-599 or in 2xx, a
            status listed under two classes, an unknown class, a retry cap
            outside 1..100, a replay-safe contract without a header, a header
            that is not an HTTP field name, or a ``timeout_seconds`` that is not
            a number in (0, 300], or a ``rate_limit`` block naming a status
            that is not ``not_performed`` or a daily limit without its header,
            value or a reset hour 0-23.
    """
    outcomes = profile.get("outcomes")
    if not isinstance(outcomes, dict):
        raise ValueError("outcomes must be an object of status lists")
    unknown = set(outcomes) - set(DECLARABLE)
    if unknown:
        raise ValueError(f"unknown outcome classes {sorted(unknown)}; allowed: {list(DECLARABLE)}")
    seen: dict[int, str] = {}
    for name in DECLARABLE:
        statuses = outcomes.get(name, [])
        if not isinstance(statuses, list):
            raise ValueError(f"outcomes.{name} must be a list of HTTP statuses")
        for status in statuses:
            if not isinstance(status, int) or isinstance(status, bool) or not 100 <= status <= 599:
                raise ValueError(f"outcomes.{name}: {status!r} is not an HTTP status")
            if 200 <= status < 300:
                raise ValueError(f"outcomes.{name}: 2xx statuses are always confirmed")
            if status in seen:
                raise ValueError(f"status {status} is listed as both {seen[status]} and {name}")
            seen[status] = name
    retry = profile.get("retry")
    if not isinstance(retry, dict) or not isinstance(retry.get("max_attempts"), int) \
            or isinstance(retry.get("max_attempts"), bool) or not 1 <= retry["max_attempts"] <= MAX_ATTEMPTS_LIMIT:
        raise ValueError(f"retry.max_attempts must be an integer from 1 to {MAX_ATTEMPTS_LIMIT}")
    idempotency = profile.get("idempotency")
    if not isinstance(idempotency, dict) or not isinstance(idempotency.get("replay_safe"), bool):
        raise ValueError("idempotency.replay_safe must say whether the provider honours idempotency keys")
    if idempotency["replay_safe"] and not (isinstance(idempotency.get("header"), str) and idempotency["header"]):
        raise ValueError("a replay-safe idempotency contract names its header")
    if "header" in idempotency and not (isinstance(idempotency["header"], str)
                                        and _HEADER_NAME.fullmatch(idempotency["header"])):
        raise ValueError(f"idempotency.header {idempotency['header']!r} is not an HTTP header name")
    if "timeout_seconds" in profile:
        timeout = profile["timeout_seconds"]
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
                or not 0 < timeout <= MAX_TIMEOUT_SECONDS:
            raise ValueError(f"timeout_seconds must be a number of seconds above 0 and at most {MAX_TIMEOUT_SECONDS}")
    _validate_rate_limit(profile)


#: The statuses read as a provider rate limit when the profile declares none (HTTP 429 Too Many Requests).
DEFAULT_RATE_LIMIT_STATUSES = (429,)


@dataclass(frozen=True)
class RateLimit:
    """The rate-limit declaration of one callout profile (see the module docstring)."""

    statuses: frozenset[int]
    daily_header: str | None
    daily_value: str | None
    reset_hour_utc: int


def _validate_rate_limit(profile: dict) -> None:
    block = profile.get("rate_limit", {})
    if not isinstance(block, dict) or set(block) - {"statuses", "daily"}:
        raise ValueError('rate_limit must be {"statuses": [...], "daily": {...}}')
    not_performed = set(profile["outcomes"].get(NOT_PERFORMED, []))
    statuses = block.get("statuses", list(DEFAULT_RATE_LIMIT_STATUSES))
    if not isinstance(statuses, list) or any(status not in not_performed for status in statuses) \
            or ("statuses" in block and not statuses):
        raise ValueError("rate_limit.statuses must be a non-empty list of not_performed statuses")
    daily = block.get("daily")
    if daily is None:
        return
    if not isinstance(daily, dict) or set(daily) - {"header", "value", "reset_hour_utc"} \
            or not (isinstance(daily.get("header"), str) and _HEADER_NAME.fullmatch(daily["header"])) \
            or not (isinstance(daily.get("value"), str) and daily["value"]):
        raise ValueError("rate_limit.daily must name a header and the value that marks the daily limit")
    hour = daily.get("reset_hour_utc", 0)
    if isinstance(hour, bool) or not isinstance(hour, int) or not 0 <= hour <= 23:
        raise ValueError("rate_limit.daily.reset_hour_utc must be an hour 0-23")


def rate_limit(profile: dict) -> RateLimit:
    """The :class:`RateLimit` of a validated profile (default: 429, no daily limit declared)."""
    block = profile.get("rate_limit", {})
    daily = block.get("daily") or {}
    statuses = block.get("statuses", [s for s in DEFAULT_RATE_LIMIT_STATUSES
                                      if s in profile["outcomes"].get(NOT_PERFORMED, [])])
    return RateLimit(statuses=frozenset(statuses), daily_header=daily.get("header"), daily_value=daily.get("value"),
                     reset_hour_utc=daily.get("reset_hour_utc", 0))


def timeout_seconds(profile: dict) -> float:
    """The provider call timeout of a validated profile (default 10 s).

    Raises:
        ValueError: not a number in (0, MAX_TIMEOUT_SECONDS] (a profile published before this check).
    """
    timeout = profile.get("timeout_seconds", 10)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= MAX_TIMEOUT_SECONDS:
        raise ValueError(f"timeout_seconds {timeout!r} is not a usable timeout")
    return float(timeout)


def policy(profile: dict) -> Policy:
    """The :class:`Policy` of a validated profile."""
    outcomes = profile["outcomes"]
    idempotency = profile["idempotency"]
    return Policy(refused=frozenset(outcomes.get(REFUSED, [])), not_performed=frozenset(outcomes.get(NOT_PERFORMED, [])),
                  ambiguous=frozenset(outcomes.get(AMBIGUOUS, [])), max_attempts=profile["retry"]["max_attempts"],
                  replay_safe=idempotency["replay_safe"],
                  idempotency_header=idempotency.get("header") if idempotency["replay_safe"] else None)


def classify(profile: dict, *, status: int | None, connect_failed: bool = False) -> str:
    """Classify one provider answer.

    Args:
        status: the HTTP status, or ``None`` when no response arrived.
        connect_failed: the TCP connection was refused before any byte was sent.

    Returns:
        One of ``confirmed``, ``refused``, ``not_performed``, ``ambiguous``
        or ``unclassified`` (an ambiguous status the profile does not list).
    """
    if status is None:
        return NOT_PERFORMED if connect_failed else AMBIGUOUS
    if 200 <= status < 300:
        return CONFIRMED
    rules = policy(profile)
    if status in rules.refused:
        return REFUSED
    if status in rules.not_performed:
        return NOT_PERFORMED
    if status in rules.ambiguous:
        return AMBIGUOUS
    return UNCLASSIFIED
