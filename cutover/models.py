"""Cutover evidence and the activation-versus-restore decision.

``CutoverDecision`` lives on the ``control`` database so restoring the main
database never rewrites it (ARCHITECTURE.md section 7). Evidence rows are
immutable and live with the data they certify.
"""
from django.db import models

from nexusflow.kernel.identity import IdentityField
from nexusflow.kernel.models import GuardedModel, TypedIdReference


class CutoverDecision(GuardedModel):
    """The journal of one cutover attempt's activation-versus-restore decision (control database)."""

    org_id = IdentityField(max_length=64)
    attempt_key = IdentityField(max_length=80)
    mode = models.CharField(max_length=16, help_text="greenfield | v1_upgrade")
    state = models.CharField(max_length=16)
    version = models.PositiveBigIntegerField(default=1)
    epoch_id = TypedIdReference(to="connectors.ServingEpoch", null=True, blank=True)
    epoch_digest = IdentityField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["org_id", "attempt_key"], name="cutover_decision_uniq")]


class CutoverEvidence(GuardedModel):
    """One immutable certificate or receipt of the cutover evidence chain.

    A ``preflight_refusal`` row records one refused ``cutover preflight`` input: its
    ``account_key`` holds that input's certificate digest (one row per distinct refused
    input) and its payload the reason-coded blockers.
    """

    org_id = IdentityField(max_length=64)
    attempt_key = IdentityField(max_length=80)
    kind = IdentityField(max_length=48, help_text="maintenance_barrier | process_termination | egress_isolation | "
                                                     "v1_shutdown_certificate | v1_restore_point | activation")
    account_key = IdentityField(max_length=80, blank=True, default="")
    payload = models.JSONField()
    digest = IdentityField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["org_id", "attempt_key", "kind", "account_key"], name="cutover_evidence_uniq"),
        ]


class CutoverReadinessCertificate(GuardedModel):
    """The immutable readiness certificate of one service cutover attempt (seed 003 "Compressed durable model").

    ``document`` holds the canonical JSON bytes (sorted keys, no whitespace)
    that ``cutover preflight`` certified: the exact configuration generation and
    verified ServingEpoch, every enabled route's ordering-migration disposition
    and proof, halt contracts, the L2 budget plan, the measured V1 workload and
    conservative projections, and the closed reason/alert/owner/remediation
    map. ``digest`` is its v2 digest. There is at most one per
    ``(org_id, attempt_key)``; a changed input needs a new attempt key.

    It lives on the main database next to the AccountServingGates, because
    ``cutover halt-v1`` locks and byte-compares it in the same transaction that
    freezes the gate set (seed 003 "Offline V1 shutdown ...", step 1).
    """

    org_id = IdentityField(max_length=64)
    attempt_key = IdentityField(max_length=80)
    configuration_id = TypedIdReference(to="connectors.ConnectorServiceConfigurationGeneration")
    configuration_digest = IdentityField(max_length=64)
    epoch_id = TypedIdReference(to="connectors.ServingEpoch")
    epoch_digest = IdentityField(max_length=64)
    plan_digest = IdentityField(max_length=64)
    document = models.BinaryField(help_text="Canonical JSON bytes of the certified readiness document.")
    digest = IdentityField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["org_id", "attempt_key"], name="cutover_readiness_uniq")]


class OrderingBaseline(GuardedModel):
    """The certified source-order baseline of one order-dependent route partition (immutable).

    Written by ``cutover certify`` under the ``v1_stopped`` gate locks (seed 003 "Offline V1
    shutdown ...", step 4): ``origin`` is ``v1_high_water`` (``position`` holds the canonical JSON
    of the drained V1 high-water ``[position..., tie_breaker]`` of ``partition``) or
    ``provider_snapshot_barrier`` (``position`` holds the frozen V1 stream cursor bytes; the
    partition is the whole route, ``partition_key`` the digest of ``[]``). It carries no lease,
    command or executable state; the first V2 lanes start from it.
    """

    org_id = IdentityField(max_length=64)
    attempt_key = IdentityField(max_length=80)
    account_key = IdentityField(max_length=80)
    route_key = IdentityField(max_length=80)
    partition_key = IdentityField(max_length=64)
    partition = models.JSONField()
    origin = models.CharField(max_length=32)
    position = models.BinaryField(null=True)
    ordering_digest = IdentityField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["org_id", "attempt_key", "account_key", "route_key",
                                                       "partition_key"], name="cutover_ordering_baseline_uniq")]


class V1ShutdownCertificate(GuardedModel):
    """The one immutable V1 shutdown certificate of a cutover attempt (seed 003 "Offline V1 shutdown ...", step 5).

    ``document`` holds the canonical JSON bytes ``cutover certify`` bound: the V1 release and schema,
    the frozen configuration generation, the readiness certificate digest, the gate-set digest, the
    current-tree egress manifest digest, the maintenance-barrier receipts, the post-isolation inventory,
    the ReceiptAdmissionKey tombstone and OrderingBaseline coverage, the termination and isolation
    receipts and every reconciliation evidence digest. Every gate of the frozen set references it on
    ``v1_stopped -> v1_drained``.
    """

    org_id = IdentityField(max_length=64)
    attempt_key = IdentityField(max_length=80)
    readiness_digest = IdentityField(max_length=64)
    document = models.BinaryField(help_text="Canonical JSON bytes of the certified shutdown document.")
    digest = IdentityField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["org_id", "attempt_key"], name="cutover_v1_shutdown_uniq")]


class V1RestorePoint(GuardedModel):
    """The one immutable V1 restore point of a certified cutover attempt (control database).

    Seed 003 "Offline V1 shutdown, cold rollback, and V2 cutover", step 6, and "Compressed durable
    model": written by ``cutover restore-point`` only after every gate of the org is ``v1_drained``
    under the attempt's V1ShutdownCertificate, before any V2 mutation, and only after an isolated
    restore rehearsal recomputed every bound digest from the restored copy. It lives on the
    ``control`` database (``nexusflow/routers.py``) so it stays durable outside the database a
    restore rewrites.

    ``manifest`` holds the canonical JSON bytes of the backup manifest (dump files and their
    SHA-256, databases, row counts and content digests per table, schema digest, V1 fact digests,
    V1 release, certificate digest); ``manifest_digest`` is its v2 digest. ``rehearsal`` records the
    rehearsal (timings in seconds, server version, the digests recomputed from the restored copy).
    """

    org_id = IdentityField(max_length=64)
    attempt_key = IdentityField(max_length=80)
    certificate_id = TypedIdReference(to="cutover.V1ShutdownCertificate")
    certificate_digest = IdentityField(max_length=64)
    v1_release = IdentityField(max_length=64)
    schema_digest = IdentityField(max_length=64)
    backup_path = models.CharField(max_length=500, help_text="The directory holding the dump files and manifest.")
    manifest = models.BinaryField(help_text="Canonical JSON bytes of the backup manifest.")
    manifest_digest = IdentityField(max_length=64)
    rehearsal = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["org_id", "attempt_key"], name="cutover_v1_restore_point_uniq")]


class RestoreAttempt(GuardedModel):
    """The journal of one full V1 restore (``cutover restore``) of a cutover attempt (control database).

    Seed 003 "Compressed durable model" (the external L2 RestoreAttempt) and "Transaction and crash
    rules": it lives outside the database it restores, so a coordinator killed at any restore
    boundary resumes the same attempt. ``state``: ``isolated`` (the attempt won ``restoring_v1`` and
    proved V2 served nothing) -> ``loading`` (the main database is being rewritten from the
    V1RestorePoint; a rerun loads it again) -> ``verified`` (every restored digest equals the
    manifest) -> ``completed`` (``v1_restored`` recorded, every gate ``v1_serving``). ``holder_fence``
    grows by one per coordinator that takes the attempt over; every write compares it.
    ``evidence`` holds the isolation proof, the verification digests, the phase timings (seconds)
    and the last refusal's blockers.
    """

    org_id = IdentityField(max_length=64)
    attempt_key = IdentityField(max_length=80)
    restore_point_id = TypedIdReference(to="cutover.V1RestorePoint")
    manifest_digest = IdentityField(max_length=64)
    state = models.CharField(max_length=16)
    version = models.PositiveBigIntegerField(default=1)
    holder = models.CharField(max_length=255, help_text="host:pid of the coordinator holding the attempt.")
    holder_fence = models.PositiveIntegerField(default=1)
    evidence = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["org_id", "attempt_key"], name="cutover_restore_attempt_uniq")]
