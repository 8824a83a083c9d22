"""Shared mechanism for every NexusFlow authority (ARCHITECTURE.md section 6).

The kernel owns no models. It provides trusted scope objects, canonical
identity validation, profiled digests, the CAS store base, transition tables,
the lock-order guard, failpoints, reason codes and the database clock.
"""
