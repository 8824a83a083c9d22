"""One TLS context per process for provider calls, with verification on (docs/performance.md)."""
from __future__ import annotations

import ssl

import httpx

from nexusflow.kernel.tls import tls_context


def test_the_context_is_built_once_and_verifies_certificates_and_host_names():
    context = tls_context()
    assert context is tls_context()
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert context.cert_store_stats()["x509_ca"] > 0  # the CA bundle is loaded


def test_clients_built_with_it_share_it_and_keep_their_own_connections():
    first = httpx.Client(timeout=5, verify=tls_context())
    second = httpx.Client(timeout=5, verify=tls_context())
    try:
        contexts = {id(c._transport._pool._ssl_context) for c in (first, second)}
        assert contexts == {id(tls_context())}
        assert first._transport._pool is not second._transport._pool
    finally:
        first.close()
        second.close()
