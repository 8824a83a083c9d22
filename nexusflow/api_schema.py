"""What the OpenAPI schema (``/api/schema/``) says of every REST operation, stated once.

The views document their inputs and answers with these helpers, so the
schema tells the truth a schema-driven client (or fuzzer) relies on:

- identity path parameters and body keys carry :data:`KEY_PATTERN` and the
  column's ``maxLength`` (:func:`key_schema`, :func:`key_path`); row ids in a
  URL carry :data:`ID_PATTERN` (:func:`id_path`);
- every error answer is the one body of :mod:`nexusflow.api_errors`,
  ``{"error": <code>, "detail": <text or field map>}``, with ``error`` an
  enum of exactly the codes the operation answers with that status
  (:func:`error_responses`); the codes are read from the error classes
  (``NexusError.code``, DRF's ``default_code``), never retyped. A code that
  can answer a request the schema calls valid (it depends on stored state:
  the org's object metadata, the operator's orgs) is listed in the body's
  ``x-valid-request-codes``; every other 400 means the request broke the
  schema;
- :func:`add_headers` (a drf-spectacular postprocessing hook) documents
  ``Retry-After`` where a code carries it and the 401 challenge;
- :func:`add_links` (another one) adds OpenAPI
  links from an operation that creates an object to the operations that
  read or change it, so a client (and schemathesis' stateful phase) can
  follow a created record or replay instead of guessing its identifiers.

What a pattern cannot state. :func:`nexusflow.kernel.identity.validate_key`
accepts any NFC text without control or invisible characters; JSON
Schema's regular expressions cannot name Unicode categories or NFC, so the
schema promises the printable-ASCII subset of canonical keys: every key the
schema calls valid is accepted, and a key outside it may still be accepted
(the description says so).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema_field
from rest_framework import exceptions, serializers

from nexusflow.api_errors import INVALID_REQUEST, TEMPORARILY_UNAVAILABLE

#: A canonical key as the schema states it: printable ASCII, no surrounding space (see the module text).
KEY_PATTERN = r"^[!-~]([ -~]*[!-~])?$"
KEY_DESCRIPTION = ("A canonical key: compared byte for byte, no surrounding whitespace, no control or "
                   "invisible character, NFC. The pattern states its printable-ASCII subset.")
#: A row id in a URL (:func:`nexusflow.kernel.ids.id_from_text` takes ASCII digits without a leading zero
#: below 2**63); the pattern states its subset of at most 18 digits.
ID_PATTERN = r"^[1-9][0-9]{0,17}$"
#: Operator text (a reason): at least one character, no surrounding whitespace, no NUL (DRF's ``CharField``
#: refuses NUL and lone surrogates; UTF-8 JSON cannot carry the latter).
TEXT_PATTERN = r"^[^\s\x00]([^\x00]*[^\s\x00])?$"
ID_DESCRIPTION = "A row id: a positive decimal integer without sign or leading zero, below 2**63."

#: The answers of an operator endpoint without (valid) credentials or operator rights.
AUTH_ERRORS: dict[int, tuple] = {401: (exceptions.NotAuthenticated, exceptions.AuthenticationFailed),
                                 403: (exceptions.PermissionDenied,)}
#: The answers DRF gives a JSON body it cannot read.
JSON_BODY_ERRORS: dict[int, tuple] = {400: (exceptions.ParseError, INVALID_REQUEST),
                                      415: (exceptions.UnsupportedMediaType,)}
#: The answer of any operation reading the database when the database fails (a lock wait timeout).
DATABASE_ERRORS: dict[int, tuple] = {503: (TEMPORARILY_UNAVAILABLE,)}


def key_schema(max_length: int) -> dict:
    """The JSON schema of a canonical key of at most ``max_length`` characters."""
    return {"type": "string", "minLength": 1, "maxLength": max_length, "pattern": KEY_PATTERN}


def key_field(max_length: int, *, schema: dict | None = None, **kwargs) -> serializers.CharField:
    """A body field holding a canonical key (checked by the service: ``invalid_identity``), as text sent.

    Args:
        max_length: the column's length; the serializer refuses longer text (``invalid_request``).
        schema: extra JSON schema keywords (e.g. ``{"not": {"enum": [...]}}`` for a reserved value).
    """
    field_class = extend_schema_field({**key_schema(max_length), **(schema or {})})(
        type("KeyField", (serializers.CharField,), {}))
    return field_class(max_length=max_length, trim_whitespace=False, **kwargs)


def text_field(max_length: int, **kwargs) -> serializers.CharField:
    """A body field holding operator text (:data:`TEXT_PATTERN`) of at most ``max_length`` characters."""
    field_class = extend_schema_field({"type": "string", "minLength": 1, "maxLength": max_length,
                                       "pattern": TEXT_PATTERN})(type("TextField", (serializers.CharField,), {}))
    return field_class(max_length=max_length, trim_whitespace=False, **kwargs)


def key_path(name: str, max_length: int, description: str = "") -> OpenApiParameter:
    """A path parameter holding a canonical key of at most ``max_length`` characters."""
    return OpenApiParameter(name, type=key_schema(max_length), location=OpenApiParameter.PATH,
                            description=" ".join(filter(None, [description, KEY_DESCRIPTION])))


def id_path(name: str, description: str = "") -> OpenApiParameter:
    """A path parameter holding a row id."""
    return OpenApiParameter(name, type={"type": "string", "pattern": ID_PATTERN}, location=OpenApiParameter.PATH,
                            description=" ".join(filter(None, [description, ID_DESCRIPTION])))


def error_code(item) -> str:
    """The stable code of ``item``: a code string, a ``NexusError`` class (``code``) or a DRF exception class."""
    if isinstance(item, str):
        return item
    code = getattr(item, "code", None)
    if isinstance(code, str):
        return code
    return item.default_code


#: The schema extension of an error body listing the codes a request the schema calls valid may still get.
VALID_REQUEST_CODES = "x-valid-request-codes"
#: The schema extension of an error body listing the codes answered with ``Retry-After`` (see :func:`add_headers`).
RETRY_AFTER_CODES = "x-retry-after-codes"


def retries(item) -> bool:
    """Whether the error ``item`` (as :func:`error_code` takes it) is answered with ``Retry-After``."""
    if isinstance(item, str):
        return item == TEMPORARILY_UNAVAILABLE
    return getattr(item, "retry_after", None) is not None


def error_body(codes: Iterable[str], valid_request: Iterable[str] = (), retry_after: Iterable[str] = ()) -> dict:
    """The JSON schema of the error body whose ``error`` is one of ``codes``.

    Args:
        valid_request: the codes among ``codes`` that answer requests the schema calls valid, because they
            depend on stored state the schema cannot state (the org's object metadata, the operator's orgs,
            another row); listed in :data:`VALID_REQUEST_CODES`. Every other code answers only a request
            the schema calls invalid.
    """
    body = {
        "type": "object",
        "properties": {
            "error": {"type": "string", "enum": sorted(set(codes))},
            "detail": {"oneOf": [{"type": "string"}, {"type": "object"}],
                       "description": "a text, or (invalid_request) a map of each refused field to its messages"},
        },
        "required": ["error", "detail"],
    }
    if valid_request:
        body[VALID_REQUEST_CODES] = sorted(set(valid_request))
    if retry_after:
        body[RETRY_AFTER_CODES] = sorted(set(retry_after))
    return body


def _merge(specs: Iterable[Mapping[int, Iterable]], *, retrying: bool = False) -> dict[int, list[str]]:
    merged: dict[int, list[str]] = {}
    for spec in specs:
        for http_status, items in spec.items():
            merged.setdefault(http_status, []).extend(
                error_code(item) for item in items if not retrying or retries(item))
    return merged


def error_responses(*specs: Mapping[int, Iterable],
                    valid_request: Mapping[int, Iterable] | None = None) -> dict[int, OpenApiResponse]:
    """The error answers of one operation: ``{status: OpenApiResponse}`` from ``{status: codes}`` maps.

    Args:
        specs: maps of HTTP status to error classes or code strings; the maps are merged, a status named
            twice lists the codes of both.
        valid_request: the same kind of map, for the codes a schema-valid request may get (see
            :func:`error_body`); they join the status's codes.
    """
    merged = _merge([*specs, valid_request or {}])
    valid = _merge([valid_request or {}])
    retrying = _merge([*specs, valid_request or {}], retrying=True)
    return {http_status: OpenApiResponse(
                response=error_body(codes, valid.get(http_status, ()), retrying.get(http_status, ())),
                description=" | ".join(sorted(set(codes))))
            for http_status, codes in sorted(merged.items())}


#: OpenAPI links: (source operationId, its success statuses) -> {link name: (target operationId, parameters)}.
#: A parameter value is a runtime expression (``$request.path.<name>``, ``$response.body#/<pointer>``).
_RECORD_FROM_EDIT = {"object_name": "$request.path.object_name", "record_key": "$response.body#/record_key"}
_RECORD_FROM_TRANSFER = {"object_name": "$response.body#/target_object",
                         "record_key": "$response.body#/target_record_key"}
_REPLAY = {"account_key": "$response.body#/account_key", "replay_id": "$response.body#/replay_id"}
_RECORD_TARGETS = {"UpdateRecord": "api_v2_records_partial_update", "DeleteRecord": "api_v2_records_destroy",
                   "MergeRecord": "api_v2_records_merge_create", "ConvertRecord": "api_v2_records_convert_create"}
LINKS: dict[tuple[str, tuple[str, ...]], dict[str, tuple[str, dict]]] = {
    ("api_v2_records_create", ("201",)): {name: (op, _RECORD_FROM_EDIT) for name, op in _RECORD_TARGETS.items()},
    ("api_v2_records_partial_update", ("200",)): {
        name: (op, _RECORD_FROM_EDIT) for name, op in _RECORD_TARGETS.items() if name != "UpdateRecord"},
    ("api_v2_records_merge_create", ("200", "201")): {"UpdateTarget": ("api_v2_records_partial_update",
                                                                      _RECORD_FROM_TRANSFER)},
    ("api_v2_records_convert_create", ("200", "201")): {"UpdateTarget": ("api_v2_records_partial_update",
                                                                        _RECORD_FROM_TRANSFER)},
    ("api_v2_replays_create", ("200", "201", "202")): {"GetReplay": ("api_v2_replays_retrieve", _REPLAY)},
}


#: The header of an operator endpoint's 401 (DRF's basic authentication answers the challenge).
_CHALLENGE_CODES = frozenset({exceptions.NotAuthenticated.default_code, exceptions.AuthenticationFailed.default_code})


def add_headers(result: dict, generator, request, public) -> dict:
    """Document the headers of error answers (``SPECTACULAR_SETTINGS["POSTPROCESSING_HOOKS"]``).

    ``Retry-After`` (seconds) on a status whose error body lists :data:`RETRY_AFTER_CODES` (present for those
    codes only); ``WWW-Authenticate`` on an operator endpoint's 401 (always present).
    """
    for item in result.get("paths", {}).values():
        for operation in item.values():
            if not isinstance(operation, dict):
                continue
            for status_code, response in operation.get("responses", {}).items():
                schema = response.get("content", {}).get("application/json", {}).get("schema", {})
                headers = {}
                if schema.get(RETRY_AFTER_CODES):
                    headers["Retry-After"] = {
                        "schema": {"type": "integer", "minimum": 0},
                        "description": "seconds to wait before retrying; sent with " + ", ".join(
                            schema[RETRY_AFTER_CODES])}
                codes = set(schema.get("properties", {}).get("error", {}).get("enum", ()))
                if status_code == "401" and codes and codes <= _CHALLENGE_CODES:
                    headers["WWW-Authenticate"] = {"schema": {"type": "string"}, "required": True,
                                                   "description": "the authentication challenge (HTTP basic)"}
                if headers:
                    response["headers"] = {**response.get("headers", {}), **headers}
    return result


def add_links(result: dict, generator, request, public) -> dict:
    """Add :data:`LINKS` to the generated schema ``result`` (``SPECTACULAR_SETTINGS["POSTPROCESSING_HOOKS"]``).

    Raises:
        KeyError: a link names an operation or a status the schema does not have (a renamed route).
    """
    operations = {op["operationId"]: op for item in result.get("paths", {}).values()
                  for op in item.values() if isinstance(op, dict) and "operationId" in op}
    for (source, statuses), links in LINKS.items():
        if source not in operations:
            continue  # a schema generated for a subset of the URLs
        for status_code in statuses:
            response = operations[source]["responses"][status_code]
            response["links"] = {
                name: {"operationId": target, "parameters": dict(parameters)}
                for name, (target, parameters) in links.items() if target in operations}
    return result
