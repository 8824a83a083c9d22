"""Shared adversarial-test helpers: spawn worker subprocesses, compare end state."""
import subprocess
import sys
import time

from connectors.models import RemoteLink
from nexusflow.kernel.workers import open_work
from nexusflow.records.models import Record
from tests.conftest import ROOT


def spawn(role: str, env: dict, until_idle: bool = True) -> subprocess.Popen:
    args = [sys.executable, "manage.py", "run_workers", "--role", role]
    if until_idle:
        args += ["--until-idle", "--idle-rounds", "5"]
    return subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def pending_work() -> dict[str, int]:
    """Every open-work count, ``uncertain`` effects included: an adversarial run must leave none parked."""
    return open_work(parked=("uncertain_effects",))


def run_parallel(env: dict, counts: dict[str, int], *, rounds: int = 20, timeout: float = 300) -> list[str]:
    """Run ``counts[role]`` until-idle workers of each role at once, repeatedly until nothing is pending."""
    logs: list[str] = []
    deadline = time.time() + timeout
    for _ in range(rounds):
        procs = [spawn(role, env) for role, n in counts.items() for _ in range(n)]
        for p in procs:
            out, err = p.communicate(timeout=max(5, deadline - time.time()))
            logs.append(err)
            assert p.returncode == 0, err[-3000:]
        if not any(pending_work().values()):
            break
    return logs


def local_by_object_id() -> dict:
    links = RemoteLink.objects.filter(action_type="InboundUpsert", state="active")
    records = {r.record_key: r for r in Record.objects.all()}
    return {link.remote_id: records[link.source_record_key] for link in links}


def check_end_state(expected: dict, sandbox) -> list[str]:
    problems = []
    local = local_by_object_id()
    if set(local) != set(expected):
        problems.append(f"objects differ: missing {set(expected) - set(local)} extra {set(local) - set(expected)}")
    for object_id, props in expected.items():
        record = local.get(object_id)
        if record is None:
            continue
        for prop, value in props.items():
            if record.fields.get(prop) != value:
                problems.append(f"{object_id}.{prop}: local {record.fields.get(prop)!r} expected {value!r}")
    inbound_links = RemoteLink.objects.filter(action_type="InboundUpsert").count()
    if inbound_links != Record.objects.count():
        problems.append(f"{Record.objects.count()} records for {inbound_links} inbound links (duplicate record)")
    customers = {c["id"]: c for c in sandbox.state()["customers"]}
    push_links = {link.source_record_key: link.remote_id
                  for link in RemoteLink.objects.filter(action_type="PushToConnector")}
    if len(customers) != len(push_links):
        problems.append(f"{len(customers)} customers for {len(push_links)} push links: duplicate create")
    for record in local.values():
        if record.fields.get("lifecyclestage") != "customer":
            continue
        remote = push_links.get(record.record_key)
        if remote is None:
            problems.append(f"customer contact {record.record_key} has no billing link")
            continue
        c = customers[remote]
        name = " ".join(v for v in (record.fields.get("firstname"), record.fields.get("lastname")) if v) or None
        if (c["email"], c["name"]) != (record.fields.get("email"), name):
            problems.append(f"{record.record_key}: remote {(c['email'], c['name'])} local {(record.fields.get('email'), name)}")
    return problems
