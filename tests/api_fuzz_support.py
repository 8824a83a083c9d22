"""The REST API fuzz's set-up: the org's data, gunicorn on the test databases and ``st run`` (schemathesis 4).

``tests/test_api_schema_fuzz.py`` (every operation against its schema) and
``tests/test_api_schema_fuzz_cross_org.py`` (another org's operator) use the
``org_data`` and ``web`` fixtures (registered in ``tests/conftest.py``) and
:func:`fuzz_config` / :func:`st_run`; the fuzz's design is told in the first.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import httpx
import pytest
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.test import Client

from connectors.models import Event
from nexusflow.flows.models import FlowRun
from nexusflow.kernel.net import free_local_port
from nexusflow.records.metadata import current_view
from nexusflow.records.models import Record
from packs.demo.run import Processes, web_server_argv
from packs.hubspot import webhook_route
from runtime_outbox.replay_guard import SUPPRESS_EXTERNAL_EFFECTS
from tests.conftest import ORG, drain, hubspot_event, make_serving_org, post_signed, subprocess_env

ROOT = Path(settings.BASE_DIR)
ACCOUNT, CHANNEL = "crm-webhooks", "webhooks"
OTHER_ORG = "fuzz-other-org"
OPERATOR, OTHER_OPERATOR, PASSWORD = "fuzz-operator", "fuzz-other-operator", "fuzz-pass-1"
REPLAY_ID = "fuzz-replay-1"
READY_TIMEOUT_SECONDS = 60.0
#: The fuzz: fixed seed, examples per operation in the fuzzing phase, the phases run.
SEED = 20261204
MAX_EXAMPLES = 40
PHASES = "examples,coverage,fuzzing,stateful"
#: Every schemathesis check, but positive data acceptance: tests/api_fuzz_hooks.py's replaces it.
CHECKS = ("all",)
EXCLUDED_CHECKS = ("positive_data_acceptance",)
RUN_TIMEOUT_SECONDS = 600
REQUEST_TIMEOUT_SECONDS = 60
#: The environment variable holding the webhook route's secret (tests/conftest.py sets it).
WEBHOOK_SECRET_ENV = "NEXUS_TEST_WEBHOOK_SECRET"
#: The CSRF secret the runs send as cookie and header: DRF checks CSRF for a session-authenticated write.
CSRF_SECRET = "fuzzCSRFsecret0123456789abcdefAB"


def wait_healthy(proc, base: str, log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"gunicorn exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(base + "/api/v2/health/", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, f"gunicorn did not answer within {READY_TIMEOUT_SECONDS:.0f} s"
        time.sleep(0.1)


@pytest.fixture
def org_data(billing_sandbox, client) -> dict:
    """The org's identifiers: two records per object, a terminal event, its replay and a Flow run (committed)."""
    make_serving_org(billing_sandbox.base_url)
    operator = User.objects.create_user(OPERATOR, password=PASSWORD, is_staff=True)
    operator.groups.add(Group.objects.create(name=f"org:{ORG}"))
    other = User.objects.create_user(OTHER_OPERATOR, password=PASSWORD, is_staff=True)
    other.groups.add(Group.objects.create(name=f"org:{OTHER_ORG}"))
    assert post_signed(client, [hubspot_event(1, 501, 1000), hubspot_event(2, 502, 1001)]).status_code == 202
    drain()
    client.force_login(operator)
    for object_name, fields in (("Lead", {"email": "fuzz-lead@example.org", "lastname": "Fuzz"}),
                                ("Lead", {"email": "fuzz-lead-2@example.org", "lastname": "Fuzz"}),
                                ("Contact", {"email": "fuzz-contact@example.org", "lifecyclestage": "customer"})):
        response = client.post(f"/api/v2/records/{object_name}/", data=json.dumps({"fields": fields}),
                               content_type="application/json")
        assert response.status_code == 201, response.content
    drain()
    event = Event.objects.filter(org_id=ORG, event_generation="live").order_by("id").first()
    assert event is not None
    replay = client.post("/api/v2/replays/", content_type="application/json", data=json.dumps({
        "account_key": ACCOUNT, "replay_id": REPLAY_ID, "predecessor_event_id": event.pk,
        "reason": "schema fuzz", "external_effects": SUPPRESS_EXTERNAL_EFFECTS}))
    assert replay.status_code == 201, replay.content
    records = list(Record.objects.filter(org_id=ORG, is_deleted=False).values_list("object_name", "record_key"))
    runs = [str(pk) for pk in FlowRun.objects.filter(org_id=ORG).order_by("id").values_list("id", flat=True)]
    assert records and runs, (records, runs)
    sessions = {}
    for user in (operator, other):  # a session per operator: the runs skip a password hash per request
        session = Client()
        session.force_login(user)
        sessions[user.username] = session.cookies[settings.SESSION_COOKIE_NAME].value
    return {"objects": sorted({name for name, _ in records}), "record_keys": sorted(key for _, key in records),
            "event_ids": [event.pk], "run_ids": runs, "replay_digest": replay.json()["request_digest"],
            "sessions": sessions}


@pytest.fixture
def web(org_data, tmp_path):
    """Base URL of gunicorn serving the test databases (started after the org's data committed)."""
    port = free_local_port()
    procs = Processes()
    proc = procs.start("web", web_server_argv(port, workers=1), subprocess_env(), tmp_path)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, base, tmp_path / "web.log")
        yield base
    finally:
        procs.stop_all()


def toml_list(values) -> str:
    return json.dumps(list(values))


def fuzz_config(org_data: dict, *, probability: float) -> str:
    """The run's configuration (TOML): hooks, deterministic generation, and the identifiers that exist."""
    dictionaries = {
        "objects": org_data["objects"], "record_keys": org_data["record_keys"], "accounts": [ACCOUNT],
        "channels": [CHANNEL], "replays": [REPLAY_ID], "orgs": [ORG], "runs": org_data["run_ids"],
    }
    bindings = {
        "path.object_name": "objects", "path.record_key": "record_keys", "path.account_key": "accounts",
        "path.channel": "channels", "path.replay_id": "replays", "path.org_id": "orgs", "path.run_id": "runs",
        "body.account_key": "accounts", "body.target_key": "record_keys", "body.target_object": "objects",
        "body.predecessor_event_id": "events", "body.org_id": "orgs",
    }
    # No cache: a run must not replay what an earlier one found, nor write into the repository. Deterministic
    # generation (Hypothesis derandomized) without the time-based health check and with a generous request
    # timeout: a loaded machine runs the same cases, only slower. The session cookie is the run's credential:
    # no generated cookie may replace it.
    lines = ['hooks = "tests.api_fuzz_hooks"', 'suppress-health-check = ["too_slow"]',
             f"request-timeout = {REQUEST_TIMEOUT_SECONDS}", "", "[cache]", "enabled = false", "", "[generation]",
             "deterministic = true", 'database = "none"', f"max-examples = {MAX_EXAMPLES}",
             "with-security-parameters = false", ""]
    for name, values in dictionaries.items():
        lines += [f"[dictionaries.{name}]", f"values = {toml_list(values)}", ""]
    lines += ["[dictionaries.events]", f"values = {toml_list(org_data['event_ids'])}", "", "[parameters]"]
    lines += [f'"{key}" = {{ dictionary = "{name}", probability = {probability} }}' for key, name in bindings.items()]
    return "\n".join(lines) + "\n"


def st_run(base: str, tmp_path: Path, config: str, *, user: str, session: str,
           foreign: list[str] = ()) -> tuple[str, ET.Element]:
    """Run ``st run`` against ``base`` as ``user`` (its ``session`` key); return its output and its JUnit report.

    The runs authenticate with the operator's session (with its CSRF token), not HTTP basic: basic
    authentication hashes the password on every request, which would cost most of the run's time.
    """
    config_file = tmp_path / f"schemathesis-{user}.toml"
    config_file.write_text(config)
    junit = tmp_path / f"junit-{user}.xml"
    argv = [str(Path(sys.executable).with_name("st")), "--no-color", "--config-file", str(config_file), "run",
            f"{base}/api/schema/?format=json", "--header",
            f"Cookie: {settings.SESSION_COOKIE_NAME}={session}; {settings.CSRF_COOKIE_NAME}={CSRF_SECRET}",
            "--header", f"X-CSRFToken: {CSRF_SECRET}", "--checks", ",".join(CHECKS),
            "--exclude-checks", ",".join(EXCLUDED_CHECKS),
            "--seed", str(SEED), "--workers", "1", "--phases", PHASES, "--report", "junit,ndjson", "--report-dir", str(tmp_path),
            "--report-junit-path", str(junit)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NEXUS_FUZZ_FOREIGN_IDS": json.dumps(list(foreign)),
           "NEXUS_FUZZ_FIELDS": json.dumps({name: sorted(definition.fields)
                                             for name, definition in current_view().objects.items()}),
           "NEXUS_FUZZ_SIGNED_INGRESS": json.dumps({
               "path": "/api/v2/ingress/{account_key}/{channel}/", "account_key": ACCOUNT, "channel": CHANNEL,
               "auth": webhook_route()["auth"], "secret_env": WEBHOOK_SECRET_ENV})}
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_SECONDS)
    output = done.stdout + done.stderr
    (tmp_path / f"st-{user}.log").write_text(output)
    assert done.returncode == 0, output[-20000:]
    return output, ET.parse(junit).getroot()
