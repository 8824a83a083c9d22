"""Closed reason codes for halted, quarantined and refused states.

Seed 003, "Operational liveness and maintenance admission": every halted or
quarantined reason has a closed reason code, an evidence query, an alert
deadline, a responsible owner and an allowed remediation (ARCHITECTURE.md
section 6, "Reason codes").

- :data:`REMEDIATIONS` is the closed kernel registry of what an operator may
  do; a remediation never relabels uncertainty, mutates an admitted
  generation, reopens a terminal fact or invents an unlisted transition.
- Each app registers its own codes in ``<app>/reasons.py`` with
  :func:`register` and refers to them through the module's constants.
- Every code has a severity class (:data:`SEVERITY_CLASSES`): ``benign`` for
  an expected, recorded outcome that needs no operator (superseded by a newer
  version or position, a declared definite refusal recorded as expected, a
  run whose trigger record was deleted); ``attention`` when an operator must
  look (quarantine for a mismatch, retries exhausted, uncertainty, drift,
  authority denied, halts). The class never changes a row's state: a
  ``quarantined`` row with a benign code is still quarantined; operators and
  the demo count only ``attention`` codes as trouble.
- :func:`require` is the write-side check the CAS store runs before SQL.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.utils.module_loading import import_string

from .errors import NexusError

_CODE = re.compile(r"^[a-z][a-z0-9_]{2,63}$")
_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")


class UnknownReasonCode(NexusError):
    """A reason code that no owner registered."""

    code = "unknown_reason_code"


@dataclass(frozen=True, slots=True)
class Remediation:
    """One allowed operator remediation.

    Attributes:
        id: stable id referenced by :class:`ReasonCode.remediations`.
        description: what the operator does, naming the command or endpoint
            where one exists, or saying that none exists yet.
    """

    id: str
    description: str


#: The closed remediation registry. Adding an id is a kernel change.
REMEDIATIONS: dict[str, Remediation] = {r.id: r for r in (
    Remediation("none", "Nothing to do: the row records a decided, benign outcome; no alert is raised."),
    Remediation(
        "automatic_retry",
        "The owning worker resolves the row itself (`manage.py run_workers --role ...`: egress repeats the exact "
        "idempotent request or reconciles, flow retries the step); the operator acts only once the alert deadline "
        "passes, by checking that the workers of that role run.",
    ),
    Remediation(
        "operator_reconcile",
        "Establish with the provider whether the remote effect exists, then append the evidence: `manage.py "
        "effects reconcile EFFECT --org ORG (--confirmed REMOTE_ID | --no-effect [--retry]) --actor A --note N` "
        "(`manage.py effects show EFFECT --org ORG` lists the Attempts); or park it for good with `manage.py effects "
        "quarantine`. Earlier Attempts and evidence stay immutable.",
    ),
    Remediation(
        "authorize_successor_effect",
        "The effect is proven to have had no remote effect. If the remote call is still wanted, an operator "
        "authorizes a new EffectGeneration: `manage.py effects successor COMMAND --org ORG --actor A --reason R` "
        "(refused unless the predecessor is terminal no_effect); the predecessor stays terminal.",
    ),
    Remediation(
        "reenable_credential_generation",
        "When the credential is trusted again, re-enable that exact generation: `manage.py "
        "connector_credential_reenable --org ORG --generation ID --actor A` (a new fence; Permits granted before "
        "revocation stay closed). Blocked effects then dispatch with their frozen generation.",
    ),
    Remediation(
        "publish_credential_generation",
        "Publish a new credential generation (`manage.py connector_credential_publish`), apply a configuration "
        "that references it and switch epochs (see complete_successor_switch); effects frozen on the revoked "
        "generation never fall forward: resolve them with `manage.py effects quarantine` or reconcile.",
    ),
    Remediation(
        "fix_sender_and_replay",
        "Fix the sending system so every item is a well-formed, canonical event of an enabled kind, then have it "
        "deliver again (a pushed route admits a new transport key through POST /api/v2/ingress/<account>/<channel>/; "
        "a pulled route admits the source's corrected change through its stream). A terminal Event that must run "
        "again is replayed by an operator (`manage.py connector_replay` or POST /api/v2/replays/), with external "
        "effects suppressed.",
    ),
    Remediation(
        "fix_pack_mapping",
        "Correct the pack (`manage.py connector_pack_publish`) or the L2 configuration, apply it as a new generation "
        "(`manage.py connector_config_apply --org ORG FILE`), prepare its epoch (`manage.py connector_epoch_prepare "
        "--org ORG`) and switch to it (connector_halt, connector_handoff, connector_activate_successor); the refused "
        "fact stays terminal.",
    ),
    Remediation(
        "reauthor_intent",
        "Fix the cause named by the evidence (record data, provider-side refusal, worker release), then save the "
        "source record again so a new Flow run authors a new intent; the refused or failed fact stays terminal.",
    ),
    Remediation(
        "fix_flow_recursion",
        "A Flow's own record writes re-saved records past the recursive-save bound (README \"Flows that save their "
        "own records\"). Give the Flow an entry condition or a decision so that a re-save it caused does not write "
        "again (for example `ISCHANGED` on the fields it reacts to), deploy it (`manage.py flow_deploy`), then save "
        "the record again; the ended run stays terminal.",
    ),
    Remediation(
        "resolve_prior_create",
        "Resolve the earlier quarantined create of the same link key first (operator_reconcile); only then can a "
        "new intent for that slot dispatch. The later effect stays quarantined.",
    ),
    Remediation(
        "relink_or_retire",
        "Decide whether the remote object and the link's destination still hold: `manage.py push_links revalidate "
        "--org ORG --link-key KEY --actor NAME --reason TEXT` re-snapshots the current action config and returns a "
        "suspended link to service; `push_links retire` ends it (the slot never creates again); `push_links rebind` "
        "moves the remote id to the slot that replaced a removed one. Nothing is recreated automatically.",
    ),
    Remediation(
        "revalidate_link_mapping",
        "The pack's outbound mapping or body shape changed under finalized links: the semantic owner approves a "
        "LinkKey-sorted manifest, `manage.py push_link_revalidation validate --manifest FILE` checks it with zero "
        "writes, `push_link_revalidation apply --manifest FILE` advances the links' fingerprints atomically; the "
        "next record save then PATCHes. The refused PATCH stays quarantined.",
    ),
    Remediation(
        "resume_cutover",
        "Run the cutover procedure again: `manage.py cutover status --org ORG` names the next command "
        "(greenfield, drain, stop, reconcile, certify or restore-point); each is idempotent and walks every gate "
        "on from where it stopped, or refuses with the reason-coded state that blocks it.",
    ),
    Remediation(
        "revise_cutover_plan",
        "Preflight refused the cutover before maintenance: fix what the blockers name (give the route an "
        "immutable migration disposition or disable it in a new configuration generation, correct the L2 budget "
        "plan, halt contracts or alert owners, or reconcile the V1 rows), then run `manage.py cutover preflight "
        "--org ORG --attempt NEW_KEY --plan FILE` under a new attempt key; the refusal stays recorded.",
    ),
    Remediation(
        "reprepare_epoch",
        "Restore the owner that changed (pack file, configuration or credential generation) or apply a new "
        "configuration generation (`manage.py connector_config_apply`), then run `manage.py cutover greenfield` "
        "so a new candidate epoch is prepared; the rejected epoch stays rejected.",
    ),
    Remediation(
        "complete_successor_switch",
        "Finish the planned successor ServingEpoch switch: `manage.py connector_halt --org ORG` until every gate is "
        "v2_halted, then `manage.py connector_handoff --org ORG --successor EPOCH` and `manage.py "
        "connector_activate_successor --org ORG --successor EPOCH`. Only while no OrderingHandoff exists, `manage.py "
        "connector_resume --org ORG` returns every gate to the predecessor epoch instead.",
    ),
    Remediation(
        "resync_from_source",
        "The source reported that changes were lost or skipped (a gap item): read the current state of the named "
        "records from the source and admit it as new input; the gap item stays quarantined as evidence. Not yet "
        "available: no resync command or endpoint exists yet.",
    ),
    Remediation(
        "inspect_invariant",
        "Invariant evidence contradicts the recorded state: an engineer inspects the rows named by the evidence "
        "before anything else runs for that record; nothing is retried automatically.",
    ),
)}


#: An expected, recorded outcome: no operator action, no alert (``alert_after_seconds == 0``).
BENIGN = "benign"
#: An operator must look: the code alerts after its deadline (``alert_after_seconds > 0``).
ATTENTION = "attention"
#: The closed severity classes, in display order.
SEVERITY_CLASSES: tuple[str, ...] = (BENIGN, ATTENTION)


@dataclass(frozen=True, slots=True)
class ReasonCode:
    """One closed reason code.

    Attributes:
        code: the value stored in a row's ``reason_code`` column.
        owner: app label of the owning app (the one that registers it).
        evidence: dotted path of a selector in ``<owner app>.selectors``; it is
            called as ``selector(org_id=..., reason_code=code)`` and returns the
            org-scoped rows an operator reads as evidence.
        severity_class: ``"benign"`` (an expected, recorded outcome) or
            ``"attention"`` (an operator must look); see :data:`SEVERITY_CLASSES`.
        alert_after_seconds: seconds a row may carry the code before it alerts;
            ``0`` for a benign code (no alert), ``> 0`` for an attention code.
        remediations: non-empty tuple of ids from :data:`REMEDIATIONS`; for a
            benign code they are optional follow-ups (or just ``"none"``).
    """

    code: str
    owner: str
    evidence: str
    severity_class: str
    alert_after_seconds: int
    remediations: tuple[str, ...]

    def evidence_selector(self) -> Callable[..., Any]:
        """Import and return the evidence selector (``ImportError`` if the path is wrong)."""
        return import_string(self.evidence)


REASONS: dict[str, ReasonCode] = {}


def register(code: str, *, owner: str, evidence: str, severity_class: str, alert_after_seconds: int,
             remediations: tuple[str, ...]) -> str:
    """Register ``code`` for ``owner`` and return the code (for a module constant).

    Args:
        code: lower snake case, 3-64 characters.
        owner: app label, e.g. ``"connectors"``.
        evidence: dotted path of the evidence selector, ``<module>.selectors.<function>``.
        severity_class: required, ``"benign"`` or ``"attention"`` (:data:`SEVERITY_CLASSES`).
        alert_after_seconds: int >= 0; exactly 0 for a benign code, > 0 for an
            attention code.
        remediations: non-empty tuple of :data:`REMEDIATIONS` ids; ``"none"``
            (nothing to do) only for a benign code.

    Raises:
        TypeError: ``severity_class`` (or another field) not given.
        ValueError: malformed field, unknown remediation or class, a class
            inconsistent with the deadline or remediations, or ``code`` already
            registered (by this or another owner).

    Seed 003, "Operational liveness and maintenance admission".
    """
    if not _CODE.match(code):
        raise ValueError(f"reason code {code!r} is not lower snake case of 3-64 characters")
    if code in REASONS:
        raise ValueError(f"reason code {code!r} is already registered by {REASONS[code].owner}")
    if not owner or not owner.isidentifier():
        raise ValueError(f"{code}: owner {owner!r} is not an app label")
    if not _DOTTED.match(evidence) or ".selectors." not in evidence:
        raise ValueError(f"{code}: evidence {evidence!r} is not a dotted path into a selectors module")
    if isinstance(alert_after_seconds, bool) or not isinstance(alert_after_seconds, int) or alert_after_seconds < 0:
        raise ValueError(f"{code}: alert_after_seconds must be an int >= 0")
    if not isinstance(remediations, tuple) or not remediations:
        raise ValueError(f"{code}: remediations must be a non-empty tuple")
    unknown = [r for r in remediations if r not in REMEDIATIONS]
    if unknown:
        raise ValueError(f"{code}: unknown remediations {unknown}")
    if severity_class not in SEVERITY_CLASSES:
        raise ValueError(f"{code}: severity_class {severity_class!r} is not one of {list(SEVERITY_CLASSES)}")
    if severity_class == BENIGN and alert_after_seconds:
        raise ValueError(f"{code}: a benign code raises no alert (alert_after_seconds must be 0)")
    if severity_class == ATTENTION and not alert_after_seconds:
        raise ValueError(f"{code}: an attention code needs an alert deadline (alert_after_seconds > 0)")
    if severity_class == ATTENTION and "none" in remediations:
        raise ValueError(f"{code}: an attention code has an operator remediation, not 'none'")
    REASONS[code] = ReasonCode(code, owner, evidence, severity_class, alert_after_seconds, remediations)
    return code


def require(code: str) -> str:
    """Return ``code`` if registered.

    Raises:
        UnknownReasonCode: no owner registered ``code`` (code ``unknown_reason_code``).
    """
    if code not in REASONS:
        raise UnknownReasonCode(f"unknown reason code {code!r}")
    return code


def severity_class_of(code: str) -> str | None:
    """Return the severity class of a row's ``reason_code``: ``"benign"``, ``"attention"``, or ``None`` for ``""``.

    Raises:
        UnknownReasonCode: a non-empty ``code`` no owner registered.
    """
    if not code:
        return None
    return REASONS[require(code)].severity_class


def codes_of_class(severity_class: str) -> frozenset[str]:
    """Return every registered code of ``severity_class`` (load the apps' codes first: :func:`load_all_reasons`).

    Raises:
        ValueError: ``severity_class`` is not one of :data:`SEVERITY_CLASSES`.
    """
    if severity_class not in SEVERITY_CLASSES:
        raise ValueError(f"unknown severity class {severity_class!r}; expected one of {list(SEVERITY_CLASSES)}")
    return frozenset(code for code, reason in REASONS.items() if reason.severity_class == severity_class)


def load_all_reasons() -> dict[str, ReasonCode]:
    """Import every installed app's ``reasons`` module and return :data:`REASONS`."""
    from .transitions import import_app_modules

    import_app_modules("reasons")
    return REASONS
