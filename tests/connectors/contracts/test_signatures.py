"""Pack-configured request signatures: vectors, round trips and rejections."""
from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from connectors.contracts.signatures import (
    SignatureError,
    SignatureInvalid,
    SignatureMissing,
    SignatureStale,
    header_timestamp,
    sign_request,
    validate_config,
    verify_request,
)
from nexusflow.kernel.errors import NexusError

VECTOR_SECRET = b"yyyyyyyy-yyyy-yyyy-yyyy-yyyyyyyyyyyy"
VECTOR_BODY = (
    b'[{"eventId":1,"subscriptionId":12345,"portalId":62515,"occurredAt":1564113600000,'
    b'"subscriptionType":"contact.creation","attemptNumber":0,"objectId":123,'
    b'"changeSource":"CRM","changeFlag":"NEW","appId":54321}]'
)

PLAIN_BODY_HASH = {
    "mechanism": "hmac",
    "algorithm": "sha256",
    "encoding": "hex",
    "keyed": False,
    "message": ["secret", "body"],
    "signature_header": "X-Test-Signature",
}
PLAIN_REQUEST_HASH = {**PLAIN_BODY_HASH, "message": ["secret", "method", "url", "body"]}
TIMED_HMAC = {
    "mechanism": "hmac",
    "algorithm": "sha256",
    "encoding": "base64",
    "keyed": True,
    "message": ["method", "url", "body", "timestamp"],
    "signature_header": "X-Test-Signature-v3",
    "timestamp_header": "X-Test-Request-Timestamp",
    "timestamp_unit": "ms",
    "tolerance_seconds": 300,
}
DOTTED_SECONDS = {
    "mechanism": "hmac",
    "algorithm": "sha256",
    "encoding": "hex",
    "message": ["timestamp", {"literal": "."}, "body"],
    "signature_header": "X-Dotted-Signature",
    "timestamp_header": "X-Dotted-Timestamp",
    "timestamp_unit": "s",
    "tolerance_seconds": 300,
}

SECRET = b"app-client-secret-\xc3\xa9"
URL = "https://nexus.example.test/ingress/webhooks/acct_1?x=1"
NOW = 1_735_689_600.25
BODY = '[{"eventId":7,"propertyValue":"Zoë 李"}]'.encode()


def _signed(config: dict, *, body: bytes = BODY, now: float = NOW, secret: bytes = SECRET) -> dict[str, str]:
    return sign_request(
        config,
        secret=secret,
        method="POST",
        url=URL,
        body=body,
        timestamp=header_timestamp(config, epoch_seconds=now),
    )


def _verify(config: dict, headers: dict[str, str], *, body: bytes = BODY, url: str = URL, now: float = NOW) -> None:
    verify_request(
        config, secret=SECRET, method="POST", url=url, body=body, headers=headers, now_epoch_seconds=now
    )


def test_error_codes_and_hierarchy() -> None:
    assert issubclass(SignatureError, NexusError)
    assert SignatureMissing().code == "signature_missing"
    assert SignatureInvalid().code == "signature_invalid"
    assert SignatureStale().code == "signature_stale"
    for cls in (SignatureMissing, SignatureInvalid, SignatureStale):
        assert issubclass(cls, SignatureError)


def test_plain_body_hash_vector() -> None:
    headers = sign_request(
        PLAIN_BODY_HASH, secret=VECTOR_SECRET, method="POST", url="https://ignored.test/", body=VECTOR_BODY
    )
    assert headers == {"X-Test-Signature": "232db2615f3d666fe21a8ec971ac7b5402d33b9a925784df3ca654d05f4817de"}
    verify_request(
        PLAIN_BODY_HASH,
        secret=VECTOR_SECRET,
        method="POST",
        url="https://ignored.test/",
        body=VECTOR_BODY,
        headers={"x-test-signature": headers["X-Test-Signature"].upper()},
        now_epoch_seconds=0,
    )


def test_plain_request_hash_vector() -> None:
    headers = sign_request(
        PLAIN_REQUEST_HASH,
        secret=VECTOR_SECRET,
        method="GET",
        url="https://www.example.com/webhook_uri",
        body=b"",
    )
    assert headers == {"X-Test-Signature": "eee2dddcc73c94d699f5e395f4b9d454a069a6855fbfa152e91e88823087200e"}
    with pytest.raises(SignatureInvalid):
        verify_request(
            PLAIN_REQUEST_HASH,
            secret=VECTOR_SECRET,
            method="POST",
            url="https://www.example.com/webhook_uri",
            body=b"",
            headers=headers,
            now_epoch_seconds=0,
        )


def test_timed_hmac_round_trip_with_case_insensitive_headers() -> None:
    headers = _signed(TIMED_HMAC)
    assert set(headers) == {"X-Test-Signature-v3", "X-Test-Request-Timestamp"}
    assert headers["X-Test-Request-Timestamp"] == "1735689600250"
    _verify(TIMED_HMAC, headers)
    _verify(TIMED_HMAC, {key.lower(): value for key, value in headers.items()})
    _verify(TIMED_HMAC, {key.upper(): value for key, value in headers.items()})


def test_literal_parts_and_second_timestamps() -> None:
    headers = _signed(DOTTED_SECONDS)
    assert headers["X-Dotted-Timestamp"] == "1735689600"
    _verify(DOTTED_SECONDS, headers)
    with pytest.raises(SignatureInvalid):
        _verify(DOTTED_SECONDS, headers, body=BODY + b" ")


def test_stale_timestamp_is_rejected() -> None:
    headers = _signed(TIMED_HMAC, now=NOW - 300.5)
    with pytest.raises(SignatureStale):
        _verify(TIMED_HMAC, headers)
    _verify(TIMED_HMAC, _signed(TIMED_HMAC, now=NOW - 299.5))


def test_future_timestamp_is_rejected() -> None:
    with pytest.raises(SignatureStale):
        _verify(TIMED_HMAC, _signed(TIMED_HMAC, now=NOW + 301))
    _verify(TIMED_HMAC, _signed(TIMED_HMAC, now=NOW + 299))


@pytest.mark.parametrize("dropped", ["X-Test-Signature-v3", "X-Test-Request-Timestamp"])
def test_missing_header_is_rejected(dropped: str) -> None:
    headers = _signed(TIMED_HMAC)
    del headers[dropped]
    with pytest.raises(SignatureMissing):
        _verify(TIMED_HMAC, headers)


def test_empty_header_counts_as_missing() -> None:
    headers = _signed(TIMED_HMAC)
    headers["X-Test-Signature-v3"] = ""
    with pytest.raises(SignatureMissing):
        _verify(TIMED_HMAC, headers)
    with pytest.raises(SignatureMissing):
        _verify(PLAIN_BODY_HASH, {})


@pytest.mark.parametrize("value", ["abc", "", " 1735689600250", "1735689600250 ", "-1", "1e12", "１２３", "1_000"])
def test_unparsable_timestamp_is_invalid(value: str) -> None:
    headers = _signed(TIMED_HMAC)
    headers["X-Test-Request-Timestamp"] = value
    expected = SignatureMissing if value == "" else SignatureInvalid
    with pytest.raises(expected):
        _verify(TIMED_HMAC, headers)


def test_tampered_body_is_invalid() -> None:
    headers = _signed(TIMED_HMAC)
    with pytest.raises(SignatureInvalid):
        _verify(TIMED_HMAC, headers, body=BODY.replace(b"7", b"8"))


def test_tampered_url_is_invalid() -> None:
    headers = _signed(TIMED_HMAC)
    with pytest.raises(SignatureInvalid):
        _verify(TIMED_HMAC, headers, url=URL.replace("acct_1", "acct_2"))
    with pytest.raises(SignatureInvalid):
        _verify(TIMED_HMAC, headers, url=URL.replace("https://", "http://"))


def test_tampered_timestamp_is_invalid() -> None:
    headers = _signed(TIMED_HMAC)
    headers["X-Test-Request-Timestamp"] = str(int(headers["X-Test-Request-Timestamp"]) + 1)
    with pytest.raises(SignatureInvalid):
        _verify(TIMED_HMAC, headers)


def test_wrong_secret_and_malformed_signature_are_invalid() -> None:
    with pytest.raises(SignatureInvalid):
        _verify(TIMED_HMAC, _signed(TIMED_HMAC, secret=b"another-secret"))
    for garbage in ("not base64!", "QUJD=", "é"):
        headers = _signed(TIMED_HMAC)
        headers["X-Test-Signature-v3"] = garbage
        with pytest.raises(SignatureInvalid):
            _verify(TIMED_HMAC, headers)
    with pytest.raises(SignatureInvalid):
        _verify(PLAIN_BODY_HASH, {"X-Test-Signature": "abc"})


def test_conflicting_duplicate_headers_are_invalid() -> None:
    headers = _signed(TIMED_HMAC)
    headers["x-test-signature-v3"] = headers["X-Test-Signature-v3"][::-1]
    with pytest.raises(SignatureInvalid):
        _verify(TIMED_HMAC, headers)


def test_validate_config_normalizes_and_is_idempotent() -> None:
    normalized = validate_config(PLAIN_BODY_HASH)
    assert normalized["timestamp_header"] is None
    assert normalized["tolerance_seconds"] is None
    assert validate_config(normalized) == normalized
    assert "keyed" not in DOTTED_SECONDS
    assert validate_config(DOTTED_SECONDS)["keyed"] is True
    assert validate_config(validate_config(TIMED_HMAC)) == validate_config(TIMED_HMAC)


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"mechanism": "rsa"}, "mechanism"),
        ({"algorithm": "md5"}, "algorithm"),
        ({"encoding": "base32"}, "encoding"),
        ({"message": ["method", "path"]}, "message part"),
        ({"message": [{"literal": ""}]}, "literal"),
        ({"message": [{"literal": ".", "extra": 1}]}, "literal"),
        ({"message": [3]}, "message part"),
        ({"message": []}, "non-empty"),
        ({"keyed": "yes"}, "keyed"),
        ({"keyed": False}, "secret"),
        ({"timestamp_unit": "us"}, "timestamp unit"),
        ({"tolerance_seconds": 0}, "tolerance"),
        ({"tolerance_seconds": True}, "tolerance"),
        ({"signature_header": "Bad Header"}, "header name"),
        ({"timestamp_header": "x-test-signature-v3"}, "must differ"),
        ({"message": ["method", "url", "body"]}, "not a signed message part"),
        ({"surprise": 1}, "unknown key"),
        ({"timestamp_header": None}, "require 'timestamp_header'"),
    ],
)
def test_validate_config_rejects(change: dict, fragment: str) -> None:
    config = {**copy.deepcopy(TIMED_HMAC), **change}
    with pytest.raises(ValueError, match=fragment):
        validate_config(config)


def test_validate_config_rejects_missing_keys_and_non_mappings() -> None:
    with pytest.raises(ValueError, match="missing key"):
        validate_config({key: value for key, value in TIMED_HMAC.items() if key != "algorithm"})
    with pytest.raises(ValueError, match="mapping"):
        validate_config(["hmac"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="requires 'timestamp_header'"):
        validate_config({**PLAIN_BODY_HASH, "message": ["secret", "timestamp"]})


def test_sign_request_argument_errors() -> None:
    with pytest.raises(ValueError, match="timestamp"):
        sign_request(TIMED_HMAC, secret=SECRET, method="POST", url=URL, body=BODY)
    with pytest.raises(ValueError, match="timestamp"):
        sign_request(PLAIN_BODY_HASH, secret=SECRET, method="POST", url=URL, body=BODY, timestamp=1)
    with pytest.raises(ValueError, match="secret"):
        sign_request(PLAIN_BODY_HASH, secret=b"", method="POST", url=URL, body=BODY)
    with pytest.raises(ValueError, match="secret"):
        verify_request(
            PLAIN_BODY_HASH, secret=b"", method="POST", url=URL, body=BODY, headers={}, now_epoch_seconds=NOW
        )
    with pytest.raises(ValueError, match="no timestamp"):
        header_timestamp(PLAIN_BODY_HASH, epoch_seconds=NOW)


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=2048), config=st.sampled_from([TIMED_HMAC, DOTTED_SECONDS, PLAIN_REQUEST_HASH]))
def test_any_body_signs_and_verifies(body: bytes, config: dict) -> None:
    timestamp = header_timestamp(config, epoch_seconds=NOW) if config.get("timestamp_header") else None
    headers = sign_request(config, secret=SECRET, method="POST", url=URL, body=body, timestamp=timestamp)
    _verify(config, headers, body=body)


@settings(max_examples=200, deadline=None)
@given(
    data=st.data(),
    body=st.binary(min_size=1, max_size=1024),
    config=st.sampled_from([TIMED_HMAC, DOTTED_SECONDS, PLAIN_BODY_HASH, PLAIN_REQUEST_HASH]),
)
def test_any_single_byte_change_fails(data: st.DataObject, body: bytes, config: dict) -> None:
    timestamp = header_timestamp(config, epoch_seconds=NOW) if config.get("timestamp_header") else None
    headers = sign_request(config, secret=SECRET, method="POST", url=URL, body=body, timestamp=timestamp)
    index = data.draw(st.integers(min_value=0, max_value=len(body) - 1), label="index")
    replacement = data.draw(st.integers(min_value=0, max_value=255).filter(lambda b: b != body[index]), label="byte")
    tampered = body[:index] + bytes([replacement]) + body[index + 1 :]
    with pytest.raises(SignatureInvalid):
        _verify(config, headers, body=tampered)
