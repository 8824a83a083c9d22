"""A property-based fuzz of every operation of the OpenAPI schema against the running server (schemathesis).

The real web server (gunicorn, as the demo starts it) serves the test
databases, where an org is serving, two of its records, an admitted and
replayed webhook event and its Flow run exist. ``st run`` (schemathesis 4)
reads the schema from the server and sends malformed, oversized and
schema-valid requests to every operation as an operator of that org, with a
fixed seed, deterministic generation and a bounded number of examples, so the
run does not depend on load. Its configuration binds path and body
parameters, half of the time, to the identifiers that exist, so the
generated cases reach past the 404s; the schema's links lead from a created
record or replay to the operations that read or change it.

Checks: no 5xx (``not_a_server_error``), each answer's status and body are
the ones the schema documents (``status_code_conformance``,
``content_type_conformance``, ``response_schema_conformance``: an error code
the schema does not list fails), and a request the schema calls valid is
accepted unless the schema lists its refusal as state-dependent
(``tests/api_fuzz_hooks.py``). Every operation of the schema is tested.

Cross-org (``tests/test_api_schema_fuzz_cross_org.py``, a file of its own
so that a second test worker runs it beside this one): an operator of
another org gets 403/404 for each of the org's identifiers and never its
data. The set-up is ``tests/api_fuzz_support.py``'s.
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import httpx
import pytest

from tests.api_fuzz_support import OPERATOR, fuzz_config, st_run

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "control"])


#: The operation serving the schema: ``st run`` reads the schema from it and does not fuzz it.
SCHEMA_OPERATION = "GET /api/schema/"


def _schema_operations(base: str) -> set[str]:
    """Every operation of the served schema, as ``st`` labels them (``METHOD /path``)."""
    schema = httpx.get(f"{base}/api/schema/?format=json", timeout=10).json()
    return {f"{method.upper()} {path}" for path, item in schema["paths"].items() for method in item
            if method in {"get", "put", "post", "patch", "delete", "head", "options", "trace"}}


#: The JUnit test case of the stateful phase (it follows the schema's links across operations).
STATEFUL = "Stateful tests"


def _tested_operations(report: ET.Element) -> set[str]:
    return {case.get("name") for case in report.iter("testcase")}


def _generated_cases(output: str) -> int:
    found = re.search(r"(\d+) generated", output)
    assert found, output[-3000:]
    return int(found.group(1))


def test_every_operation_holds_to_its_schema_under_fuzz(web, org_data, tmp_path):
    output, report = st_run(web, tmp_path, fuzz_config(org_data, probability=0.5), user=OPERATOR,
                            session=org_data["sessions"][OPERATOR])
    operations = _schema_operations(web)
    assert SCHEMA_OPERATION in operations
    assert _tested_operations(report) - {STATEFUL} == operations - {SCHEMA_OPERATION}
    assert _generated_cases(output) >= 10 * len(operations), output[-3000:]
