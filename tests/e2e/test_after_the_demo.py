"""One run of ``manage.py demo``, three checks of what it leaves: its summary and dump keep their contract,
``GET /metrics`` equals what its databases hold (issue 22), and no table and no log holds a secret (issue 23
item 4; seed 004 section 17.3). The demo runs once for the module (a real child process, about half a minute):
each check reads what that run left and changes nothing of it.

The metrics: the scrape reads the demo's databases, and every family is compared with an independent count
of the authoritative tables (seed 004 section 19: metrics come from state, never from logs or in-process
counters).

The secrets:

``manage.py demo`` runs as a real child process (``NEXUS_LOG_FORMAT=json``)
on this test's databases with its own run directory. Then every table of the
two databases it used (``<main>_demo`` and ``<main>_demo_control``) is dumped
with ``mariadb-dump`` and the dump text, the demo's own output and every log
file of its processes are scanned for each secret of the run: the webhook
signing secret, the billing API key (sent as a bearer token), and the Django
``SECRET_KEY``, each in plain form and in the obvious encodings (hex,
base64 at each alignment, URL-encoded, the ``Bearer <token>`` header).

The secret bytes are read back from the run's versioned secret backend
(``run_dir/secrets``): that they are there, and only there, is part of the
contract (``connectors/serving/secret_store.py``). A finding names the log
file, or the table and column of the ``INSERT`` that holds it, never the
secret itself. Two controls keep the scan from passing vacuously: the dump
must hold the job's rows, and a secret planted into a scratch copy of the
dump text must be found where it was planted.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import secrets
import subprocess
import urllib.parse
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.db import connections

from connectors.models import (
    AccountServingGate,
    CredentialGenerationDispatchGate,
    DispatchPermit,
    RemoteEffect,
    RemoteEffectAttempt,
)
from nexusflow.flows.models import FlowCheckpoint, FlowRun, FlowStepAttempt, FlowWakeSignal
from nexusflow.kernel.metrics import reason_machines
from packs.demo.run import demo_database_names
from tests.conftest import hubspot_event, run_manage, subprocess_env
from tests.kernel.test_metrics import scrape_metrics

#: The mark makes pytest-django create this worker's test databases even when no other file of the session needs
#: them; the demo derives its own databases' names from theirs.
pytestmark = [pytest.mark.django_db(databases=["default", "control"]), pytest.mark.timeout(170)]

ORG = "demo-org"
#: (account_key, credential_ref) of every credential generation ``packs/demo/service.json`` publishes.
DEMO_CREDENTIALS = (("crm-webhooks", "webhook_secret"), ("billing-main", "api_key"))
#: Tables the main job must have written for the scan to mean anything.
REQUIRED_TABLES = ("connectors_receipt", "connectors_event", "runtime_outbox_outboundcommand",
                   "connectors_remoteeffect", "connectors_remoteeffectattempt", "flows_flowrun")


# --- the scanner -------------------------------------------------------------------------------------------------

def secret_forms(secret: bytes) -> dict[str, str]:
    """Every text form of ``secret`` the scan looks for: ``{form name: text}`` (compared case-insensitively for hex).

    Base64 is taken at each of the three alignments a secret embedded in a
    longer encoded value can have (the edge characters that depend on the
    neighbouring bytes are cut off).
    """
    text = secret.decode("utf-8")
    # The HMAC signing key is the secret's bytes, so "hex" is also the key's hex. "sha256" is a bare digest of the
    # secret: no profile digest covers secret bytes, and a bare one would let a guess be confirmed offline.
    forms = {"plain": text, "hex": secret.hex(), "sha256": hashlib.sha256(secret).hexdigest(),
             "url": urllib.parse.quote(text, safe=""),
             "url_plus": urllib.parse.quote_plus(text), "bearer": f"Bearer {text}",
             "json": json.dumps(text)[1:-1]}
    for shift in range(3):
        for name, encode in (("base64", base64.b64encode), ("base64url", base64.urlsafe_b64encode)):
            encoded = encode(b"\x00" * shift + secret).decode("ascii").rstrip("=")
            # drop the characters that mix in the padding bytes before it and the unknown bytes after it
            start = {0: 0, 1: 2, 2: 3}[shift]
            forms[f"{name}@{shift}"] = encoded[start:-2]
    return forms


_HEX_FORMS = frozenset({"hex", "sha256"})  # compared case-insensitively (--hex-blob writes upper case)
_TOKEN = re.compile(r"'(?:[^'\\]|\\.)*'|0x[0-9A-Fa-f]*|NULL|-?[0-9][0-9.eE+-]*|_binary\s*'(?:[^'\\]|\\.)*'", re.S)
_INSERT = re.compile(r"^INSERT INTO `(?P<table>[^`]+)` (?:\((?P<columns>[^)]*)\) )?VALUES \(", re.M)


def _columns_at(line: str) -> tuple[str, list[tuple[int, int, str]]]:
    """``(table, [(start, end, column)])`` of one ``INSERT`` line of the dump (``--complete-insert``)."""
    match = _INSERT.match(line)
    if match is None:
        return "", []
    names = [c.strip().strip("`") for c in (match.group("columns") or "").split(",")] if match.group("columns") else []
    spans, pos, index = [], match.end(), 0
    while pos < len(line):
        token = _TOKEN.match(line, pos)
        if token is None:
            break
        name = names[index] if index < len(names) else f"column #{index + 1}"
        spans.append((token.start(), token.end(), name))
        index += 1
        pos = token.end()
        while pos < len(line) and line[pos] in ", ":
            pos += 1
    return match.group("table"), spans


@dataclass(frozen=True)
class Finding:
    secret: str   # the secret's name, never its value
    form: str
    where: str    # "table.column" or a log file name

    def __str__(self) -> str:
        return f"{self.secret} ({self.form}) in {self.where}"


def scan_dump(dump: str, named_secrets: dict[str, bytes]) -> list[Finding]:
    """Every place of ``dump`` (``mariadb-dump`` text) holding a form of a secret, as table and column."""
    findings: set[Finding] = set()
    for line in dump.splitlines():
        folded = line.lower()
        for secret_name, secret in named_secrets.items():
            for form, text in secret_forms(secret).items():
                haystack, needle = (folded, text.lower()) if form in _HEX_FORMS else (line, text)
                at = haystack.find(needle)
                if at < 0:
                    continue
                table, spans = _columns_at(line)
                column = next((name for start, end, name in spans if start <= at < end), "?")
                findings.add(Finding(secret_name, form, f"{table or 'dump'}.{column}"))
    return sorted(findings, key=str)


def scan_text(text: str, where: str, named_secrets: dict[str, bytes]) -> list[Finding]:
    """Every form of a secret found in one log text, named by ``where``."""
    folded = text.lower()
    return [Finding(secret_name, form, where) for secret_name, secret in named_secrets.items()
            for form, needle in secret_forms(secret).items()
            if (needle.lower() in folded if form in _HEX_FORMS else needle in text)]


def dump_databases(names: list[str]) -> str:
    """The data (no schema) of every table of ``names``, one row per ``INSERT`` with column names, blobs in hex."""
    cfg = connections["default"].settings_dict
    env = {**os.environ, "MYSQL_PWD": cfg["PASSWORD"] or ""}
    argv = ["mariadb-dump", "--protocol=TCP", f"--host={cfg['HOST'] or '127.0.0.1'}", f"--port={cfg['PORT'] or 3306}",
            f"--user={cfg['USER']}", "--no-create-info", "--skip-extended-insert", "--complete-insert", "--hex-blob",
            "--skip-comments", "--skip-dump-date", "--databases", *names]
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


# --- the demo run --------------------------------------------------------------------------------------------------

def _demo_events(path: Path) -> None:
    """A small webhook file exercising the whole job: a create pushed to billing, an update, a redelivery, bad signatures."""
    batch = [hubspot_event(1, 7301, 1000), hubspot_event(2, 7301, 2000, "email", "kim@example.com"),
             hubspot_event(3, 7301, 3000, "firstname", "Kim"),
             hubspot_event(4, 7301, 4000, "lifecyclestage", "customer"),
             hubspot_event(5, 7302, 1000, "email", "jo@example.com")]
    later = [hubspot_event(6, 7301, 5000, "lastname", "Park")]
    lines = [{"body": batch}, {"body": [{**e, "attemptNumber": 1} for e in batch]}, {"body": later},
             {"body": batch[:1], "sign": "invalid"}, {"body": batch[:1], "sign": "stale"}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")


def _published_secrets(secrets_dir: Path) -> dict[str, bytes]:
    """``{"account/credential_ref": bytes}`` of every secret version the run's backend holds."""
    found = {}
    for account, ref in DEMO_CREDENTIALS:
        versions = sorted((secrets_dir / ORG / account / ref).iterdir())
        assert versions, f"no secret version of {account}/{ref} in the backend"
        for version in versions:
            found[f"{account}/{ref}@{version.name}"] = version.read_bytes()
    return found


@dataclass(frozen=True)
class DemoRun:
    """What the module's one demo run left: its JSON summary, its ``--dump`` state, the secrets it used
    (by name), the ``mariadb-dump`` text of its databases and its output and logs (by name)."""

    summary: dict
    state: dict
    named: dict[str, bytes]
    dump: str
    logs: dict[str, str]


@pytest.fixture(scope="module")
def demo_run(django_db_setup, tmp_path_factory) -> DemoRun:
    """Run the demo once for this module (``NEXUS_LOG_FORMAT=json``, a run directory and a ``--dump`` of its own).

    The demo writes only its own databases (derived from this test database's
    name), so this process opens no connection.
    """
    tmp_path = tmp_path_factory.mktemp("after-the-demo")
    events, run_dir, dump_file = tmp_path / "events.jsonl", tmp_path / "run", tmp_path / "dump.json"
    _demo_events(events)
    django_key = "nf-django-" + secrets.token_hex(20)
    env = subprocess_env(NEXUS_LOG_FORMAT="json", NEXUS_LOG_LEVEL="INFO", NEXUS_SECRET_KEY=django_key)
    result = run_manage(["demo", "--events", str(events), "--json", "--run-dir", str(run_dir),
                         "--dump", str(dump_file)], env, timeout=150)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])

    named = {**_published_secrets(run_dir / "secrets"), "django SECRET_KEY": django_key.encode()}
    logs = {"demo stdout": result.stdout, "demo stderr": result.stderr}
    logs.update({path.name: path.read_text(encoding="utf-8", errors="replace")
                 for path in sorted(run_dir.glob("*.log"))})
    main = connections["default"].settings_dict["NAME"]
    assert main.startswith("test_"), main  # the demo ran beside the test databases, never the developer's
    dump = dump_databases(list(demo_database_names(main)))
    return DemoRun(summary, json.loads(dump_file.read_text()), named, dump, logs)


# --- its contract: the JSON summary and the dump ---------------------------------------------------------------

INT_KEYS = ["deliveries", "accepted", "redeliveries", "rejected", "events_admitted", "executions_completed",
            "superseded", "quarantined", "remote_creates", "remote_updates", "duplicate_remote_creates",
            "uncertain_effects", "quarantined_effects", "attention_effects", "benign_effects", "flow_runs_ended",
            "attention_flow_runs", "attention", "benign", "nonterminal"]


def test_the_demo_summary_and_dump_keep_their_contract(demo_run):
    summary, state = demo_run.summary, demo_run.state
    assert all(isinstance(summary[k], int) and not isinstance(summary[k], bool) for k in INT_KEYS)
    assert summary["invariants_ok"] is True
    assert (summary["deliveries"], summary["accepted"], summary["redeliveries"], summary["rejected"]) == (5, 2, 1, 2)
    assert summary["events_admitted"] == 6 and summary["remote_creates"] == 1
    assert summary["duplicate_remote_creates"] == 0 and summary["nonterminal"] == 0
    assert summary["attention_effects"] == 0 and summary["attention"] == sum(summary["attention_codes"].values())
    assert summary["attention_flow_runs"] == 0
    assert summary["quarantined_effects"] <= summary["benign_effects"]  # every parked effect here is benign
    assert state["local"]["7301"] == {"email": "kim@example.com", "firstname": "Kim", "lastname": "Park",
                                      "lifecyclestage": "customer", "billing_id": state["remote"][0]["id"]}
    assert state["local"]["7302"]["billing_id"] is None
    # One remote customer, created once and updated by the later lastname event.
    assert state["remote"] == [{"id": state["remote"][0]["id"], "email": "kim@example.com", "name": "Kim Park",
                                "create_requests": 1}]


# --- its metrics ---------------------------------------------------------------------------------------------------

def _family(samples: dict, name: str, *label_names: str) -> dict:
    """``{label values: value}`` of one sample name (every sample of it)."""
    out = {}
    for (sample, labels), value in samples.items():
        if sample == name:
            by_name = dict(labels)
            out[tuple(by_name[n] for n in label_names)] = value
    return out


def _nonzero(family: dict) -> dict:
    return {key: value for key, value in family.items() if value}


@pytest.mark.django_db(transaction=True, databases=["default", "control"])
def test_metrics_after_the_demo_match_the_database(demo_run):
    assert demo_run.summary["remote_creates"] == 1 and demo_run.summary["nonterminal"] == 0
    with demo_databases():
        check_metrics_against_database()


@contextmanager
def demo_databases():
    """Point this process's connections at the databases the demo ran in (``packs/demo/run.py``), then back."""
    names = {alias: connections[alias].settings_dict["NAME"] for alias in ("default", "control")}
    demo = dict(zip(("default", "control"), demo_database_names(names["default"]), strict=True))
    for alias in names:
        connections[alias].close()
        connections[alias].settings_dict["NAME"] = demo[alias]
    try:
        yield
    finally:
        for alias, name in names.items():
            connections[alias].close()
            connections[alias].settings_dict["NAME"] = name


def check_metrics_against_database():
    samples = scrape_metrics()

    runs = Counter(FlowRun.objects.values_list("state", flat=True))
    assert _nonzero(_family(samples, "nexusflow_flow_runs", "state")) == {(s,): n for s, n in runs.items()}

    effects = Counter(RemoteEffect.objects.values_list("state", "reason_code"))
    assert sum(effects.values()) >= 1
    assert _family(samples, "nexusflow_effects", "state", "reason_code") == dict(effects)

    assert sum(runs.values()) >= 1
    attempts = FlowStepAttempt.objects.count()
    assert attempts >= 1
    finished = Counter(FlowStepAttempt.objects.filter(finished_at__isnull=False)
                       .values_list("step__step_kind", "step__plan_step_key"))
    assert _family(samples, "nexusflow_flow_step_attempt_duration_seconds_count", "step_kind", "plan_step") == \
        dict(finished)
    wakes = FlowWakeSignal.objects.filter(state="consumed").count()
    assert samples[("nexusflow_flow_wake_latency_seconds_count", ())] == wakes
    assert samples[("nexusflow_flow_step_claims_total", ())] == attempts
    by_outcome = Counter(FlowStepAttempt.objects.values_list("state", "failure_class"))
    assert _family(samples, "nexusflow_flow_step_attempts_total", "state", "failure_class") == dict(by_outcome)
    retries = {("flow",): FlowStepAttempt.objects.filter(attempt_number__gt=1).count(),
               ("egress",): RemoteEffectAttempt.objects.filter(attempt_number__gt=1).count()}
    assert _family(samples, "nexusflow_retries_total", "role") == retries

    assert samples[("nexusflow_flow_checkpoint_bytes_count", ())] == FlowCheckpoint.objects.count() >= 1
    submitted = RemoteEffectAttempt.objects.filter(attempt_number=1).count()
    assert submitted >= 1
    assert samples[("nexusflow_effect_submit_latency_seconds_count", ())] == submitted
    finalized = RemoteEffect.objects.filter(state="finalized").count()
    assert samples[("nexusflow_effect_completion_latency_seconds_count", (("state", "finalized"),))] == finalized

    open_permits = Counter(DispatchPermit.objects.filter(state__in=("granted", "sending")).values_list("state", flat=True))
    assert _family(samples, "nexusflow_dispatch_permits_open", "state") == {(s,): n for s, n in open_permits.items()}

    gates = Counter(("account_serving", s) for s in AccountServingGate.objects.values_list("state", flat=True))
    gates.update(("credential_dispatch", s) for s in CredentialGenerationDispatchGate.objects.values_list("state", flat=True))
    assert sum(gates.values()) >= 1
    assert _family(samples, "nexusflow_gates", "gate", "state") == dict(gates)

    # Nothing is left due after the demo drained its work: every queue reads empty.
    assert not _nonzero(_family(samples, "nexusflow_queue_depth", "role", "lane"))

    reason_rows = {}
    for name, model, states, _since in reason_machines():
        carried = model.objects.filter(state__in=states).exclude(reason_code="").values_list("state", "reason_code")
        reason_rows.update({(name, state, code): n for (state, code), n in Counter(carried).items()})
    assert _family(samples, "nexusflow_reason_rows", "machine", "state", "reason_code") == reason_rows


# --- no secret anywhere --------------------------------------------------------------------------------------------

def test_no_secret_in_any_table_or_log_after_the_demo(demo_run):
    named, dump, logs = demo_run.named, demo_run.dump, demo_run.logs
    # (assertions name secrets, never show them: pytest would print the values of an asserted expression)
    sizes = {secret_name: len(value) for secret_name, value in named.items()}
    assert len(sizes) == 3 and min(sizes.values()) >= 16, sizes
    # Not vacuous: the job's rows are in the dump, and the processes did log (as JSON lines).
    inserted = {m.group("table") for m in _INSERT.finditer(dump)}
    assert set(REQUIRED_TABLES) <= inserted, sorted(set(REQUIRED_TABLES) - inserted)
    worker_logs = [name for name in logs if name.startswith("worker-")]
    assert worker_logs and any(line.startswith("{") for name in worker_logs for line in logs[name].splitlines())

    findings = scan_dump(dump, named)
    for name, text in logs.items():
        findings += scan_text(text, f"log {name}", named)
    report = [str(f) for f in findings]
    assert not report, "secret material found: " + "; ".join(report)


def test_the_scan_finds_a_planted_secret_where_it_was_planted(demo_run):
    """Positive control: each form of a secret planted into a scratch copy of the dump is reported by table and column."""
    named, dump, logs = demo_run.named, demo_run.dump, demo_run.logs
    name, secret = next((n, s) for n, s in named.items() if n.startswith("billing-main/"))
    row = next(line for line in dump.splitlines() if line.startswith("INSERT INTO `connectors_remoteeffectattempt`"))
    table, spans = _columns_at(row)
    assert table == "connectors_remoteeffectattempt" and len(spans) > 3
    start, end, column = next(span for span in spans if row[span[0]] == "'")  # the first text column
    forms = secret_forms(secret)
    for form in ("plain", "hex", "sha256", "base64@0", "base64@1", "base64@2", "url", "bearer"):
        encoded = {"hex": secret.hex().upper(), "base64@1": base64.b64encode(b"x" + secret).decode(),
                   "base64@2": base64.b64encode(b"xy" + secret).decode(),
                   "base64@0": base64.b64encode(secret).decode()}.get(form, forms[form])
        planted = row[:start + 1] + "prefix " + encoded + " suffix" + row[start + 1:]
        scratch = dump.replace(row, planted, 1)
        found = [str(f) for f in scan_dump(scratch, {name: secret})]
        assert str(Finding(name, form, f"{table}.{column}")) in found, (form, found)
    # The real dump stays clean of it, and a hex blob holding it is found too.
    clean = [str(f) for f in scan_dump(dump, {name: secret})]
    assert not clean, clean
    blob = f"INSERT INTO `scratch_blob` (`payload`) VALUES (0x{(b'ab' + secret).hex().upper()});"
    found = [str(f) for f in scan_dump(dump + "\n" + blob + "\n", {name: secret})]
    assert str(Finding(name, "hex", "scratch_blob.payload")) in found, found
    # A log line holding the header form is found too, named by its file.
    name_of_log = next(n for n in logs if n.startswith("worker-egress"))
    scratch_log = logs[name_of_log] + f'{{"event": "sent", "headers": {{"Authorization": "Bearer {secret.decode()}"}}}}\n'
    found = [str(f) for f in scan_text(scratch_log, f"log {name_of_log}", {name: secret})]
    assert str(Finding(name, "bearer", f"log {name_of_log}")) in found, found
