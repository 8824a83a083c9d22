"""The ProjectionWindow contract a pack route declares: pure validators, no database access.

A route may declare one window as data (seed 003 "Inbound facts"; the
runtime side is :mod:`connectors.inbound.windows`)::

    "window": {"policy": "latest" | "settle" | "batch" | "grouped",
               "grouping": [field, ...],          # grouped: required; latest/settle: default the partition
               "close_after_seconds": 30,         # the window closes this long after it opens (DB clock)
               "max_items": 100}                  # batch/grouped: it also closes when full

:mod:`connectors.contracts.pack_document` checks it when a pack is loaded, next to the route's
ordering contract (:mod:`connectors.contracts.ordering`).
"""
from __future__ import annotations

POLICIES = ("latest", "settle", "batch", "grouped")


def validate_window(window) -> dict:
    """Check a route's ``window`` object.

    Raises:
        ValueError: unknown policy, missing grouping for ``grouped``, bad numbers.
    """
    if not isinstance(window, dict) or window.get("policy") not in POLICIES:
        raise ValueError(f"window.policy must be one of {', '.join(POLICIES)}")
    grouping = window.get("grouping", [])
    if not isinstance(grouping, list) or not all(isinstance(f, str) and f for f in grouping):
        raise ValueError("window.grouping must be a list of field names")
    if window["policy"] == "grouped" and not grouping:
        raise ValueError("a grouped window names its grouping fields")
    if window["policy"] == "batch" and grouping:
        raise ValueError("a batch window groups the whole route; use policy grouped to group by fields")
    close = window.get("close_after_seconds")
    if not isinstance(close, int) or isinstance(close, bool) or close < 0:
        raise ValueError("window.close_after_seconds must be an integer >= 0")
    max_items = window.get("max_items", 1000)
    if not isinstance(max_items, int) or isinstance(max_items, bool) or max_items < 1:
        raise ValueError("window.max_items must be an integer >= 1")
    return window


def validate_window_ordering(window: dict, ordering: dict) -> None:
    """Check that a route's window fits its ordering contract (its window Execution takes one lane position).

    - ``order_independent``: any policy (no lane);
    - ``latest_source_position``: ``latest`` or ``settle`` grouped by the
      ordering partition (no ``grouping`` fields): every member is then in the
      window Execution's own lane, and a newer window of the lane may supersede
      an older one. A ``batch`` / ``grouped`` window spans partitions, so a later
      window on its lane would supersede members of other partitions unapplied;
    - ``strict_source_sequence``: no window; the claim takes each exact
      successor sequence, and a window Execution carries only one of them.

    Raises:
        ValueError: the combination is refused.
    """
    contract = ordering.get("contract")
    if contract == "strict_source_sequence":
        raise ValueError("a strict_source_sequence route cannot declare a window: its claim takes every exact "
                         "successor sequence, and a window Execution carries only one position")
    if contract == "latest_source_position" and (window["policy"] not in ("latest", "settle")
                                                 or window.get("grouping")):
        raise ValueError("a window on a latest_source_position route must be policy latest or settle grouped by "
                         "the ordering partition (no grouping fields): its one Execution takes its lane's position")
