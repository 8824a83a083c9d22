"""The checks ``st run`` adds to its own in the REST API fuzz (tests/test_api_schema_fuzz.py).

Loaded as the run's hooks module (``hooks = "tests.api_fuzz_hooks"`` in its
configuration), from the repository root.

- :func:`valid_request_accepted` replaces schemathesis' ``positive_data_acceptance``:
  a request the schema calls valid is accepted, or refused with 401, 403, 404,
  409 or 429 (schemathesis' defaults), or with a code the operation's error
  body lists in ``x-valid-request-codes`` (a code that depends on stored
  state, e.g. the object's field metadata). Any other 4xx means the schema
  called a request valid that the server refuses: the schema lies.
- :func:`metadata_field_names` renames about half of the generated field names
  of a record create or update to the object's own (``NEXUS_FUZZ_FIELDS``, a
  JSON map of object name to field names), so the generated edits reach past
  ``unknown_field`` to the record write; the body stays as valid (or as
  invalid) as it was generated.
- :func:`sign_ingress` signs three in four requests to the one ingress route
  named in ``NEXUS_FUZZ_SIGNED_INGRESS`` (a JSON object: ``path``,
  ``account_key``, ``channel``, the route's signature ``auth`` config and the
  environment variable holding its secret) like the provider, over the exact
  bytes sent, so generated bodies reach admission past the signature check.
- :func:`no_foreign_identifier` fails a successful answer that carries one of
  the identifiers named in ``NEXUS_FUZZ_FOREIGN_IDS`` (a JSON list): the run
  authenticates as an operator of another org, so none may ever come back.
"""
from __future__ import annotations

import json
import os
import time
import zlib

import schemathesis

#: What schemathesis' own positive data acceptance takes besides 2xx, 3xx and 5xx (5xx is not_a_server_error's).
ACCEPTED_REFUSALS = frozenset({401, 403, 404, 409, 429})


def _valid_request_codes(case, status: int) -> frozenset[str]:
    operation = case.operation.schema.raw_schema["paths"][case.operation.path][case.operation.method.lower()]
    response = operation.get("responses", {}).get(str(status), {})
    codes: set[str] = set()
    for media in response.get("content", {}).values():
        codes.update(media.get("schema", {}).get("x-valid-request-codes", ()))
    return frozenset(codes)


def _error_code(response) -> str | None:
    try:
        body = response.json()
    except Exception:  # a body that is no JSON has no code
        return None
    return body.get("error") if isinstance(body, dict) else None


@schemathesis.check
def valid_request_accepted(ctx, response, case):
    """A schema-valid request is accepted, or refused only as the schema says a valid request can be."""
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive:
        return None
    status = response.status_code
    if status < 400 or status >= 500 or status in ACCEPTED_REFUSALS:
        return None
    code = _error_code(response)
    if code in _valid_request_codes(case, status):
        return None
    raise AssertionError(f"A request the schema calls valid was refused with {status} {code!r}, which the "
                         f"operation's schema does not list in x-valid-request-codes")


@schemathesis.check
def no_foreign_identifier(ctx, response, case):
    """No successful answer carries an identifier of an org the caller does not act for."""
    foreign = json.loads(os.environ.get("NEXUS_FUZZ_FOREIGN_IDS", "[]"))
    if not foreign or not 200 <= response.status_code < 300:
        return None
    text = response.text or ""
    leaked = sorted(identifier for identifier in foreign if identifier in text)
    if leaked:
        raise AssertionError(f"a {response.status_code} answer carries another org's identifiers: {leaked}")
    return None


@schemathesis.hook
def map_case(context, case):
    """See :func:`metadata_field_names`."""
    return metadata_field_names(case)


def metadata_field_names(case):
    """Rename the generated field names of a record edit whose CRC-32 is even to the object's field names."""
    fields = json.loads(os.environ.get("NEXUS_FUZZ_FIELDS", "{}")).get((case.path_parameters or {}).get("object_name"))
    body = case.body if isinstance(case.body, dict) else None
    if not fields or body is None or not isinstance(body.get("fields"), dict):
        return case
    renamed = {}
    for index, (name, value) in enumerate(body["fields"].items()):
        if isinstance(name, str) and zlib.crc32(name.encode("utf-8", "surrogatepass")) % 2 == 0:
            name = fields[index % len(fields)]
        renamed.setdefault(name, value)
    case.body = {**body, "fields": renamed}
    return case


@schemathesis.hook
def before_call(context, case, kwargs):
    """See :func:`sign_ingress`."""
    sign_ingress(case)


def sign_ingress(case) -> None:
    """Add the provider's signature headers to a request to the configured ingress route (three in four)."""
    from connectors.contracts.signatures import header_timestamp, sign_request

    route = json.loads(os.environ.get("NEXUS_FUZZ_SIGNED_INGRESS", "null"))
    params = case.path_parameters or {}
    if (not route or case.method.upper() != "POST" or case.operation.path != route["path"]
            or (params.get("account_key"), params.get("channel")) != (route["account_key"], route["channel"])):
        return
    sent = case.as_transport_kwargs()
    if "json" in sent:  # serialized by requests, as requests does
        body = json.dumps(sent["json"], allow_nan=False).encode("utf-8")
    else:
        body = sent.get("data") or b""
    if isinstance(body, str):
        body = body.encode("utf-8")
    if not isinstance(body, bytes) or zlib.crc32(body) % 4 == 0:
        return
    auth = route["auth"]
    timestamp = header_timestamp(auth, epoch_seconds=time.time()) if auth.get("timestamp_header") else None
    signature = sign_request(auth, secret=os.environ[route["secret_env"]].encode(), method="POST", url=sent["url"],
                             body=body, timestamp=timestamp)
    case.headers = {**(case.headers or {}), **signature}
