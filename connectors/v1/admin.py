"""Read-only support views for every V1 runtime fact (imported by ``connectors/admin.py``)."""
from django.contrib import admin

from connectors.v1 import models
from nexusflow.kernel.admin import ReadOnlyAdmin, ReasonClassFilter


@admin.register(models.V1Account)
class V1AccountAdmin(ReadOnlyAdmin):
    list_display = ("account_key", "org_id", "pack_key", "installed_at")


@admin.register(models.V1ProcessGeneration)
class V1ProcessGenerationAdmin(ReadOnlyAdmin):
    list_display = ("id", "worker_id", "host", "pid", "release", "started_at")
    search_fields = ("worker_id",)


@admin.register(models.V1TransportKey)
class V1TransportKeyAdmin(ReadOnlyAdmin):
    list_display = ("id", "org_id", "account_key", "channel", "route_key", "transport_key", "event_count",
                    "created_at")
    search_fields = ("transport_key",)
    exclude = ("body",)


@admin.register(models.V1Event)
class V1EventAdmin(ReadOnlyAdmin):
    list_display = ("id", "org_id", "account_key", "source_event_key", "state", "reason_code", "reason_class",
                    "attempt_count", "lease_owner", "lease_expires_at", "handoff_key", "updated_at")
    list_filter = ("state", "reason_code", ReasonClassFilter)
    search_fields = ("source_event_key", "source_locator", "handoff_key")


@admin.register(models.V1SchedulerLease)
class V1SchedulerLeaseAdmin(ReadOnlyAdmin):
    list_display = ("id", "org_id", "name", "state", "holder", "fence_token", "expires_at")
    list_filter = ("state",)


@admin.register(models.V1StreamCursor)
class V1StreamCursorAdmin(ReadOnlyAdmin):
    list_display = ("id", "org_id", "account_key", "route_key", "state", "polled_at")
    list_filter = ("state",)
    exclude = ("cursor",)


@admin.register(models.V1ProviderCall)
class V1ProviderCallAdmin(ReadOnlyAdmin):
    list_display = ("id", "org_id", "account_key", "call_site", "kind", "subject", "method", "state", "reason_code",
                    "reason_class", "io_may_have_started_at", "response_status", "updated_at")
    list_filter = ("state", "call_site", "reason_code", ReasonClassFilter)
    exclude = ("request_body", "response_body")


@admin.register(models.V1MaintenanceBarrier)
class V1MaintenanceBarrierAdmin(ReadOnlyAdmin):
    list_display = ("org_id", "kind", "state", "fence_token", "attempt_key", "updated_at")
    list_filter = ("kind", "state")


@admin.register(models.V1EgressDenial)
class V1EgressDenialAdmin(ReadOnlyAdmin):
    list_display = ("id", "org_id", "attempt_key", "through_generation", "release", "created_at")
    search_fields = ("attempt_key",)
