"""A Flow's email is one message record, one intent and one convergent remote effect (issue "The Flow language
real flows use", item 6; seed 004 section 15; the outbound effect model of ARCHITECTURE.md).

A record-triggered Durable Orchestration flow on Contact sends ``emailSimple`` to the saved contact. The org is
served by the message relay pack (``packs/message_relay``, a loopback sandbox with idempotency keys) and nothing
else.
"""
from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from connectors.contracts.pack_document import PackError, validate_pack_document
from nexusflow.flows import transitions as t
from nexusflow.flows.models import FlowRun
from nexusflow.flows.services import flow_deploy, flow_try_run_step_one
from nexusflow.records.models import Record
from runtime_outbox.models import OutboundCommand
from tests.conftest import ROOT, drain, subprocess_env

from . import flowxml as fx
from .conftest import save_record, serve_message_relay, wait_for_recovery

pytestmark = [pytest.mark.django_db(transaction=True, databases=["default", "control"]),
              pytest.mark.usefixtures("delivery_view")]


def _email(extra: str = "") -> str:
    return ("<actionCalls><name>Welcome</name><label>Welcome</label><locationX>1</locationX><locationY>1</locationY>"
            "<actionName>emailSimple</actionName><actionType>emailSimple</actionType>"
            "<inputParameters><name>emailAddresses</name><value><elementReference>$Record.email</elementReference>"
            "</value></inputParameters>"
            "<inputParameters><name>emailSubject</name><value><stringValue>Welcome</stringValue></value>"
            "</inputParameters>"
            "<inputParameters><name>emailBody</name><value><elementReference>Greeting</elementReference></value>"
            f"</inputParameters>{extra}</actionCalls>")


def _deploy(org, extra: str = "") -> None:
    greeting = ("<formulas><name>Greeting</name><dataType>String</dataType><expression>"
                "&quot;Hello &quot; &amp; {!$Record.firstname} &amp; &quot;, from &quot; &amp; {!$User.Name}"
                "</expression></formulas>")
    source = fx.flow(_email(extra), greeting, start=fx.start("Welcome", trigger="RecordAfterSave", rtt="Create"),
                     profile="DurableOrchestration")
    assert flow_deploy(org=org, source=source, flow_api_name="Welcome_Contact").activated


def _contact(org, name="Ann"):
    return save_record(org, {"email": f"{name.lower()}@example.com", "firstname": name, "lastname": "Lee"})


def test_one_email_per_run_even_when_the_relay_answer_is_lost(org, message_relay, db_clock_advance):
    """The relay sends and then drops its answer: the effect is ``uncertain`` (parked, not guessed); once its
    backoff is due the reconciler repeats the request with the same idempotency key and the relay replays its
    first result. One email, one message record, one intent."""
    from connectors.models import RemoteEffect

    serve_message_relay(org, message_relay.base_url)
    _deploy(org)
    message_relay.set_faults(drop_response_after_commit=1)
    contact = _contact(org)
    drain()
    effect = RemoteEffect.objects.get(org_id=org.org_id)
    assert effect.state == "uncertain" and len(message_relay.state()["emails"]) == 1
    assert FlowRun.objects.get(org_id=org.org_id).state == t.RUN_WAITING
    db_clock_advance(3600)
    drain()
    run = FlowRun.objects.get(org_id=org.org_id)
    assert (run.state, run.reason_code) == (t.RUN_SUCCEEDED, "")
    [message] = Record.objects.filter(org_id=org.org_id, object_name="EmailMessage")
    assert message.fields == {"ToAddress": contact.fields["email"], "Subject": "Welcome",
                              "TextBody": "Hello Ann, from Automated Process"}
    command = OutboundCommand.objects.get(org_id=org.org_id)
    assert (command.origin_flow_run_id, command.source_record_key) == (run.pk, message.record_key)
    [email] = message_relay.state()["emails"]
    assert (email["to"], email["text"], email["send_requests"]) == (["ann@example.com"], message.fields["TextBody"], 2)
    assert drain() == 0 and len(message_relay.state()["emails"]) == 1


def test_a_submit_killed_before_commit_inserts_one_message_and_one_intent(org, message_relay, short_lease):
    serve_message_relay(org, message_relay.base_url)
    _deploy(org)
    _contact(org)
    env = subprocess_env(NEXUS_FAILPOINTS="flow.step.before_commit", NEXUS_FLOW_LEASE_SECONDS="1",
                         NEXUS_FLOW_RETRY_BASE_SECONDS="0", NEXUS_METADATA_DIR=str(_view_dir()))
    code = "from nexusflow.flows.services import flow_try_run_step_one; flow_try_run_step_one(worker_id='doomed')"
    proc = subprocess.run([sys.executable, "manage.py", "shell", "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    # The killed transaction wrote nothing: no message record, no intent.
    assert not Record.objects.filter(object_name="EmailMessage").exists() and not OutboundCommand.objects.exists()
    wait_for_recovery()
    assert flow_try_run_step_one(worker_id="w")
    drain()
    assert FlowRun.objects.get(org_id=org.org_id).state == t.RUN_SUCCEEDED
    assert Record.objects.filter(object_name="EmailMessage").count() == 1 == OutboundCommand.objects.count()
    assert [e["send_requests"] for e in message_relay.state()["emails"]] == [1]


def _view_dir():
    from django.conf import settings

    return settings.NEXUS_METADATA_DIR


def test_an_input_the_delivering_contract_cannot_carry_fails_the_step_and_writes_nothing(org, message_relay):
    """``recipientId`` has no field in the relay contract's ``delivers`` block: a definite refusal."""
    serve_message_relay(org, message_relay.base_url)
    _deploy(org, "<inputParameters><name>recipientId</name><value><stringValue>005000000000001</stringValue>"
                 "</value></inputParameters>")
    _contact(org)
    drain()
    run = FlowRun.objects.get(org_id=org.org_id)
    assert run.state == t.RUN_TERMINAL_FAILED
    assert not Record.objects.filter(object_name="EmailMessage").exists() and not OutboundCommand.objects.exists()
    assert message_relay.state() == {"emails": [], "notifications": [], "requests": 0}


def test_a_custom_notification_is_one_notification_at_the_relay(org, message_relay):
    """customNotificationAction: recipientIds (a text collection: a fixed user and $User.Id), title, body and
    the target record, delivered as one FlowNotification record and one notification."""
    serve_message_relay(org, message_relay.base_url)
    recipients = fx.variable("recipients", collection=True)
    collect = fx.assignment("Collect", "Notify", [
        ("recipients", "Add", "<stringValue>005000000000001AAA</stringValue>"),
        ("recipients", "Add", "<elementReference>$User.Id</elementReference>")])
    notify = ("<actionCalls><name>Notify</name><label>Notify</label><locationX>1</locationX><locationY>2</locationY>"
              "<actionName>customNotificationAction</actionName><actionType>customNotificationAction</actionType>"
              + "".join(f"<inputParameters><name>{name}</name><value>{value}</value></inputParameters>" for name, value in [
                  ("customNotifTypeId", "<stringValue>Contact_Alert</stringValue>"),
                  ("recipientIds", "<elementReference>recipients</elementReference>"),
                  ("title", "<stringValue>New contact</stringValue>"),
                  ("body", "<elementReference>$Record.email</elementReference>"),
                  ("targetId", "<elementReference>$Record.Id</elementReference>")])
              + "</actionCalls>")
    source = fx.flow(recipients, collect, notify, start=fx.start("Collect", trigger="RecordAfterSave", rtt="Create"),
                     profile="DurableOrchestration")
    assert flow_deploy(org=org, source=source, flow_api_name="Notify_On_Contact").activated
    contact = _contact(org, "Bo")
    drain()
    assert FlowRun.objects.get(org_id=org.org_id).state == t.RUN_SUCCEEDED
    [record] = Record.objects.filter(org_id=org.org_id, object_name="FlowNotification")
    assert record.fields == {"Recipients": "005000000000001AAA,automated_process", "Title": "New contact",
                             "Body": "bo@example.com", "NotificationType": "Contact_Alert",
                             "Target": contact.record_key}
    state = message_relay.state()
    assert not state["emails"] and [(n["recipients"], n["title"], n["body"], n["type"], n["target"], n["send_requests"])
                                     for n in state["notifications"]] == [
        (["005000000000001AAA", "automated_process"], "New contact", "bo@example.com", "Contact_Alert",
         contact.record_key, 1)]


def test_a_pack_delivers_block_is_validated_at_publish():
    import json
    from pathlib import Path

    doc = json.loads((Path(ROOT) / "packs" / "message_relay" / "pack.json").read_text(encoding="utf-8"))
    assert [c["delivers"]["family"] for c in doc["push_contracts"]] == ["email", "notification"]
    validate_pack_document(doc, "pack.json")
    for bad in ({"family": "email"}, {"family": "", "fields": {"a": "b"}}, {"family": "email", "fields": {}},
                {"family": "email", "fields": {"emailBody": 3}}, "email"):
        doc["push_contracts"][0]["delivers"] = bad
        with pytest.raises(PackError, match="delivers"):
            validate_pack_document(doc, "pack.json")
