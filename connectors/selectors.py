"""Connector reads that need SQL the ORM cannot say (ARCHITECTURE.md section 2, "selectors.py").

Worker scans here are non-locking and cross-org: they return ``(org_id, id)``
pairs so the caller loads and locks each row under its own org scope
(ARCHITECTURE.md section 6, "Trusted scope").
"""
from __future__ import annotations

import datetime as dt

from django.db import connection, connections


def candidate_lanes(now: dt.datetime, limit: int = 20) -> list[tuple[str, int]]:
    """Lanes with ready work that no live lease holds, oldest work first (non-locking).

    Args:
        now: the database clock; a lease whose ``lease_expires_at`` is not after it is dead.
        limit: most lanes returned.

    Returns:
        ``[(org_id, lane_id), ...]`` ordered by the lane's oldest ready Execution id.

    Seed 003, "Durable source ordering".
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT l.org_id, e.lane_id FROM connectors_execution e JOIN connectors_orderinglane l ON l.id = e.lane_id "
            "WHERE e.state = 'ready' AND (l.active_execution_id IS NULL OR NOT EXISTS ("
            " SELECT 1 FROM connectors_executionattempt a WHERE a.execution_id = l.active_execution_id"
            " AND a.state = 'started' AND a.lease_expires_at > %s)) "
            "GROUP BY l.org_id, e.lane_id ORDER BY MIN(e.id) LIMIT %s",
            [now, limit],
        )
        return [(row[0], row[1]) for row in cursor.fetchall()]


def head_of_lane_prepared(now: dt.datetime, nonterminal: tuple[str, ...], limit: int = 10) -> list[tuple[str, int]]:
    """Prepared RemoteEffects that are due and first in their dispatch lane (non-locking).

    Args:
        now: the database clock; an effect whose ``next_attempt_at`` is after it is not due.
        nonterminal: the RemoteEffect states that still occupy a lane.
        limit: most effects returned.

    Returns:
        ``[(org_id, effect_id), ...]`` in id order.

    Seed 002, "DispatchLane"; seed 003, "Outbound effects".
    """
    placeholders = ", ".join(["%s"] * len(nonterminal))
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT e.org_id, e.id FROM connectors_remoteeffect e WHERE e.state = 'prepared' "
            f"AND (e.next_attempt_at IS NULL OR e.next_attempt_at <= %s) AND NOT EXISTS ("
            f" SELECT 1 FROM connectors_remoteeffect p WHERE p.org_id = e.org_id AND p.dispatch_lane = e.dispatch_lane"
            f" AND p.state IN ({placeholders}) AND (p.lane_sequence < e.lane_sequence"
            f" OR (p.lane_sequence = e.lane_sequence AND p.id < e.id))) ORDER BY e.id LIMIT %s",
            [now, *nonterminal, limit],
        )
        return [(row[0], row[1]) for row in cursor.fetchall()]


def database_answers(using: str = "default") -> None:
    """Run a trivial query on ``using`` (the readiness probe).

    Raises:
        django.db.DatabaseError: the database does not answer.
    """
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT 1")
