"""The chaos demo (issue #5 item 8): the demo of #2 while real processes die by SIGKILL.

``manage.py demo --chaos SEED`` runs :func:`packs.demo.run.run_demo` with a
:class:`ChaosSupervisor` in place of the fixed process set. The supervisor
owns one process per *slot* and restarts it after every death:

====================  =========  ==========================================
slot                  role       what dies
====================  =========  ==========================================
``web``               ingress    a gunicorn worker at an ``admission.*``
                                 failpoint, or the whole web process group
                                 from outside (:data:`EXTERNAL_KILL`)
``connector``         ingress    ``run_workers --role connector`` (the
                                 second connector worker is never armed)
``runtime``           runtime    ``run_workers --role runtime``
``flow``              flow       ``run_workers --role flow``
``egress``            egress     ``run_workers --role egress``
====================  =========  ==========================================

A seeded :func:`chaos_schedule` decides which slot is armed with which
failpoint, in rounds. *Arming* is (re)starting the slot's process with
``NEXUS_FAILPOINTS=<name>`` (kill action), so the process sends itself
SIGKILL when it reaches the point (:mod:`nexusflow.kernel.failpoints`). A kill
is counted only when the death by SIGKILL is verified from a ``waitpid``
status: ``Popen.returncode == -9`` for a worker or the web master, and for a
gunicorn worker its master's own ``waitpid`` report (the arbiter logs
``Worker (pid:N) was sent SIGKILL!`` from ``os.WTERMSIG(status)``). After a
death the slot restarts with its next arm, or unarmed when its plan is done.

Posting runs in a thread (:class:`packs.demo.run.ResendingPoster`) that resends a delivery
whose HTTP request failed (connection refused or reset, timeout, 5xx) with the
same body, signed afresh, as the provider would. Once the input is posted and
the minimum is met (:data:`MIN_KILLS` kills covering :data:`ROLE_GROUPS` and
:data:`REQUIRED_FAILPOINT`), every armed process is restarted unarmed, and the
supervisor waits until no work is left, *including* ``uncertain`` effects (the
egress worker's ``effect.reconcile`` unit repeats them exactly under the frozen
idempotency contract) and open Permits (``permit.abandon`` closes the dead
holder's Permits with a holder-termination proof).
"""
from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packs.demo.common import DemoError, attention_flow_runs, web_server_argv

#: Not a failpoint: the supervisor SIGKILLs the web process group from outside.
EXTERNAL_KILL = "external.sigkill"

#: Armed slot -> the role group its kills count for.
SLOT_ROLES: dict[str, str] = {"web": "ingress", "connector": "ingress", "runtime": "runtime", "flow": "flow",
                              "egress": "egress"}

#: Armed slot -> the failpoints (``failpoints.declare`` names) it can be armed with.
SLOT_MENUS: dict[str, tuple[str, ...]] = {
    "web": ("admission.before_children", "admission.between_children_chunks", "admission.after_receipt_commit",
            EXTERNAL_KILL),
    "connector": ("execution.after_claim", "execution.after_runtime_result"),
    "runtime": ("outbox.after_effect_accept",),
    "flow": ("flow.step.after_claim", "flow.step.before_commit", "flow.step.after_commit"),
    "egress": ("permit.after_grant", "permit.after_sending", "permit.after_response", "effect.after_settle"),
}
ROLE_GROUPS: tuple[str, ...] = ("ingress", "runtime", "flow", "egress")
#: The one Flow failure the demo input causes by design (a push with nothing to send, see docs/operations.md); its reason
#: code is of class ``benign``, so the chaos invariants do not count it.
EXPECTED_FLOW_FAILURE = "flow_step_expected_refusal"
REQUIRED_FAILPOINT = "permit.after_sending"
MIN_KILLS = 10
DEFAULT_ROUNDS = 3
#: External web kills fire this many seconds (uniform, seeded) after the web (re)started.
EXTERNAL_DELAY_RANGE = (0.5, 3.0)

#: An armed process that has not died after this many seconds *while its role had work* is re-armed
#: with its next failpoint (waiting for upstream work does not count).
ARM_TIMEOUT_SECONDS = 30.0
#: After a kill the slot runs unarmed this long, so its role gets past the unit that killed it.
COOLDOWN_SECONDS = 3.0
#: Follow-up arms per slot once the plan ran out and the contract is still unmet.
MAX_FOLLOW_UPS = 6
STOP_TIMEOUT_SECONDS = 20.0
IDLE_STABLE_SECONDS = 2.0
STALL_TIMEOUT_SECONDS = 90.0
TOTAL_TIMEOUT_SECONDS = 600.0
TICK_SECONDS = 0.2

_GUNICORN_SIGKILL = re.compile(rb"Worker \(pid:(\d+)\) was sent SIGKILL")


@dataclass(frozen=True)
class Arm:
    """One scheduled crash.

    ``round`` is 0-based (``-1`` for a follow-up arm drawn after the plan, see
    :func:`follow_up_arm`); ``slot`` a key of :data:`SLOT_MENUS`; ``failpoint``
    a declared failpoint name or :data:`EXTERNAL_KILL`; ``delay_seconds`` is
    used by :data:`EXTERNAL_KILL` only (seconds after the web process started)
    and is 0.0 otherwise.
    """

    round: int
    slot: str
    failpoint: str
    delay_seconds: float = 0.0

    @property
    def role(self) -> str:
        return SLOT_ROLES[self.slot]

    def as_dict(self) -> dict[str, Any]:
        return {"round": self.round, "slot": self.slot, "role": self.role, "failpoint": self.failpoint,
                "delay_seconds": self.delay_seconds}


def validate_seed(seed: object) -> int:
    """Return ``seed`` when it is a non-negative ``int`` (not a bool).

    Raises:
        ValueError: anything else, with a message naming the value.
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"chaos seed must be a non-negative integer, got {seed!r}")
    return seed


def _arm(rng: random.Random, round_: int, slot: str, failpoint: str | None = None) -> Arm:
    failpoint = failpoint or rng.choice(SLOT_MENUS[slot])
    delay = round(rng.uniform(*EXTERNAL_DELAY_RANGE), 2) if failpoint == EXTERNAL_KILL else 0.0
    return Arm(round_, slot, failpoint, delay)


def chaos_schedule(seed: int, *, rounds: int = DEFAULT_ROUNDS) -> list[Arm]:
    """The planned crashes for ``seed``: ``rounds`` x one arm per slot, in arming order.

    Each round visits every slot of :data:`SLOT_MENUS` once, in a seeded order,
    with a seeded failpoint from the slot's menu; when no egress arm drew
    :data:`REQUIRED_FAILPOINT`, a seeded round's egress arm is replaced by it.
    A slot works through its own arms in order (slots run concurrently), so
    ``rounds * len(SLOT_MENUS)`` (15 by default) arms cover every role group
    at least ``rounds`` times. The same seed always gives the same list.

    Raises:
        ValueError: a seed that is not a non-negative int, or ``rounds < 1``.
    """
    validate_seed(seed)
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive integer, got {rounds!r}")
    rng = random.Random(seed)
    arms: list[Arm] = []
    for round_ in range(rounds):
        slots = list(SLOT_MENUS)
        rng.shuffle(slots)
        arms.extend(_arm(rng, round_, slot) for slot in slots)
    if not any(a.failpoint == REQUIRED_FAILPOINT for a in arms):
        round_ = rng.randrange(rounds)
        index = next(i for i, a in enumerate(arms) if a.round == round_ and a.slot == "egress")
        arms[index] = dataclasses.replace(arms[index], failpoint=REQUIRED_FAILPOINT)
    return arms


def follow_up_arm(seed: int, slot: str, number: int, *, prefer: str | None = None) -> Arm:
    """The ``number``-th (0-based) arm of ``slot`` after its plan ran out while the minimum is unmet.

    Deterministic in ``(seed, slot, number)``; ``prefer`` (a failpoint of the
    slot's menu, e.g. :data:`REQUIRED_FAILPOINT` while no kill reached it)
    replaces the drawn failpoint.

    Raises:
        ValueError: an unknown slot, or ``prefer`` not on the slot's menu.
    """
    if slot not in SLOT_MENUS:
        raise ValueError(f"unknown chaos slot {slot!r}")
    if prefer is not None and prefer not in SLOT_MENUS[slot]:
        raise ValueError(f"{prefer!r} is not a failpoint of slot {slot!r}")
    rng = random.Random(f"{validate_seed(seed)}/{slot}/{number}")
    return _arm(rng, -1, slot, prefer)


# --- kills -------------------------------------------------------------------------
@dataclass(frozen=True)
class Kill:
    """A verified death by SIGKILL: ``pid`` of the dead process, ``how`` the verification.

    ``how`` is ``"returncode"`` (``Popen.returncode == -9`` seen by the
    supervisor) or ``"gunicorn_waitpid"`` (the web master reaped its worker
    with ``WTERMSIG == SIGKILL``); ``at_seconds`` counts from the chaos start.
    """

    slot: str
    role: str
    failpoint: str
    pid: int
    how: str
    at_seconds: float

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def coverage_failures(kills: Sequence[Kill]) -> list[str]:
    """What the kill list lacks against the chaos contract; ``[]`` when it is met.

    The contract: at least :data:`MIN_KILLS` kills, at least one in every
    role group of :data:`ROLE_GROUPS`, at least one at :data:`REQUIRED_FAILPOINT`.
    """
    problems = []
    if len(kills) < MIN_KILLS:
        problems.append(f"chaos: only {len(kills)} processes died by SIGKILL, at least {MIN_KILLS} are required")
    roles = {k.role for k in kills}
    missing = [r for r in ROLE_GROUPS if r not in roles]
    if missing:
        problems.append(f"chaos: no kill in role(s) {', '.join(missing)}")
    if not any(k.failpoint == REQUIRED_FAILPOINT for k in kills):
        problems.append(f"chaos: no kill at {REQUIRED_FAILPOINT}")
    return problems


# --- supervision ---------------------------------------------------------------------------
@dataclass
class _Slot:
    name: str
    log_name: str
    argv: list[str]
    proc: subprocess.Popen | None = None
    arm: Arm | None = None
    started_at: float = 0.0
    armed_busy: float = 0.0  # seconds the current arm waited while its role had work
    cooldown_until: float = 0.0
    log_offset: int = 0
    follow_ups: int = 0
    plan: deque = field(default_factory=deque)


class ChaosSupervisor:
    """Run the slot processes of the chaos demo, kill them as scheduled, restart them.

    Per slot: start armed with the slot's next arm; when the process dies by
    SIGKILL count a :class:`Kill` and restart it *unarmed*, so the role makes
    progress past the unit that killed it; after :data:`COOLDOWN_SECONDS`
    restart it with its next arm (a restart: the arm is an environment
    variable). An arm not reached within :data:`ARM_TIMEOUT_SECONDS` of its
    role having work is recorded as unreached and replaced by the next one.

    Planned arms are used while posting is in progress, and afterwards only
    while :func:`coverage_failures` is non-empty; once the plan is exhausted and
    the contract is still unmet, :func:`follow_up_arm` arms are drawn, only for
    slots that can supply what is missing (at most :data:`MAX_FOLLOW_UPS` per slot).

    Args:
        seed: the chaos seed (:func:`validate_seed`).
        procs: the demo's :class:`packs.demo.run.Processes`; slot processes are
            registered there so ``stop_all`` stops them.
        env: the environment of every child (the demo databases, secrets);
            ``NEXUS_FAILPOINTS`` is set per arm.
        run_dir: where ``<process>.log`` files go (appended across restarts).
        web_port: the port gunicorn binds (the same after every restart).
        say: progress printer (one line per event).
    """

    def __init__(self, *, seed: int, procs: Any, env: dict, run_dir: Path, web_port: int,
                 say: Callable[..., None]):
        self.seed = validate_seed(seed)
        self.schedule = chaos_schedule(seed)
        self.procs, self.env, self.run_dir, self.say = procs, env, run_dir, say
        self.kills: list[Kill] = []
        self.unreached: list[Arm] = []
        self.arms_used: list[Arm] = []
        self.disarmed = False
        self.resent_requests = 0  # set by the caller from its ResendingPoster
        self.started = time.monotonic()
        py = sys.executable
        self.slots = {
            "web": _Slot("web", "web", web_server_argv(web_port, workers=2)),
            "connector": _Slot("connector", "worker-connector-0", [py, "manage.py", "run_workers", "--role",
                                                                  "connector"]),
            "runtime": _Slot("runtime", "worker-runtime-2", [py, "manage.py", "run_workers", "--role", "runtime"]),
            "flow": _Slot("flow", "worker-flow-3", [py, "manage.py", "run_workers", "--role", "flow"]),
            "egress": _Slot("egress", "worker-egress-4", [py, "manage.py", "run_workers", "--role", "egress"]),
        }
        for arm in self.schedule:
            self.slots[arm.slot].plan.append(arm)

    # -- lifecycle ---------------------------------------------------------------
    def start(self) -> None:
        """Start every slot process with its first arm, and the never-armed second connector worker."""
        for slot in self.slots.values():
            self._start(slot, self._next_arm(slot, posting=True))
        self.procs.start("worker-connector-1", [sys.executable, "manage.py", "run_workers", "--role", "connector"],
                         self.env, self.run_dir)

    def _log_path(self, slot: _Slot) -> Path:
        return self.run_dir / f"{slot.log_name}.log"

    def _start(self, slot: _Slot, arm: Arm | None) -> None:
        env = dict(self.env)
        env.pop("NEXUS_FAILPOINTS", None)
        if arm is not None and arm.failpoint != EXTERNAL_KILL:
            env["NEXUS_FAILPOINTS"] = arm.failpoint
        path = self._log_path(slot)
        with path.open("ab") as log:
            log.write(f"=== chaos: start, armed with {arm.failpoint if arm else 'nothing'} ===\n".encode())
        slot.log_offset = path.stat().st_size
        if slot.proc is not None:
            self.procs.procs[:] = [(n, p) for n, p in self.procs.procs if p is not slot.proc]
        slot.proc = self.procs.start(slot.log_name, slot.argv, env, self.run_dir)
        slot.arm, slot.started_at, slot.armed_busy = arm, time.monotonic(), 0.0
        if arm is not None:
            self.arms_used.append(arm)

    def _wanted(self, slot: _Slot) -> str | None:
        """Why ``slot`` should get a follow-up arm: ``"any"``, ``"role"``, ``"required"``, or ``None``."""
        if len(self.kills) < MIN_KILLS:
            return "any"
        roles = {k.role for k in self.kills}
        if any(r not in roles for r in ROLE_GROUPS):
            return "role" if SLOT_ROLES[slot.name] not in roles else None
        if not any(k.failpoint == REQUIRED_FAILPOINT for k in self.kills):
            return "required" if REQUIRED_FAILPOINT in SLOT_MENUS[slot.name] else None
        return None

    def _next_arm(self, slot: _Slot, *, posting: bool) -> Arm | None:
        if self.disarmed:
            return None
        wanted = self._wanted(slot)
        if slot.plan and (posting or coverage_failures(self.kills)):
            if wanted == "required" and slot.plan[0].failpoint != REQUIRED_FAILPOINT:
                slot.plan.popleft()  # the contract now needs only this slot's required failpoint
                return self._next_arm(slot, posting=posting)
            return slot.plan.popleft()
        if wanted is None or slot.follow_ups >= MAX_FOLLOW_UPS:
            return None
        prefer = REQUIRED_FAILPOINT if REQUIRED_FAILPOINT in SLOT_MENUS[slot.name] and not any(
            k.failpoint == REQUIRED_FAILPOINT for k in self.kills) else None
        arm = follow_up_arm(self.seed, slot.name, slot.follow_ups, prefer=prefer)
        slot.follow_ups += 1
        return arm

    def _stop(self, slot: _Slot) -> int | None:
        """Stop ``slot``'s process (gunicorn: quick SIGQUIT; workers: SIGTERM, finishing the unit).

        Returns the returncode; a SIGKILL escalation after ``STOP_TIMEOUT_SECONDS`` is not a chaos kill.
        """
        proc = slot.proc
        if proc is None or proc.poll() is not None:
            return None if proc is None else proc.returncode
        try:
            if slot.name == "web":
                os.kill(proc.pid, signal.SIGQUIT)
            else:
                os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            return proc.wait(timeout=STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            self.say(f"chaos: {slot.log_name} did not stop within {STOP_TIMEOUT_SECONDS:.0f} s; killing it")
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            return None

    def _record(self, slot: _Slot, pid: int, how: str) -> None:
        arm = slot.arm
        failpoint = arm.failpoint if arm is not None else "unarmed"
        kill = Kill(slot.name, SLOT_ROLES[slot.name], failpoint, pid, how, round(time.monotonic() - self.started, 2))
        self.kills.append(kill)
        self.say(f"chaos: kill {len(self.kills)}: {slot.log_name} pid {pid} died by SIGKILL at {failpoint} "
                 f"({how}, t={kill.at_seconds:.1f} s)")

    def _gunicorn_kills(self, slot: _Slot) -> list[int]:
        """Worker pids the current web master reaped with ``WTERMSIG == SIGKILL`` (from its log)."""
        if slot.name != "web" or slot.arm is None or slot.arm.failpoint == EXTERNAL_KILL:
            return []
        with self._log_path(slot).open("rb") as log:
            log.seek(slot.log_offset)
            text = log.read()
        return [int(pid) for pid in _GUNICORN_SIGKILL.findall(text)]

    def _replace(self, slot: _Slot, arm: Arm | None, *, kills_seen: int = 0) -> bool:
        """Stop ``slot``'s live process and start it again with ``arm``; returns whether it died by SIGKILL.

        A process that reaches its failpoint while being stopped still counts
        (returncode -9, or a gunicorn worker reaped with SIGKILL beyond the
        ``kills_seen`` already recorded).
        """
        code = self._stop(slot)
        killed = False
        if code == -signal.SIGKILL:
            self._record(slot, slot.proc.pid, "returncode")
            killed = True
        for pid in self._gunicorn_kills(slot)[kills_seen:]:
            self._record(slot, pid, "gunicorn_waitpid")
            killed = True
        self._start(slot, arm)
        return killed

    def _after_kill(self, slot: _Slot) -> None:
        self._start(slot, None)
        slot.cooldown_until = time.monotonic() + COOLDOWN_SECONDS

    @staticmethod
    def _role_has_work(slot: _Slot, *, posting: bool) -> bool:
        """Whether ``slot``'s role has work it could be running now (approximate: cheap existence checks)."""
        if slot.name == "web":
            return posting
        if slot.name == "connector":
            from connectors.models import Execution

            return Execution.objects.filter(state="ready").exists()
        if slot.name == "runtime":
            from runtime_outbox.models import OutboxMessage

            return OutboxMessage.objects.filter(state="pending").exists()
        if slot.name == "flow":
            from nexusflow.flows.models import FlowRun

            return FlowRun.objects.filter(state__in=("Accepted", "Runnable", "Running")).exists()
        from connectors.models import RemoteEffect

        return RemoteEffect.objects.filter(state__in=("prepared", "dispatching", "uncertain",
                                                      "remote_confirmed")).exists()

    # -- one supervision round ----------------------------------------------------------
    def tick(self, *, posting: bool, elapsed: float = TICK_SECONDS) -> None:
        """Notice deaths, fire due external kills, arm cooled-down slots, replace timed-out arms.

        ``elapsed`` is the time since the previous tick in seconds; it counts
        against an arm's timeout while the slot's role has work.

        Raises:
            DemoError: a slot process exited other than by SIGKILL (a crash the
                chaos did not cause), with its log name and code.
        """
        now = time.monotonic()
        for slot in self.slots.values():
            proc = slot.proc
            code = proc.poll()
            arm = slot.arm
            if code is None and arm is not None and arm.failpoint == EXTERNAL_KILL:
                if posting and now - slot.started_at >= arm.delay_seconds:
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    code = proc.wait()
            if code is None:
                pids = self._gunicorn_kills(slot)
                if pids:
                    for pid in pids:
                        self._record(slot, pid, "gunicorn_waitpid")
                    self._replace(slot, None, kills_seen=len(pids))
                    slot.cooldown_until = time.monotonic() + COOLDOWN_SECONDS
                elif arm is not None and slot.armed_busy > ARM_TIMEOUT_SECONDS:
                    if not self._replace(slot, None):
                        self.unreached.append(arm)
                        self.say(f"chaos: {slot.log_name} did not reach {arm.failpoint} in "
                                 f"{ARM_TIMEOUT_SECONDS:.0f} s; re-arming")
                elif arm is not None:
                    if self._role_has_work(slot, posting=posting):
                        slot.armed_busy += elapsed
                elif now >= slot.cooldown_until and not self.disarmed:
                    following = self._next_arm(slot, posting=posting)
                    if following is not None and self._replace(slot, following):
                        slot.cooldown_until = time.monotonic() + COOLDOWN_SECONDS
                continue
            if code == -signal.SIGKILL:
                self._record(slot, proc.pid, "returncode")
                self._after_kill(slot)
                continue
            raise DemoError(f"process {slot.log_name} exited with code {code} (not a chaos kill)")
        slot_names = {s.log_name for s in self.slots.values()}
        for name, proc in self.procs.procs:
            if name not in slot_names and proc.poll() is not None:
                raise DemoError(f"process {name} exited early with code {proc.returncode}")

    def disarm(self) -> None:
        """Stop arming; restart every armed process unarmed so the rest of the work drains."""
        self.disarmed = True
        for slot in self.slots.values():
            if slot.arm is not None:
                self._replace(slot, None)
        self.say(f"chaos: disarmed after {len(self.kills)} kills; draining")

    # -- the whole run --------------------------------------------------------------------
    def run(self, poster: Any, *, work_counts: Callable[[], dict[str, int]],
            progress_marker: Callable[[], tuple]) -> dict[str, int]:
        """Supervise until the input is posted, the contract met (or unreachable) and no work is left.

        ``poster`` is a started :class:`packs.demo.run.ResendingPoster`;
        ``work_counts`` returns ``{kind: open count}`` (uncertain effects
        included); ``progress_marker`` any value that changes while work moves.
        Returns the last ``work_counts`` result (all zero unless the run
        stalled for ``STALL_TIMEOUT_SECONDS`` or hit ``TOTAL_TIMEOUT_SECONDS``).

        Raises:
            DemoError: a slot crashed (see :meth:`tick`) or the poster failed.
        """
        idle_since = None
        last_marker, last_change = None, time.monotonic()
        counts: dict[str, int] = {}
        last_tick = time.monotonic()
        while True:
            posting = not poster.done.is_set()
            tick_at = time.monotonic()
            self.tick(posting=posting, elapsed=tick_at - last_tick)
            last_tick = tick_at
            if poster.error:
                raise DemoError(poster.error)
            now = time.monotonic()
            if now - self.started > TOTAL_TIMEOUT_SECONDS:
                raise DemoError(f"the chaos run did not finish within {TOTAL_TIMEOUT_SECONDS:.0f} s")
            if posting:
                time.sleep(TICK_SECONDS)
                continue
            if not self.disarmed and not coverage_failures(self.kills):
                self.disarm()
            counts = work_counts()
            marker = (progress_marker(), len(self.kills), tuple(sorted(counts.items())))
            if marker != last_marker:
                last_marker, last_change = marker, now
            if sum(counts.values()) == 0:
                idle_since = idle_since or now
                if now - idle_since >= IDLE_STABLE_SECONDS:
                    if not self.disarmed:
                        # Nothing left can reach a failpoint: the contract cannot be met any more.
                        self.say("chaos: work is idle before the kill contract was met")
                        self.disarm()
                    return counts
            else:
                idle_since = None
            if now - last_change > STALL_TIMEOUT_SECONDS:
                self.say(f"chaos: no progress for {STALL_TIMEOUT_SECONDS:.0f} s, stopping with open work {counts}")
                if not self.disarmed:
                    self.disarm()
                return counts
            time.sleep(TICK_SECONDS)

    def report(self) -> dict[str, Any]:
        """Summary fields: ``kills`` (int), ``kills_by_role`` / ``kills_by_failpoint`` ({name: int}),
        ``arms`` (arms used), ``unreached_arms`` (arms replaced without a kill), ``resent_requests``
        (webhook requests sent again after a failed one), ``chaos_seed``."""
        return {
            "kills": len(self.kills),
            "kills_by_role": {role: sum(1 for k in self.kills if k.role == role) for role in ROLE_GROUPS},
            "kills_by_failpoint": dict(sorted(Counter(k.failpoint for k in self.kills).items())),
            "arms": len(self.arms_used),
            "unreached_arms": len(self.unreached),
            "resent_requests": self.resent_requests,
            "chaos_seed": self.seed,
        }

    def dump(self) -> dict[str, Any]:
        """The schedule, the arms used and every kill, for ``--dump``."""
        return {"seed": self.seed, "schedule": [a.as_dict() for a in self.schedule],
                "arms_used": [a.as_dict() for a in self.arms_used],
                "unreached": [a.as_dict() for a in self.unreached], "kills": [k.as_dict() for k in self.kills]}


def abandoned_permits() -> list[dict[str, Any]]:
    """Every abandoned DispatchPermit and what its abandonment proved, for ``--dump``.

    Returns ``[{"permit_id": int, "was_sending": bool (I/O may have started),
    "proof": "pid_absent" | "pid_reused" | None (the holder-termination proof),
    "attempt_state": str, "effect_state": str, "next_attempt_same_request":
    bool | None (the following Attempt of the effect sent the same bytes under
    the same idempotency key; None when there is none)}]``, by permit id.
    """
    from connectors.models import DispatchPermit, RemoteEffectAttempt

    out = []
    for permit in DispatchPermit.objects.filter(state="abandoned").select_related("attempt__effect").order_by("id"):
        evidence = permit.closed_evidence
        if isinstance(evidence, str):
            try:
                evidence = json.loads(evidence)
            except ValueError:
                evidence = {}
        attempt = permit.attempt
        following = RemoteEffectAttempt.objects.filter(org_id=attempt.org_id, effect_id=attempt.effect_id,
                                                       attempt_number=attempt.attempt_number + 1).first()
        same = None if following is None else (following.idempotency_key == attempt.idempotency_key
                                               and bytes(following.request_body) == bytes(attempt.request_body))
        out.append({"permit_id": int(permit.pk), "was_sending": permit.io_may_have_started_at is not None,
                    "proof": (evidence or {}).get("proof"), "attempt_state": attempt.state,
                    "effect_state": attempt.effect.state, "next_attempt_same_request": same})
    return out


def chaos_failures(summary: dict[str, Any], kills: Sequence[Kill]) -> list[str]:
    """The chaos invariants on top of #2's, as messages (``[]`` when they hold).

    Kill coverage (:func:`coverage_failures`); no effect left ``uncertain``
    (an effect with any other ``attention`` reason code already fails the
    demo's own invariants; a ``quarantined`` effect with a benign code, an
    older version superseded by a newer one, is no failure); no Flow run
    ``TerminalFailed`` or ``Quarantined`` with an ``attention`` reason code (a
    crash must cost a retry, never a run; :data:`EXPECTED_FLOW_FAILURE` is
    benign).
    """
    problems = coverage_failures(kills)
    if summary.get("uncertain_effects"):
        problems.append(f"{summary['uncertain_effects']} effects still uncertain after reconciliation")
    failed = attention_flow_runs()
    if failed:
        problems.append(f"{len(failed)} flow runs failed by the crashes: {json.dumps(failed[:5], default=str)}")
    return problems
