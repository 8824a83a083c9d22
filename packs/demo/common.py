"""What the demo driver (:mod:`packs.demo.run`) and its chaos supervisor (:mod:`packs.demo.chaos`) share.

The driver runs the supervisor; the supervisor needs the driver's error, the
web server's command line and the attention invariant. They live here, below
both, so neither module imports the other back.
"""
from __future__ import annotations

import sys


class DemoError(Exception):
    """The demo could not run (exit code 2); invariant failures exit 1 instead."""


#: Seconds the web server keeps an idle keep-alive connection open (gunicorn's ``--keep-alive``); a client that
#: reuses connections drops an idle one sooner (:class:`packs.demo.run.TimedPoster`).
KEEPALIVE_SECONDS = 2


def web_server_argv(port: int, *, workers: int) -> list[str]:
    """The web server's command line: gunicorn on ``127.0.0.1:port`` with ``workers`` processes of 4 threads.

    It serves the API, the admin and (WhiteNoise) the static files collected
    into ``STATIC_ROOT``; the demo, its chaos run and the journeys start it.
    No control socket: nothing uses it, and its default path is one per user,
    which servers started side by side would take from each other.
    """
    return [sys.executable, "-m", "gunicorn", "nexusflow.wsgi:application", "--bind", f"127.0.0.1:{port}",
            "--workers", str(workers), "--threads", "4", "--timeout", "60", "--keep-alive", str(KEEPALIVE_SECONDS),
            "--no-control-socket"]


def _attention_rows(model) -> list[tuple[int, str, str]]:
    """``(id, state, reason code)`` of every ``model`` row whose code is of class ``attention``, by id."""
    from nexusflow.kernel.reasons import ATTENTION, codes_of_class, load_all_reasons

    load_all_reasons()
    return [(int(pk), state, code) for pk, state, code in
            model.objects.filter(reason_code__in=sorted(codes_of_class(ATTENTION)))
            .order_by("id").values_list("id", "state", "reason_code")]


def attention_effects() -> list[tuple[int, str, str]]:
    """``(effect id, state, reason code)`` of every RemoteEffect whose code is of class ``attention``, by id.

    A ``quarantined`` effect with a benign code (an older version superseded
    by a newer one that already reached the provider) is not among them.
    """
    from connectors.models import RemoteEffect

    return _attention_rows(RemoteEffect)


def attention_flow_runs() -> list[tuple[int, str, str]]:
    """``(run id, state, reason code)`` of every FlowRun that ended with an ``attention`` code, by id.

    A run ended ``flow_step_expected_refusal`` (a push with nothing to send)
    or ``flow_trigger_record_deleted`` is a benign, recorded outcome and is
    not among them.
    """
    from nexusflow.flows.models import FlowRun

    return _attention_rows(FlowRun)
