"""Request signatures configured entirely by pack data (seed 003, "Inbound chain").

A pack describes how its provider signs webhook requests with one closed
configuration dict; this module signs and verifies requests from that dict
and knows nothing about any provider::

    {
        "mechanism": "hmac",
        "algorithm": "sha256",            # one of ALGORITHMS
        "encoding": "base64",             # "base64" or "hex"
        "keyed": true,                    # false: plain hash, "secret" must be a message part
        "message": ["method", "url", "body", "timestamp"],
        "signature_header": "X-Example-Signature",
        "timestamp_header": "X-Example-Timestamp",   # optional, with the two keys below
        "timestamp_unit": "ms",           # "ms" or "s"
        "tolerance_seconds": 300
    }

Message parts are concatenated in the listed order with no separators:

- ``"method"``: the HTTP method exactly as given, UTF-8;
- ``"url"``: the full request URL (scheme, host, path, query) exactly as given, UTF-8;
- ``"body"``: the raw request body bytes as received;
- ``"timestamp"``: the timestamp header value exactly as received (ASCII digits);
- ``"secret"``: the secret bytes (for plain-hash schemes, ``"keyed": false``);
- ``{"literal": "<text>"}``: fixed UTF-8 text, e.g. a ``"."`` separator.

With ``"keyed": true`` the digest is HMAC(secret, message); with ``false`` it
is hash(message), which only authenticates because the message contains the
secret. The digest is rendered in ``encoding`` and carried in
``signature_header``. When ``timestamp_header`` is configured the timestamp
must be signed (``"timestamp"`` in ``message``) and must lie within
``tolerance_seconds`` of the verifier's clock, in either direction.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from nexusflow.kernel.errors import NexusError

MECHANISMS: frozenset[str] = frozenset({"hmac"})
ALGORITHMS: dict[str, Callable[..., Any]] = {
    "sha256": hashlib.sha256,
    "sha384": hashlib.sha384,
    "sha512": hashlib.sha512,
}
ENCODINGS: frozenset[str] = frozenset({"base64", "hex"})
MESSAGE_PARTS: frozenset[str] = frozenset({"method", "url", "body", "timestamp", "secret"})
TIMESTAMP_UNITS: dict[str, int] = {"s": 1, "ms": 1000}

_REQUIRED_KEYS = ("mechanism", "algorithm", "encoding", "message", "signature_header")
_TIMESTAMP_KEYS = ("timestamp_header", "timestamp_unit", "tolerance_seconds")
_KNOWN_KEYS = frozenset(_REQUIRED_KEYS + _TIMESTAMP_KEYS + ("keyed",))
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_TIMESTAMP_VALUE = re.compile(r"[0-9]{1,19}")
_HEX_VALUE = re.compile(r"(?:[0-9a-fA-F]{2})+")


class SignatureError(NexusError):
    """A request failed signature verification; ``code`` says why (HTTP 401)."""

    code = "signature_error"
    http_status = 401


class SignatureMissing(SignatureError):
    """A configured signature or timestamp header is absent or empty."""

    code = "signature_missing"


class SignatureInvalid(SignatureError):
    """The signature does not match, or a header value is malformed."""

    code = "signature_invalid"


class SignatureStale(SignatureError):
    """The signed timestamp lies outside the configured tolerance window."""

    code = "signature_stale"


def validate_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Check a signature configuration and return a normalized copy.

    Args:
        config: the pack's ``auth`` mapping described in the module docstring.

    Returns:
        A new dict with every key of the closed schema present: ``keyed``
        defaults to ``True``; without a timestamp the three timestamp keys are
        ``None``; ``message`` is a list of part names and ``{"literal": str}``
        dicts. Passing the result back in returns an equal dict.

    Raises:
        ValueError: not a mapping, an unknown or missing key, an unknown
            mechanism, algorithm, encoding, message part or timestamp unit,
            a malformed header name, a non-positive tolerance, a timestamp
            header whose value is not signed, or an unkeyed hash whose message
            does not contain the secret.
    """
    if not isinstance(config, Mapping):
        raise ValueError(f"signature config must be a mapping, got {type(config).__name__}")
    unknown = sorted(str(key) for key in config if key not in _KNOWN_KEYS)
    if unknown:
        raise ValueError(f"signature config has unknown key(s): {', '.join(unknown)}")
    missing = [key for key in _REQUIRED_KEYS if config.get(key) is None]
    if missing:
        raise ValueError(f"signature config is missing key(s): {', '.join(missing)}")

    mechanism = config["mechanism"]
    if mechanism not in MECHANISMS:
        raise ValueError(f"unknown signature mechanism {mechanism!r}; expected one of {sorted(MECHANISMS)}")
    algorithm = config["algorithm"]
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown signature algorithm {algorithm!r}; expected one of {sorted(ALGORITHMS)}")
    encoding = config["encoding"]
    if encoding not in ENCODINGS:
        raise ValueError(f"unknown signature encoding {encoding!r}; expected one of {sorted(ENCODINGS)}")
    keyed = config.get("keyed", True)
    if keyed is None:
        keyed = True
    if not isinstance(keyed, bool):
        raise ValueError(f"signature config 'keyed' must be a boolean, got {keyed!r}")

    message = _validate_message(config["message"])
    part_names = [part for part in message if isinstance(part, str)]
    if not keyed and "secret" not in part_names:
        raise ValueError("an unkeyed signature must include 'secret' in its message, or it authenticates nothing")

    signature_header = _validate_header_name("signature_header", config["signature_header"])

    timestamp_header = config.get("timestamp_header")
    timestamp_unit = config.get("timestamp_unit")
    tolerance = config.get("tolerance_seconds")
    if timestamp_header is None:
        if timestamp_unit is not None or tolerance is not None:
            raise ValueError("'timestamp_unit' and 'tolerance_seconds' require 'timestamp_header'")
        if "timestamp" in part_names:
            raise ValueError("message part 'timestamp' requires 'timestamp_header'")
    else:
        timestamp_header = _validate_header_name("timestamp_header", timestamp_header)
        if timestamp_header.lower() == signature_header.lower():
            raise ValueError("'timestamp_header' and 'signature_header' must differ")
        if "timestamp" not in part_names:
            raise ValueError("'timestamp_header' is configured but 'timestamp' is not a signed message part")
        if timestamp_unit not in TIMESTAMP_UNITS:
            raise ValueError(f"unknown timestamp unit {timestamp_unit!r}; expected one of {sorted(TIMESTAMP_UNITS)}")
        if (
            isinstance(tolerance, bool)
            or not isinstance(tolerance, (int, float))
            or not math.isfinite(tolerance)
            or tolerance <= 0
        ):
            raise ValueError(f"'tolerance_seconds' must be a positive finite number, got {tolerance!r}")

    return {
        "mechanism": mechanism,
        "algorithm": algorithm,
        "encoding": encoding,
        "keyed": keyed,
        "message": message,
        "signature_header": signature_header,
        "timestamp_header": timestamp_header,
        "timestamp_unit": timestamp_unit,
        "tolerance_seconds": tolerance,
    }


def header_timestamp(config: Mapping[str, Any], *, epoch_seconds: float) -> int:
    """Convert a Unix time to the integer the config's timestamp header carries.

    Args:
        config: a signature configuration with a ``timestamp_header``.
        epoch_seconds: seconds since the Unix epoch (fractions allowed).

    Returns:
        ``floor(epoch_seconds)`` for unit ``"s"``, ``floor(epoch_seconds * 1000)`` for ``"ms"``.

    Raises:
        ValueError: the config is invalid or has no timestamp header.
    """
    normalized = validate_config(config)
    if normalized["timestamp_header"] is None:
        raise ValueError("this signature config carries no timestamp")
    return math.floor(epoch_seconds * TIMESTAMP_UNITS[normalized["timestamp_unit"]])


def sign_request(
    config: Mapping[str, Any],
    *,
    secret: bytes,
    method: str,
    url: str,
    body: bytes,
    timestamp: int | None = None,
) -> dict[str, str]:
    """Return the headers that sign a request under ``config``.

    Args:
        config: a signature configuration (see :func:`validate_config`).
        secret: the shared secret bytes; must be non-empty.
        method: the HTTP method as it will be sent, e.g. ``"POST"``.
        url: the full URL the request is sent to, with scheme.
        body: the exact body bytes that will be sent.
        timestamp: non-negative integer in the config's ``timestamp_unit``
            (see :func:`header_timestamp`); required iff the config has a
            timestamp header, otherwise must be ``None``.

    Returns:
        ``{signature_header: signature}`` plus ``{timestamp_header: str(timestamp)}``
        when the config carries a timestamp.

    Raises:
        ValueError: invalid config, empty secret, or a timestamp given
            when none is configured / missing when one is.
    """
    normalized = validate_config(config)
    _require_secret(secret)
    headers: dict[str, str] = {}
    timestamp_text: str | None = None
    if normalized["timestamp_header"] is not None:
        if timestamp is None or isinstance(timestamp, bool) or not isinstance(timestamp, int) or timestamp < 0:
            raise ValueError(f"a non-negative integer timestamp is required by this config, got {timestamp!r}")
        timestamp_text = str(timestamp)
        headers[normalized["timestamp_header"]] = timestamp_text
    elif timestamp is not None:
        raise ValueError("this signature config carries no timestamp; pass timestamp=None")
    digest = _digest(normalized, secret=secret, method=method, url=url, body=body, timestamp=timestamp_text)
    headers[normalized["signature_header"]] = _encode(normalized["encoding"], digest)
    return headers


def verify_request(
    config: Mapping[str, Any],
    *,
    secret: bytes,
    method: str,
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    now_epoch_seconds: float,
) -> None:
    """Verify a received request's signature headers; return ``None`` when valid.

    Checks run in this order: required headers present, timestamp well
    formed, timestamp fresh, signature equal (constant-time over the decoded
    digest bytes). Header names are matched case-insensitively.

    Args:
        config: a signature configuration (see :func:`validate_config`).
        secret: the shared secret bytes; must be non-empty.
        method: the received HTTP method.
        url: the full received URL with scheme, as the sender signed it.
        body: the raw received body bytes.
        headers: the received headers (any key case).
        now_epoch_seconds: the verifier's clock, Unix seconds.

    Raises:
        SignatureMissing: a configured header is absent or empty.
        SignatureInvalid: the timestamp is not a plain decimal integer, a
            header appears twice with different values, the signature is not
            valid hex/base64, or it does not match.
        SignatureStale: the timestamp is more than ``tolerance_seconds`` in
            the past or in the future.
        ValueError: invalid config or empty secret (a deployment error, not
            a request error).
    """
    normalized = validate_config(config)
    _require_secret(secret)
    received_signature = _header(headers, normalized["signature_header"])
    timestamp_text: str | None = None
    if normalized["timestamp_header"] is not None:
        timestamp_text = _header(headers, normalized["timestamp_header"])
        if timestamp_text is None:
            raise SignatureMissing(f"missing header {normalized['timestamp_header']}")
    if received_signature is None:
        raise SignatureMissing(f"missing header {normalized['signature_header']}")

    if timestamp_text is not None:
        if not _TIMESTAMP_VALUE.fullmatch(timestamp_text):
            raise SignatureInvalid(f"header {normalized['timestamp_header']} is not a decimal timestamp")
        signed_at = int(timestamp_text) / TIMESTAMP_UNITS[normalized["timestamp_unit"]]
        skew = now_epoch_seconds - signed_at
        if abs(skew) > normalized["tolerance_seconds"]:
            direction = "old" if skew > 0 else "in the future"
            raise SignatureStale(
                f"signature timestamp is {abs(skew):.3f}s {direction}; "
                f"tolerance is {normalized['tolerance_seconds']}s"
            )

    received_digest = _decode(normalized["encoding"], received_signature)
    if received_digest is None:
        raise SignatureInvalid(f"header {normalized['signature_header']} is not valid {normalized['encoding']}")
    expected_digest = _digest(normalized, secret=secret, method=method, url=url, body=body, timestamp=timestamp_text)
    if not hmac.compare_digest(expected_digest, received_digest):
        raise SignatureInvalid("signature does not match the request")


def _validate_message(message: Any) -> list[str | dict[str, str]]:
    if not isinstance(message, (list, tuple)) or not message:
        raise ValueError("signature config 'message' must be a non-empty list of parts")
    parts: list[str | dict[str, str]] = []
    for position, part in enumerate(message):
        if isinstance(part, str):
            if part not in MESSAGE_PARTS:
                raise ValueError(
                    f"unknown message part {part!r} at position {position}; "
                    f"expected one of {sorted(MESSAGE_PARTS)} or {{'literal': text}}"
                )
            parts.append(part)
        elif isinstance(part, Mapping):
            if set(part) != {"literal"} or not isinstance(part["literal"], str) or not part["literal"]:
                raise ValueError(
                    f"message part at position {position} must be {{'literal': <non-empty text>}}, got {dict(part)!r}"
                )
            parts.append({"literal": part["literal"]})
        else:
            raise ValueError(f"unknown message part {part!r} at position {position}")
    return parts


def _validate_header_name(key: str, value: Any) -> str:
    if not isinstance(value, str) or not _HEADER_NAME.fullmatch(value):
        raise ValueError(f"signature config {key!r} must be an HTTP header name, got {value!r}")
    return value


def _require_secret(secret: bytes) -> None:
    if not isinstance(secret, (bytes, bytearray)) or not secret:
        raise ValueError("signature secret must be non-empty bytes")


def _header(headers: Mapping[str, str], name: str) -> str | None:
    """Return the value of ``name`` (any case), ``None`` when absent or empty."""
    wanted = name.lower()
    found: str | None = None
    for key, value in headers.items():
        if key.lower() != wanted:
            continue
        if found is not None and value != found:
            raise SignatureInvalid(f"header {name} appears more than once with different values")
        found = value
    return found or None


def _digest(
    config: Mapping[str, Any],
    *,
    secret: bytes,
    method: str,
    url: str,
    body: bytes,
    timestamp: str | None,
) -> bytes:
    pieces: list[bytes] = []
    for part in config["message"]:
        if isinstance(part, dict):
            pieces.append(part["literal"].encode("utf-8"))
        elif part == "method":
            pieces.append(method.encode("utf-8"))
        elif part == "url":
            pieces.append(url.encode("utf-8"))
        elif part == "body":
            pieces.append(bytes(body))
        elif part == "timestamp":
            if timestamp is None:
                raise ValueError("message part 'timestamp' needs a timestamp value")
            pieces.append(timestamp.encode("ascii"))
        else:  # "secret"
            pieces.append(bytes(secret))
    message = b"".join(pieces)
    algorithm = ALGORITHMS[config["algorithm"]]
    if config["keyed"]:
        return hmac.new(bytes(secret), message, algorithm).digest()
    return algorithm(message).digest()


def _encode(encoding: str, digest: bytes) -> str:
    if encoding == "hex":
        return digest.hex()
    return base64.b64encode(digest).decode("ascii")


def _decode(encoding: str, value: str) -> bytes | None:
    """Decode a received signature to digest bytes; ``None`` when malformed."""
    if encoding == "hex":
        if not _HEX_VALUE.fullmatch(value):
            return None
        return bytes.fromhex(value)
    try:
        return base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        return None
