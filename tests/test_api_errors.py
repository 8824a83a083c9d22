"""The one REST exception handler (``nexusflow/api_errors.py``): a raised error carries its own answer."""
from __future__ import annotations

import pytest
from django.db import OperationalError
from rest_framework import exceptions

from connectors.serving.gates import NotServing
from nexusflow.api_errors import exception_handler
from nexusflow.kernel.errors import InvalidIdentity, NexusError, RetryableConflict, StaleVersion
from nexusflow.kernel.permissions import OrgNotAuthorized
from nexusflow.records.metadata import UnknownObject
from runtime_outbox.owner import OwnerContended


def _answer(exc) -> tuple[int, dict, str | None]:
    response = exception_handler(exc, {})
    return response.status_code, response.data, response.get("Retry-After")


@pytest.mark.parametrize("exc,answer", [
    (StaleVersion("moved"), (409, {"error": "stale_version", "detail": "moved"}, None)),
    (InvalidIdentity("bad key"), (400, {"error": "invalid_identity", "detail": "bad key"}, None)),
    (UnknownObject("no such object"), (404, {"error": "unknown_object", "detail": "no such object"}, None)),
    (OrgNotAuthorized("not yours"), (403, {"error": "org_not_authorized", "detail": "not yours"}, None)),
    (RetryableConflict("held"), (409, {"error": "retryable_conflict", "detail": "held"}, "2")),
    (OwnerContended("busy"), (409, {"error": "owner_contended", "detail": "busy"}, "2")),
    (NotServing("halted"), (503, {"error": "not_serving", "detail": "halted"}, "5")),
    (NexusError("locked", code="record_locked", http_status=423, retry_after=7),
     (423, {"error": "record_locked", "detail": "locked"}, "7")),
])
def test_a_nexus_error_answers_with_its_own_status_and_retry_after(exc, answer):
    assert _answer(exc) == answer


def test_an_instance_status_overrides_its_class_only_for_that_instance():
    assert _answer(InvalidIdentity("x", http_status=422))[0] == 422
    assert _answer(InvalidIdentity("x"))[0] == 400


def test_a_database_error_answers_503_with_retry_after():
    assert _answer(OperationalError(1205, "Lock wait timeout exceeded")) == (
        503, {"error": "temporarily_unavailable", "detail": "retry later"}, "5")


def test_drf_errors_keep_their_status_and_answer_a_text_detail():
    response = exception_handler(exceptions.NotAuthenticated(), {})
    assert (response.status_code, response.data) == (
        401, {"error": "not_authenticated", "detail": "Authentication credentials were not provided."})
    invalid = exception_handler(exceptions.ValidationError({"fields": ["required"]}), {})
    assert (invalid.status_code, invalid.data) == (400, {"error": "invalid", "detail": {"fields": ["required"]}})


def test_an_unknown_exception_is_left_to_django():
    assert exception_handler(ValueError("bug"), {}) is None
