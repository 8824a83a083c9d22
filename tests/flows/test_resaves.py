"""Prior values and recursive saves of record-triggered Flows (docs/operations.md "Flows that save their own records").

- ``ISCHANGED``, ``PRIORVALUE`` and ``$Record__Prior`` compare with the values
  the triggering save replaced, frozen with the run, in every profile;
- a save made by a Flow run's own write admits runs one recursive-save level
  deeper; past ``RECURSIVE_SAVE_LIMIT`` the run ends ``flow_recursion_limit``
  before its first element and starts nothing;
- a re-save does not repeat a side effect guarded by ``ISCHANGED``.

The recursion and re-save stories run on real ``run_workers --until-idle``
processes with a time bound; they commit for real (``transaction=True``).
"""
from __future__ import annotations

import subprocess

import pytest
from django.db import transaction

from nexusflow.flows import policy
from nexusflow.flows import transitions as t
from nexusflow.flows.models import FlowCheckpoint, FlowRun, FlowStepExecution
from nexusflow.flows.services import flow_deploy, flow_run_drive
from nexusflow.records.metadata import current_view
from nexusflow.records.models import Record
from nexusflow.records.services import record_create, record_lock, record_update
from tests.conftest import run_manage, subprocess_env

from . import resave_flows as rf

pytestmark = pytest.mark.django_db(transaction=True)

CONTACT = "Contact"


def _create(org, object_name: str, values: dict) -> Record:
    with transaction.atomic():
        return record_create(org=org, object_name=object_name, values=values)


def _update(org, record: Record, changes: dict) -> None:
    with transaction.atomic():
        locked = record_lock(org=org, object_name=record.object_name, record_key=record.record_key)
        record_update(org=org, record=locked, changes=changes)


def _fields(record: Record) -> dict:
    return Record.objects.get(pk=record.pk).fields


def _runs(org, record: Record):
    return list(FlowRun.objects.filter(org_id=org.org_id, record_key=record.record_key).order_by("id"))


def _drive_newest(org, record: Record) -> FlowRun:
    """Run the newest run of ``record`` to its end in this process (its re-save runs stay queued)."""
    run = _runs(org, record)[-1]
    flow_run_drive(org=org, run_id=run.pk, worker_id="resave-test")
    run.refresh_from_db()
    return run


def _workers_until_idle(env: dict) -> subprocess.CompletedProcess:
    """One real flow worker until no work is claimable, bounded in time (a run that never ends fails here)."""
    return run_manage(["run_workers", "--role", "flow", "--until-idle", "--idle-rounds", "3", "--idle-sleep", "0.05"],
                      env, timeout=240)


@pytest.fixture
def affiliation_view(settings, tmp_path):
    """Point this process (and the workers, through the environment) at the objects plus ``Affiliation``."""
    directory = rf.metadata_with_affiliation(tmp_path / "metadata")
    current_view.cache_clear()
    settings.NEXUS_METADATA_DIR = directory
    current_view.cache_clear()
    yield directory
    current_view.cache_clear()


# --- 1. prior values of the triggering save --------------------------------------------------------
@pytest.mark.parametrize("profile", [None, "DurableOrchestration"], ids=["bounded_atomic", "durable"])
def test_after_save_ischanged_priorvalue_and_record_prior_see_the_values_the_save_replaced(org, profile):
    flow_deploy(org=org, source=rf.mark_if_changed("email", profile=profile), flow_api_name="Mark_If_Changed")
    contact = _create(org, CONTACT, {"email": "a@example.com", "lastname": "Start"})

    _update(org, contact, {"lastname": "Renamed"})  # the email did not change
    run = _drive_newest(org, contact)
    assert run.state == t.RUN_SUCCEEDED, run.reason_code
    assert _fields(contact) == {"email": "a@example.com", "firstname": "unchanged", "lastname": "a@example.com",
                                "lifecyclestage": "a@example.com"}
    trigger = FlowCheckpoint.objects.get(run=run, sequence=1).context_payload["record"]
    assert trigger["prior_fields"] == {"email": "a@example.com", "lastname": "Start"}

    _update(org, contact, {"email": "b@example.com"})
    run = _drive_newest(org, contact)
    assert run.state == t.RUN_SUCCEEDED, run.reason_code
    assert _fields(contact) == {"email": "b@example.com", "firstname": "changed", "lastname": "a@example.com",
                                "lifecyclestage": "a@example.com"}


def test_before_save_ischanged_priorvalue_and_record_prior_follow_salesforce_on_create_and_update(org):
    flow_deploy(org=org, source=rf.before_save_mark_if_changed("email"), flow_api_name="Mark_Before_Save")
    contact = _create(org, CONTACT, {"email": "a@example.com"})
    # On create: ISCHANGED is false, PRIORVALUE is the current value, $Record__Prior is null.
    assert _fields(contact) == {"email": "a@example.com", "firstname": "unchanged", "lastname": "a@example.com",
                                "lifecyclestage": None}
    _update(org, contact, {"account_id": "001000000000000001"})
    assert _fields(contact)["firstname"] == "unchanged"
    _update(org, contact, {"email": "b@example.com"})
    fields = _fields(contact)
    assert (fields["firstname"], fields["lastname"], fields["lifecyclestage"]) == (
        "changed", "a@example.com", "a@example.com")


def test_after_save_on_create_sees_no_change_and_no_prior_record(org):
    flow_deploy(org=org, source=rf.mark_if_changed("email", rtt="Create"), flow_api_name="Mark_On_Create")
    contact = _create(org, CONTACT, {"email": "a@example.com"})
    run = _drive_newest(org, contact)
    assert run.state == t.RUN_SUCCEEDED, run.reason_code
    # Salesforce's rules on create: ISCHANGED is false, PRIORVALUE is the current value.
    assert _fields(contact) == {"email": "a@example.com", "firstname": "unchanged", "lastname": "a@example.com",
                                "lifecyclestage": "create"}
    assert FlowCheckpoint.objects.get(run=run, sequence=1).context_payload["record"]["prior_fields"] is None


# --- 2. a Flow that updates its own trigger record ----------------------------------------------------
def test_a_flow_that_rewrites_its_own_record_stops_at_the_recursion_bound_on_real_workers(org):
    flow_deploy(org=org, source=rf.self_updating(), flow_api_name="Flip_Lastname")
    contact = _create(org, CONTACT, {"lastname": "L"})
    _update(org, contact, {"lastname": "M"})
    [origin] = _runs(org, contact)

    done = _workers_until_idle(subprocess_env())
    assert done.returncode == 0, done.stderr[-3000:]

    runs = _runs(org, contact)
    limit = policy.RECURSIVE_SAVE_LIMIT
    # One chain, caused run by run: the outside save's run, LIMIT recursive saves, one run past the bound.
    assert [r.save_depth for r in runs] == list(range(limit + 2))
    assert runs[0].pk == origin.pk and runs[0].triggered_by_run_id is None
    assert [r.triggered_by_run_id for r in runs[1:]] == [r.pk for r in runs[:-1]]
    assert [r.state for r in runs[:-1]] == [t.RUN_SUCCEEDED] * (limit + 1)
    last = runs[-1]
    assert (last.state, last.reason_code, last.legacy_status) == (t.RUN_TERMINAL_FAILED, "flow_recursion_limit", "Error")
    step = FlowStepExecution.objects.get(run=last)
    assert (step.state, step.reason_code) == (t.STEP_FAILED, "flow_recursion_limit")
    # The ended run wrote nothing: the value flipped once per run that ran (M -> A -> B -> ...).
    assert _fields(contact)["lastname"] == "AB"[limit % 2]
    assert not FlowRun.objects.filter(org_id=org.org_id).exclude(
        state__in=(t.RUN_SUCCEEDED, t.RUN_TERMINAL_FAILED)).exists()


# --- 3. a re-save does not repeat a side effect ------------------------------------------------------------
def test_a_resave_by_another_flows_write_back_creates_one_affiliation_on_real_workers(org, affiliation_view):
    flow_deploy(org=org, source=rf.normalize_email(), flow_api_name="Normalize_Email")
    flow_deploy(org=org, source=rf.affiliate_on_account_change(), flow_api_name="Affiliate_On_Account_Change")
    account = _create(org, "Account", {"name": "Acme"})
    person = _create(org, CONTACT, {"email": "old@example.com"})
    _update(org, person, {"account_id": account.record_key, "email": "Ann@Example.COM"})

    done = _workers_until_idle(subprocess_env(NEXUS_METADATA_DIR=str(affiliation_view)))
    assert done.returncode == 0, done.stderr[-3000:]

    affiliations = list(Record.objects.filter(org_id=org.org_id, object_name="Affiliation").values_list("fields", flat=True))
    assert affiliations == [{"contact_id": person.record_key, "account_id": account.record_key}]
    assert _fields(person)["email"] == "ann@example.com"
    runs = _runs(org, person)
    by_flow = sorted((r.plan.flow_api_name, r.save_depth, r.state) for r in runs)
    # Both flows ran for the outside save and again for the write-back's re-save; the write-back's own
    # re-run wrote the same value, so nothing was saved a third time.
    assert by_flow == [("Affiliate_On_Account_Change", 0, t.RUN_SUCCEEDED), ("Affiliate_On_Account_Change", 1, t.RUN_SUCCEEDED),
                       ("Normalize_Email", 0, t.RUN_SUCCEEDED), ("Normalize_Email", 1, t.RUN_SUCCEEDED)]
