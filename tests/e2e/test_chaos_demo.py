"""``manage.py demo --chaos SEED``: the seeded crash schedule, and one full chaos run (``make chaos``)."""
import importlib
import json
import os
import sys

import pytest

from packs.demo.chaos import (
    EXTERNAL_KILL,
    MIN_KILLS,
    REQUIRED_FAILPOINT,
    ROLE_GROUPS,
    SLOT_MENUS,
    SLOT_ROLES,
    Kill,
    chaos_schedule,
    coverage_failures,
    follow_up_arm,
)
from tests.conftest import run_manage, subprocess_env

CHAOS_SEED = 3


def test_the_schedule_is_a_function_of_the_seed_and_covers_every_role():
    schedules = {}
    for seed in range(200):
        arms = chaos_schedule(seed)
        assert arms == chaos_schedule(seed)
        assert len(arms) >= MIN_KILLS
        assert {a.role for a in arms} == set(ROLE_GROUPS)
        assert any(a.failpoint == REQUIRED_FAILPOINT for a in arms)
        for arm in arms:
            assert arm.failpoint in SLOT_MENUS[arm.slot]
            assert arm.role == SLOT_ROLES[arm.slot]
            assert (arm.delay_seconds > 0) == (arm.failpoint == EXTERNAL_KILL)
        # every round arms every slot once
        for round_ in range(max(a.round for a in arms) + 1):
            assert sorted(a.slot for a in arms if a.round == round_) == sorted(SLOT_MENUS)
        schedules[seed] = tuple(arms)
    assert len(set(schedules.values())) > 150, "different seeds should give different schedules"
    assert len(chaos_schedule(CHAOS_SEED, rounds=1)) == len(SLOT_MENUS)


def test_every_scheduled_failpoint_is_declared_where_the_role_runs():
    from nexusflow.kernel import failpoints

    for module in ("connectors.inbound.admission", "connectors.inbound.executions", "runtime_outbox.services",
                   "nexusflow.flows.services", "connectors.outbound.egress"):
        importlib.import_module(module)  # each declares its failpoints on import

    named = {fp for menu in SLOT_MENUS.values() for fp in menu} - {EXTERNAL_KILL}
    assert named <= failpoints.DECLARED, named - failpoints.DECLARED
    assert REQUIRED_FAILPOINT in SLOT_MENUS["egress"]


def test_follow_up_arms_are_deterministic_and_honour_a_preference():
    for slot in SLOT_MENUS:
        for number in range(5):
            arm = follow_up_arm(11, slot, number)
            assert arm == follow_up_arm(11, slot, number)
            assert arm.round == -1 and arm.failpoint in SLOT_MENUS[slot]
    assert follow_up_arm(11, "egress", 0, prefer=REQUIRED_FAILPOINT).failpoint == REQUIRED_FAILPOINT
    with pytest.raises(ValueError, match="not a failpoint of slot"):
        follow_up_arm(11, "runtime", 0, prefer=REQUIRED_FAILPOINT)
    with pytest.raises(ValueError, match="unknown chaos slot"):
        follow_up_arm(11, "nope", 0)


@pytest.mark.parametrize("seed", [-1, 1.5, "3", True, None])
def test_a_bad_seed_is_refused(seed):
    with pytest.raises(ValueError, match="non-negative integer"):
        chaos_schedule(seed)


def test_coverage_needs_ten_kills_every_role_and_the_sending_boundary():
    def kill(slot, failpoint):
        return Kill(slot, SLOT_ROLES[slot], failpoint, 1, "returncode", 0.0)

    full = [kill("web", EXTERNAL_KILL), kill("runtime", "outbox.after_effect_accept"),
            kill("flow", "flow.step.after_claim"), kill("egress", REQUIRED_FAILPOINT)] + \
        [kill("connector", "execution.after_claim")] * (MIN_KILLS - 4)
    assert coverage_failures(full) == []
    assert any("at least 10" in p for p in coverage_failures(full[:-1]))
    no_flow = [k for k in full if k.role != "flow"] + [kill("connector", "execution.after_claim")]
    assert coverage_failures(no_flow) == ["chaos: no kill in role(s) flow"]
    other_egress = [k if k.failpoint != REQUIRED_FAILPOINT else kill("egress", "permit.after_grant") for k in full]
    assert coverage_failures(other_egress) == [f"chaos: no kill at {REQUIRED_FAILPOINT}"]


def _answers(statuses):
    """A loopback receiver answering ``statuses`` in turn (then 202); returns (url, bodies seen, server)."""
    import http.server
    import threading

    seen, queue = [], list(statuses)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            seen.append((self.rfile.read(int(self.headers["Content-Length"])), dict(self.headers)))
            status = queue.pop(0) if queue else 202
            body = json.dumps({"receipt_id": 1, "status": "admitted"}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/api/v2/ingress/a/b/", seen, server


def test_the_poster_resends_a_failed_request_with_the_same_body_like_a_provider():
    from packs.demo.run import ResendingPoster
    from packs.hubspot.sender import Delivery

    url, seen, server = _answers([500, 502])
    try:
        poster = ResendingPoster([Delivery([{"eventId": 1}]), Delivery("raw", "missing")], url=url, secret=b"s")
        poster.start()
        assert poster.done.wait(30)
    finally:
        server.shutdown()
    assert poster.error is None
    assert [r.status for r in poster.results] == [202, 202] and poster.resends == 2
    assert [r.attempts for r in poster.results] == [3, 1]
    assert [body for body, _ in seen] == [b'[{"eventId":1}]'] * 3 + [b"raw"]


def test_the_poster_gives_up_on_a_receiver_that_never_answers(monkeypatch):
    import socket

    from packs.demo import run
    from packs.hubspot.sender import Delivery

    monkeypatch.setattr(run, "RESEND_DEADLINE_SECONDS", 0.5)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: connections are refused
    poster = run.ResendingPoster([Delivery([])], url=f"http://127.0.0.1:{port}/x/", secret=b"s")
    poster.start()
    assert poster.done.wait(30)
    assert poster.results == [] and poster.resends >= 1
    assert poster.error.startswith("delivery 0 got no answer") and "ConnectError" in poster.error


@pytest.mark.parametrize("value", ["-1", "x", "1.5"])
def test_demo_refuses_a_bad_chaos_seed_before_doing_anything(value):
    result = run_manage(["demo", "--chaos", value], {**os.environ, "PYTHONUNBUFFERED": "1"}, timeout=60)
    assert result.returncode == 2
    assert "--chaos: SEED must be a non-negative integer" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.chaos
@pytest.mark.django_db(transaction=True, databases=["default", "control"])
def test_chaos_demo_kills_every_role_and_keeps_the_demo_contract(tmp_path):
    dump = tmp_path / "dump.json"
    result = run_manage(["demo", "--chaos", str(CHAOS_SEED), "--json", "--dump", str(dump)], subprocess_env(),
                        timeout=580)
    sys.stderr.write(result.stderr[-4000:])
    assert result.returncode == 0, result.stderr[-6000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["invariants_ok"] is True
    assert isinstance(summary["kills"], int) and summary["kills"] >= MIN_KILLS
    assert all(summary["kills_by_role"][role] >= 1 for role in ROLE_GROUPS), summary["kills_by_role"]
    assert summary["kills_by_failpoint"].get(REQUIRED_FAILPOINT, 0) >= 1, summary["kills_by_failpoint"]
    assert summary["uncertain_effects"] == 0
    assert summary["duplicate_remote_creates"] == 0 and summary["nonterminal"] == 0
    assert summary["chaos_seed"] == CHAOS_SEED
    state = json.loads(dump.read_text())
    kills = state["chaos"]["kills"]
    assert len(kills) == summary["kills"]
    # every kill is a verified death by SIGKILL of a real process
    assert all(k["how"] in ("returncode", "gunicorn_waitpid") and k["pid"] > 0 for k in kills)
    assert state["chaos"]["schedule"] == [a.as_dict() for a in chaos_schedule(CHAOS_SEED)]
    # crash around the Permit boundary: a dead holder's Permit is abandoned only with a termination
    # proof; `sending` abandonment is uncertain and repeated byte for byte under the same key,
    # `granted` abandonment proves no I/O
    permits = state["chaos"]["abandoned_permits"]
    assert any(p["was_sending"] for p in permits), permits
    for permit in permits:
        assert permit["proof"] in ("pid_absent", "pid_reused"), permit
        assert permit["attempt_state"] == ("uncertain" if permit["was_sending"] else "no_effect"), permit
        assert permit["effect_state"] == "finalized", permit
        if permit["was_sending"]:
            assert permit["next_attempt_same_request"] is True, permit
    # one remote customer per pushed contact, and no remote customer without its contact
    linked = [row["billing_id"] for row in state["local"].values() if row["billing_id"]]
    assert len(linked) == len(set(linked)) == len(state["remote"])
    assert sorted(linked) == sorted(c["id"] for c in state["remote"])
