"""One TLS client context per process, shared by every provider HTTP client.

``httpx.Client()`` builds a new ``ssl.SSLContext`` and loads the CA bundle
into it every time (about 90 ms of CPU on this project's machines), which
made a fresh client per provider call the costliest single step of a
dispatch (docs/performance.md "Where an effect's time went"). The context is
not changed once built and is safe to share between clients and threads, so
it is built once per process; each call still gets a client (and
connections) of its own, so nothing of one call's connection state reaches
another. Callers pass it as ``httpx.Client(..., verify=tls_context())``.
"""
from __future__ import annotations

import functools
import ssl

import certifi

__all__ = ["tls_context"]


@functools.lru_cache(maxsize=1)
def tls_context() -> ssl.SSLContext:
    """The process's TLS client context: certificate and host name verification on, the certifi CA bundle
    (what ``httpx.Client()`` builds by default)."""
    return ssl.create_default_context(cafile=certifi.where())
