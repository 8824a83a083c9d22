"""V1 runtime schema (seed 003 "V1 concepts to retire"; seed 002 "Scope").

Schema only, in the ``connectors`` app label (imported by ``connectors/models.py``).
Rows are written by :mod:`connectors.v1.store`; stateful rows change only by
compare-and-swap. These tables are the recoverable V1 authority until the first
``v2_serving`` commits; no V2 path reads them.
"""
from django.db import models

from connectors.v1 import transitions
from nexusflow.kernel.identity import IdentityField
from nexusflow.kernel.models import GuardedModel, reason_code_constraint, reason_code_field

DIGEST = {"max_length": 64}


class V1Account(GuardedModel):
    """One account the V1 service serves: the V1 ingress registry (account key -> org).

    Written once by ``manage.py cutover v1-install``; immutable. V1 ingress
    resolves the org here, never through an AccountServingGate.
    """

    org_id = IdentityField(max_length=64)
    account_key = IdentityField(max_length=80, unique=True)
    pack_key = IdentityField(max_length=80)
    installed_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        app_label = "connectors"


class V1ProcessGeneration(GuardedModel):
    """One started V1 worker process generation (seed 003 "Offline V1 shutdown ...": process generations).

    ``worker_id`` names the :class:`connectors.models.WorkerProcess` row whose
    termination proof (``terminated_at``) ends this generation; a terminated
    generation is never reenabled. ``release`` is the V1 release tuple digest the
    process runs (code of ``connectors/v1`` and its egress manifest).
    """

    worker_id = IdentityField(max_length=120, unique=True)
    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    release = IdentityField(**DIGEST)
    started_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        app_label = "connectors"


class V1TransportKey(GuardedModel):
    """V1 transport idempotency: one row per accepted V1 delivery, with its raw body.

    ``transport_key`` and ``identity_digest`` are derived exactly as V2 admission
    derives them (the route's item keys), so the cutover can export them as
    ``ReceiptAdmissionKey`` tombstones byte for byte (seed 003 "Inbound facts").
    """

    org_id = IdentityField(max_length=64)
    account_key = IdentityField(max_length=80)
    channel = IdentityField(max_length=80)
    route_key = IdentityField(max_length=80)
    transport_key = IdentityField(**DIGEST)
    identity_digest = IdentityField(**DIGEST)
    body = models.BinaryField(help_text="The accepted body (pushed) or envelope (pulled), byte-exact.")
    body_digest = IdentityField(**DIGEST)
    event_count = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        app_label = "connectors"
        constraints = [models.UniqueConstraint(fields=["org_id", "account_key", "channel", "transport_key"],
                                               name="v1_transport_key_uniq")]


class V1Event(GuardedModel):
    """The V1 Event: the normalized item plus its execution status, lease, retry and owner (all in one row).

    This is exactly the mirror seed 003 retires ("Event execution status, lease,
    retry, replay, and execution-owner mirrors"). ``lease_owner`` is the
    worker id holding it under ``scheduler_fence`` (the org's SchedulerLease
    token at claim); ``handoff_key`` is the Runtime message key of its
    application command; acceptance of that message completes it.
    """

    org_id = IdentityField(max_length=64)
    account_key = IdentityField(max_length=80)
    channel = IdentityField(max_length=80)
    route_key = IdentityField(max_length=80)
    transport = models.ForeignKey(V1TransportKey, on_delete=models.PROTECT, related_name="events")
    ordinal = models.PositiveIntegerField()
    source_event_key = IdentityField(max_length=160)
    canonical_kind = models.CharField(max_length=80, blank=True, default="")
    source_locator = models.CharField(max_length=160, blank=True, default="")
    occurred_at_ms = models.BigIntegerField(default=0)
    payload = models.JSONField(null=True)
    state = models.CharField(max_length=16)
    version = models.PositiveBigIntegerField(default=1)
    reason_code = reason_code_field()
    attempt_count = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    lease_owner = models.CharField(max_length=120, blank=True, default="")
    lease_token = IdentityField(max_length=32, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    scheduler_fence = models.PositiveBigIntegerField(default=0)
    handoff_key = IdentityField(max_length=128, blank=True, default="")
    completed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        app_label = "connectors"
        constraints = [
            models.UniqueConstraint(fields=["org_id", "account_key", "source_event_key"], name="v1_event_key_uniq"),
            reason_code_constraint(transitions.V1_EVENT, name="v1_event_reason_chk"),
        ]
        indexes = [models.Index(fields=["state", "next_attempt_at"], name="v1_event_state_idx")]


class V1SchedulerLease(GuardedModel):
    """The V1 SchedulerLease of one org and scheduler name: who may claim V1 work now.

    ``fence_token`` grows on every take-over; an event claimed under an older
    token is recoverable once its holder is proven gone or its lease expired.
    """

    org_id = IdentityField(max_length=64)
    name = IdentityField(max_length=40)
    state = models.CharField(max_length=8)
    version = models.PositiveBigIntegerField(default=1)
    holder = models.CharField(max_length=120, blank=True, default="")
    fence_token = models.PositiveBigIntegerField(default=0)
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        app_label = "connectors"
        constraints = [models.UniqueConstraint(fields=["org_id", "name"], name="v1_scheduler_lease_uniq")]


class V1StreamCursor(GuardedModel):
    """The V1 read position of one pulled route of one account.

    ``cursor`` holds the provider's opaque cursor as canonical JSON bytes (NULL:
    from the earliest retained event); it advances only after the V1 rows of
    the batch committed.
    """

    org_id = IdentityField(max_length=64)
    account_key = IdentityField(max_length=80)
    route_key = IdentityField(max_length=80)
    state = models.CharField(max_length=8)
    version = models.PositiveBigIntegerField(default=1)
    cursor = models.BinaryField(null=True)
    polled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        app_label = "connectors"
        constraints = [models.UniqueConstraint(fields=["org_id", "account_key", "route_key"],
                                               name="v1_stream_cursor_uniq")]


class V1ProviderCall(GuardedModel):
    """The durable pre-I/O row of one V1 provider call (push PATCH or stream fetch).

    Committed ``prepared`` with the full request before anything is sent, then
    ``sending`` with ``io_may_have_started_at`` (the pre-I/O marker) committed
    before the HTTP call; the answer settles it. A row left ``sending`` or
    ``ambiguous`` is a V1 call interrupted around I/O: the cutover reconciles it
    before certification. ``call_site`` is its egress manifest entry.
    """

    org_id = IdentityField(max_length=64)
    account_key = IdentityField(max_length=80)
    call_site = IdentityField(max_length=120)
    kind = models.CharField(max_length=8, help_text="push | poll")
    subject = models.CharField(max_length=160, help_text="push: source record key; poll: route key.")
    method = models.CharField(max_length=8)
    url = models.CharField(max_length=500)
    request_body = models.BinaryField()
    request_digest = IdentityField(**DIGEST)
    remote_id = IdentityField(max_length=160, blank=True, default="")
    state = models.CharField(max_length=16)
    version = models.PositiveBigIntegerField(default=1)
    reason_code = reason_code_field()
    io_may_have_started_at = models.DateTimeField(null=True, blank=True)
    response_status = models.IntegerField(null=True, blank=True)
    response_body = models.BinaryField(null=True)
    error = models.CharField(max_length=255, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        app_label = "connectors"
        constraints = [reason_code_constraint(transitions.V1_PROVIDER_CALL, name="v1_provider_call_reason_chk")]


class V1MaintenanceBarrier(GuardedModel):
    """One owner-level maintenance barrier of the V1 service of one org (seed 003 "Offline V1 shutdown ...").

    ``kind`` is ``ingress`` (V1 webhook admission and stream polling), ``root_outbound``
    (a new root V1 outbound request: ``v1_push``) or ``configuration`` (a new
    ConnectorServiceConfigurationGeneration). ``closed`` stops new roots only: V1 work
    already accepted keeps running. Admission share-locks the row in its own
    transaction, so closing waits for every in-flight admission to return.
    ``fence_token`` grows on every close and reopen; ``attempt_key`` names the
    cutover attempt that closed it last.
    """

    org_id = IdentityField(max_length=64)
    kind = IdentityField(max_length=16)
    state = models.CharField(max_length=8)
    version = models.PositiveBigIntegerField(default=1)
    fence_token = models.PositiveBigIntegerField(default=0)
    attempt_key = IdentityField(max_length=80, blank=True, default="")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        app_label = "connectors"
        constraints = [models.UniqueConstraint(fields=["org_id", "kind"], name="v1_maintenance_barrier_uniq")]


class V1EgressDenial(GuardedModel):
    """The permanent denial of provider egress to the V1 process generations of one org (immutable).

    Written once per cutover attempt by ``cutover stop`` (seed 003 "Offline V1
    shutdown, cold rollback, and V2 cutover", step 3). Every V1ProcessGeneration
    with ``id <= through_generation`` (and any process that started no generation)
    may no longer commit a V1 pre-I/O row or marker for the org: egress checks this
    under the org's ``root_outbound`` barrier row lock (:func:`connectors.v1.egress.v1_call_prepare`).
    A later generation (a certified cold abort) is a new row id and is not denied.
    """

    org_id = IdentityField(max_length=64)
    attempt_key = IdentityField(max_length=80)
    through_generation = models.PositiveBigIntegerField(help_text="Highest V1ProcessGeneration id denied (0: none).")
    release = IdentityField(**DIGEST)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        app_label = "connectors"
        constraints = [models.UniqueConstraint(fields=["org_id", "attempt_key"], name="v1_egress_denial_uniq")]
