"""Prometheus metrics computed at scrape time from authoritative database state (seed 004 section 19).

Nothing here counts in memory: every value is read from the database when
``GET /metrics`` is scraped, so the answer is the same from any gunicorn
process or worker host and survives restarts (no ``PROMETHEUS_MULTIPROC_DIR``
is needed). Monotone families count immutable rows (attempts never leave the
table), so ``rate()`` over them is meaningful; the others are gauges.

Every app registers its families in ``AppConfig.ready()`` with
:func:`register_families` (ARCHITECTURE.md section 2, "Which way imports
point"); the kernel adds the reason-code families itself
(:func:`reason_families`), which ``ops/prometheus/alerts.yml`` alerts on
(:func:`alert_rules`). Labels are closed sets (states, reason codes, queue
classes, step kinds, plan step keys, producer kinds): never a record id or an
org id.
"""
from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Iterable

from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)

from .clock import db_now

#: The prefix of every family this project exports.
PREFIX = "nexusflow_"
#: ``now -> metrics``; ``now`` is the database clock read once per scrape.
Families = Callable[[dt.datetime], Iterable[Metric]]
_FAMILIES: dict[str, Families] = {}

#: The reason-code families (:func:`reason_families`).
REASON_ROWS = f"{PREFIX}reason_rows"
REASON_OLDEST_AGE = f"{PREFIX}reason_oldest_age_seconds"
#: Columns that say when a row last changed, best first; the first one a model has dates its reason.
SINCE_COLUMNS = ("updated_at", "resolved_at", "completed_at", "created_at")


def register_families(name: str, families: Families) -> None:
    """Register ``families`` under ``name`` (unique across apps; registering the same function again is a no-op).

    Raises:
        ValueError: ``name`` is registered already with another function.
    """
    current = _FAMILIES.get(name)
    if current is not None and current is not families:
        raise ValueError(f"metric families {name!r} are registered already")
    _FAMILIES[name] = families


def age_seconds(now: dt.datetime, since: dt.datetime | None) -> float:
    """Seconds from ``since`` to ``now`` (both aware UTC or both naive), never negative; 0 for ``None``."""
    if since is None:
        return 0.0
    if since.tzinfo is None and now.tzinfo is not None:
        since = since.replace(tzinfo=dt.UTC)
    return max(0.0, (now - since).total_seconds())


def gauge(name: str, documentation: str, labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
    """A gauge family named ``nexusflow_<name>``."""
    return GaugeMetricFamily(PREFIX + name, documentation, labels=list(labels))


def counter(name: str, documentation: str, labels: tuple[str, ...] = ()) -> CounterMetricFamily:
    """A counter family named ``nexusflow_<name>_total`` (``name`` without ``_total``)."""
    return CounterMetricFamily(PREFIX + name, documentation, labels=list(labels))


def summary(name: str, documentation: str, labels: tuple[str, ...] = ()) -> SummaryMetricFamily:
    """A summary family ``nexusflow_<name>`` (samples ``_count`` and ``_sum``; ``add_metric(labels, count, sum)``)."""
    return SummaryMetricFamily(PREFIX + name, documentation, labels=list(labels))


def reason_machines() -> list[tuple[str, object, frozenset[str], str | None]]:
    """Every state machine whose rows carry reason codes: ``(machine name, model, reason states, since column)``.

    ``since column`` is the first of :data:`SINCE_COLUMNS` the model has, or ``None`` (its rows are counted
    but carry no age).
    """
    from django.apps import apps

    from .transitions import REGISTRY, import_app_modules

    import_app_modules("transitions")
    out = []
    for name, machine in sorted(REGISTRY.items()):
        if not machine.reason_required:
            continue
        model = apps.get_model(name)
        columns = {f.name for f in model._meta.concrete_fields}
        if "reason_code" not in columns:
            continue
        since = next((c for c in SINCE_COLUMNS if c in columns), None)
        out.append((name, model, machine.reason_required, since))
    return out


def reason_families(now: dt.datetime) -> Iterable[Metric]:
    """``nexusflow_reason_rows`` and ``nexusflow_reason_oldest_age_seconds`` by machine, state and reason code.

    Rows of every machine in a state that requires a reason code (halted,
    quarantined, refused: seed 003, "Operational liveness and maintenance
    admission"); the age is the database clock minus the oldest row's
    :data:`SINCE_COLUMNS` column (the time it entered that state, or the
    nearest the table records). ``severity`` is the code's class.
    """
    from .reasons import load_all_reasons
    from .selectors import reason_rows

    registry = load_all_reasons()
    rows = gauge("reason_rows", "Rows in a reason-carrying state (halted, quarantined, refused), by reason code.",
                 ("machine", "state", "reason_code", "severity"))
    ages = gauge("reason_oldest_age_seconds", "Seconds since the oldest such row entered its state (database clock).",
                 ("machine", "state", "reason_code", "severity"))
    for name, model, states, since in reason_machines():
        for state, code, count, oldest in reason_rows(model, states, since):
            severity = registry[code].severity_class if code in registry else "unregistered"
            rows.add_metric([name, state, code, severity], count)
            if since is not None:
                ages.add_metric([name, state, code, severity], age_seconds(now, oldest))
    yield rows
    yield ages


class StateCollector:
    """The prometheus-client collector: reads the database clock, then every registered family."""

    def collect(self) -> Iterable[Metric]:
        from .transitions import import_app_modules

        import_app_modules("reasons")
        now = db_now()
        merged: dict[str, Metric] = {}
        for metric in self._all(now):
            # Two apps may export the same family (``queue_depth`` by role): one family, both apps' samples.
            if metric.name in merged:
                merged[metric.name].samples.extend(metric.samples)
            else:
                merged[metric.name] = metric
        yield from merged.values()

    def _all(self, now: dt.datetime) -> Iterable[Metric]:
        yield from reason_families(now)
        for _name, families in sorted(_FAMILIES.items()):
            yield from families(now)


def scrape() -> bytes:
    """The Prometheus text exposition of every family, computed now from the database."""
    from prometheus_client import generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(StateCollector())
    return generate_latest(registry)


# --- alert rules ---------------------------------------------------------------------------------------------
def _alert_name(code: str) -> str:
    return "Nexusflow" + "".join(part.capitalize() for part in code.split("_"))


def alert_rules() -> dict:
    """The Prometheus rule file for every ``attention`` reason code (seed 003: each carries an alert deadline).

    One group per owning app; one rule per code: it fires while the oldest
    row carrying the code has been in its reason-carrying state longer than
    the code's ``alert_after_seconds``, read from
    ``nexusflow_reason_oldest_age_seconds`` (authoritative state, never the
    absence of a log line: seed 004 section 19). Benign codes raise no alert.
    Returns ``{"groups": [...]}`` in a stable order.
    """
    from .reasons import ATTENTION, load_all_reasons

    groups: dict[str, list[dict]] = {}
    for code, reason in sorted(load_all_reasons().items()):
        if reason.severity_class != ATTENTION:
            continue
        groups.setdefault(reason.owner, []).append({
            "alert": _alert_name(code),
            "expr": (f'max by (machine, state, reason_code) ({REASON_OLDEST_AGE}{{reason_code="{code}"}}) '
                     f"> {reason.alert_after_seconds}"),
            "labels": {"severity": reason.severity_class, "owner": reason.owner, "reason_code": code},
            "annotations": {
                "summary": (f"{{{{ $labels.machine }}}} rows in {{{{ $labels.state }}}} have carried {code} for "
                            f"more than {reason.alert_after_seconds}s"),
                "evidence": f"manage.py reason_codes {code} --org ORG ({reason.evidence})",
                "remediations": ", ".join(reason.remediations),
            },
        })
    return {"groups": [{"name": f"nexusflow-reasons-{owner}", "rules": rules} for owner, rules in sorted(groups.items())]}


def alert_rules_text() -> str:
    """:func:`alert_rules` as the YAML text of ``ops/prometheus/alerts.yml`` (a generated-file header first)."""
    import yaml

    header = ("# Generated by `manage.py prometheus_alerts` from the reason-code registry "
              "(nexusflow/kernel/reasons.py and each app's reasons.py).\n# Do not edit: change a code's "
              "alert_after_seconds and run the command again.\n")
    return header + yaml.safe_dump(alert_rules(), sort_keys=False, width=120)


#: The sample names a family of each type exports.
_SAMPLE_SUFFIXES = {"counter": ("_total",), "summary": ("_count", "_sum"), "gauge": ("",)}


def sample_names() -> set[str]:
    """Every sample name :func:`scrape` can export (a counter's ``_total``, a summary's ``_count`` and ``_sum``),
    whether or not the family has a sample right now."""
    return {metric.name + suffix for metric in StateCollector().collect()
            for suffix in _SAMPLE_SUFFIXES[metric.type]}


_SAMPLE = re.compile(r"\b(nexusflow_[a-z0-9_]+)")


def expression_families(expr: str) -> set[str]:
    """The ``nexusflow_*`` series names a PromQL expression reads (``_sum``/``_count`` kept as written)."""
    return set(_SAMPLE.findall(expr))
