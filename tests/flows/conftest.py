"""Fixtures for the Flow Runtime tests: flows, plans and rows in any state."""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.db import transaction

from nexusflow.kernel.scope import OrgScope

from .rows import Rows

ROOT = Path(settings.BASE_DIR)
DEMO_FLOW = ROOT / "metadata" / "flows" / "Contact_Push_Customer_To_Billing.flow-meta.xml"
#: The real Flow corpus (``tests/corpus/flows``; origins and licences in ``tests/corpus/SOURCES.tsv``).
CORPUS = ROOT / "tests" / "corpus" / "flows"
FLOW_ORG = "flows-test-org"
OBJECT = "Contact"  # the demo metadata object (tests may name it; L0 code may not)


def decision_flow_xml(*, filter_value: str = "customer", record_trigger_type: str = "CreateAndUpdate",
                      extra_elements: str = "", start_target: str = "Has_Email") -> bytes:
    """A record-triggered flow with one decision and no effect: decide -> end.

    Without an effect it would prove Bounded Atomic; it requests Durable
    Orchestration explicitly so the step executor runs its decision step.
    """
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<Flow xmlns="http://soap.sforce.com/2006/04/metadata">
    <apiVersion>62.0</apiVersion>
    <decisions>
        <name>Has_Email</name>
        <label>Has Email</label>
        <locationX>176</locationX>
        <locationY>287</locationY>
        <defaultConnectorLabel>Default Outcome</defaultConnectorLabel>
        <rules>
            <name>Yes</name>
            <conditionLogic>and</conditionLogic>
            <conditions>
                <leftValueReference>$Record.email</leftValueReference>
                <operator>IsNull</operator>
                <rightValue>
                    <booleanValue>false</booleanValue>
                </rightValue>
            </conditions>
            <label>Yes</label>
        </rules>
    </decisions>{extra_elements}
    <label>Decide Only</label>
    <processMetadataValues>
        <name>ExecutionProfile</name>
        <value>
            <stringValue>DurableOrchestration</stringValue>
        </value>
    </processMetadataValues>
    <processType>AutoLaunchedFlow</processType>
    <start>
        <locationX>50</locationX>
        <locationY>0</locationY>
        <connector>
            <targetReference>{start_target}</targetReference>
        </connector>
        <filterLogic>and</filterLogic>
        <filters>
            <field>lifecyclestage</field>
            <operator>EqualTo</operator>
            <value>
                <stringValue>{filter_value}</stringValue>
            </value>
        </filters>
        <object>{OBJECT}</object>
        <recordTriggerType>{record_trigger_type}</recordTriggerType>
        <triggerType>RecordAfterSave</triggerType>
    </start>
    <status>Active</status>
</Flow>
""".encode()


@pytest.fixture
def org() -> OrgScope:
    return OrgScope(FLOW_ORG)


@pytest.fixture
def demo_source() -> bytes:
    return DEMO_FLOW.read_bytes()


#: The Flow files (and the ``Renewal__c`` object metadata, ``objects/``) of the wait tests.
WAITS = Path(__file__).with_name("fixtures") / "waits"


@pytest.fixture
def renewal_view(settings):
    """The process metadata view holds ``Renewal__c`` (``fixtures/waits/objects``) for one test."""
    from nexusflow.records.metadata import current_view

    current_view.cache_clear()
    settings.NEXUS_METADATA_DIR = WAITS
    current_view.cache_clear()
    yield current_view()
    current_view.cache_clear()


@pytest.fixture
def short_lease(monkeypatch):
    monkeypatch.setenv("NEXUS_FLOW_LEASE_SECONDS", "1")
    monkeypatch.setenv("NEXUS_FLOW_RETRY_BASE_SECONDS", "0")


TEAM = {"object": "Team__c", "label": "Team", "key_prefix": "a1T",
        "fields": [{"name": "Name", "type": "text", "max_length": 80},
                   {"name": "Member_Count__c", "type": "text", "max_length": 20}]}
MEMBER = {"object": "Member__c", "label": "Member", "key_prefix": "a1M",
          "fields": [{"name": "Name", "type": "text", "max_length": 80},
                     {"name": "Team__c", "type": "lookup", "references": "Team__c", "max_length": 18}]}


def _extended_view(settings, tmp_path, docs, users=()):
    """Point the metadata view at the project's objects plus ``docs`` (object documents) and ``users``
    (user documents) for one test; yield the folder."""
    from nexusflow.records.metadata import current_view

    objects = tmp_path / "metadata" / "objects"
    objects.mkdir(parents=True)
    for path in (Path(settings.BASE_DIR) / "metadata" / "objects").glob("*.object.json"):
        shutil.copy(path, objects / path.name)
    for doc in docs:
        (objects / f"{doc['object']}.object.json").write_text(json.dumps(doc), encoding="utf-8")
    if users:
        (tmp_path / "metadata" / "users").mkdir()
        for doc in users:
            (tmp_path / "metadata" / "users" / f"{doc['id']}.user.json").write_text(json.dumps(doc), encoding="utf-8")
    current_view.cache_clear()
    settings.NEXUS_METADATA_DIR = tmp_path / "metadata"
    current_view.cache_clear()
    yield tmp_path / "metadata"
    current_view.cache_clear()


#: The account of the message relay pack an org is served by in delivery tests (``serve_message_relay``).
RELAY_ACCOUNT = "message-relay"


def serve_message_relay(org: OrgScope, base_url: str) -> None:
    """Serve ``org`` by one message relay account at ``base_url`` (its contracts deliver emailSimple's ``email``
    and customNotificationAction's ``notification`` families) and cut it over greenfield, as an operator configures it. The relay's key is the test billing
    key (``NEXUS_TEST_BILLING_KEY``)."""
    from django.conf import settings

    from connectors.serving.gates import service_configuration_apply
    from connectors.serving.generations import credential_publish, pack_publish_file
    from cutover.services import cutover_greenfield
    from tests.conftest import SECRET_VERSION

    pack_publish_file(Path(settings.NEXUS_PACKS_DIR) / "message_relay" / "pack.json")
    credential_publish(org=org, document={
        "account_key": RELAY_ACCOUNT, "credential_ref": "api_key", "version": SECRET_VERSION,
        "secret": {"from_env": "NEXUS_TEST_BILLING_KEY"}, "transport": {"scheme": "bearer"}})
    service_configuration_apply(org=org, document={"accounts": [
        {"account_key": RELAY_ACCOUNT, "pack": "message_relay", "push_contracts": ["message_relay.email", "message_relay.notification"],
         "base_url": base_url, "credentials": {"api_key": SECRET_VERSION}}]})
    cutover_greenfield(org=org)


@pytest.fixture
def message_relay():
    """A running message relay sandbox accepting the test billing key."""
    from packs.message_relay.sandbox import MessageRelaySandbox
    from tests.conftest import BILLING_KEY

    with MessageRelaySandbox(BILLING_KEY) as relay:
        yield relay


@pytest.fixture
def team_view(settings, tmp_path):
    """The project's objects plus ``Team__c`` (a member count) and ``Member__c`` (a lookup to its team)."""
    yield from _extended_view(settings, tmp_path, (TEAM, MEMBER))


@pytest.fixture
def delivery_view(settings, tmp_path):
    """The project's objects plus the corpus metadata's ``EmailMessage`` and ``FlowNotification`` (the message
    objects the message relay pack's contracts push) and the user Flows run as, with an email address."""
    docs = [json.loads((CORPUS_METADATA / "objects" / f"{name}.object.json").read_text(encoding="utf-8"))
            for name in ("EmailMessage", "FlowNotification")]
    user = json.loads((CORPUS_METADATA / "users" / "automated_process.user.json").read_text(encoding="utf-8"))
    yield from _extended_view(settings, tmp_path, docs, (user,))


#: The objects, fields and quick actions the corpus flows name (their metadata, which the corpus does not ship).
CORPUS_METADATA = Path(__file__).parent / "fixtures" / "corpus_metadata"


@pytest.fixture
def corpus_view(settings):
    """Point the process metadata view at the corpus metadata for one test (the view is loaded once per process)."""
    from nexusflow.records.metadata import current_view

    current_view.cache_clear()
    settings.NEXUS_METADATA_DIR = CORPUS_METADATA
    current_view.cache_clear()
    view = current_view()
    yield view
    current_view.cache_clear()


def save_record(org: OrgScope, values: dict, *, object_name: str = OBJECT):
    from nexusflow.records.services import record_create

    with transaction.atomic():
        return record_create(org=org, object_name=object_name, values=values)


def update_record(org: OrgScope, record, changes: dict):
    from nexusflow.records.services import record_lock, record_update

    with transaction.atomic():
        locked = record_lock(org=org, object_name=record.object_name, record_key=record.record_key)
        record_update(org=org, record=locked, changes=changes)
        return locked


def run_until_idle(*, worker_id: str = "test-worker", max_rounds: int = 50) -> int:
    """Run the Flow worker units in-process until none has work."""
    from nexusflow.flows.services import (
        flow_try_cancel_cleanup_one,
        flow_try_expire_one,
        flow_try_recover_expired_one,
        flow_try_repair_one,
        flow_try_resume_due_one,
        flow_try_run_step_one,
        flow_try_schedule_one,
        flow_try_wake_one,
    )

    done = 0
    for _ in range(max_rounds):
        worked = [flow_try_wake_one(), flow_try_resume_due_one(), flow_try_run_step_one(worker_id=worker_id),
                  flow_try_recover_expired_one(), flow_try_expire_one(), flow_try_repair_one(),
                  flow_try_cancel_cleanup_one(), flow_try_schedule_one()]
        done += sum(worked)
        if not any(worked):
            return done
    raise AssertionError("flow work did not drain")


def wait_for_recovery(timeout: float = 10.0) -> None:
    """Poll expired-lease recovery until it fences one attempt."""
    from nexusflow.flows.services import flow_try_recover_expired_one

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if flow_try_recover_expired_one():
            return
        time.sleep(0.1)
    raise AssertionError("no expired lease was recovered")


@pytest.fixture
def rows(org) -> Rows:
    return Rows(org)
