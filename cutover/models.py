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
    """One immutable certificate or receipt of the cutover evidence chain."""

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
