"""The web server the demo and the journeys run serves the admin's assets and the interactive API docs.

One gunicorn process (``packs.demo.run.web_server_argv``, as the demo starts
it) on a free loopback port, after ``collectstatic`` into a directory of its
own; every request goes over HTTP, no browser needed. Ready means the health
endpoint answered 200, never a sleep.
"""
from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from urllib.parse import urlsplit

import httpx
import pytest

from nexusflow.kernel.net import free_local_port
from packs.demo.run import Processes, web_server_argv
from tests.api_fuzz_support import wait_healthy
from tests.conftest import run_manage, subprocess_env

READY_TIMEOUT_SECONDS = 60.0
REQUEST_TIMEOUT_SECONDS = 10.0


class _Assets(HTMLParser):
    """Collects the ``<link href>`` and ``<script src>`` URLs of one page."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "link" and attrs.get("href"):
            self.urls.append(attrs["href"])
        if tag == "script" and attrs.get("src"):
            self.urls.append(attrs["src"])


def _assets(html: str) -> list[str]:
    parser = _Assets()
    parser.feed(html)
    return parser.urls


@pytest.fixture(scope="module")
def web(django_db_setup, tmp_path_factory):
    """Base URL of a running gunicorn serving the test databases and a freshly collected STATIC_ROOT."""
    run_dir = tmp_path_factory.mktemp("web")
    env = subprocess_env(NEXUS_STATIC_ROOT=str(run_dir / "static"))
    collected = run_manage(["collectstatic", "--noinput", "-v0"], env, timeout=180)
    assert collected.returncode == 0, collected.stdout + collected.stderr
    port = free_local_port()
    procs = Processes()
    proc = procs.start("web", web_server_argv(port, workers=1), env, run_dir)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, base, run_dir / "web.log")
        with httpx.Client(base_url=base, timeout=REQUEST_TIMEOUT_SECONDS) as client:
            yield client
    finally:
        procs.stop_all()


def _assert_local_assets_answer(client: httpx.Client, page: str) -> list[str]:
    urls = _assets(page)
    assert urls, "the page references no stylesheet or script"
    for url in urls:
        parts = urlsplit(url)
        assert not parts.scheme and not parts.netloc, f"{url} is not served by this server"
        response = client.get(url)
        assert response.status_code == 200, (url, response.status_code)
        assert response.content, url
    return urls


def test_an_admin_stylesheet_answers_200_with_its_compressed_copy(web):
    response = web.get("/static/admin/css/base.css", headers={"Accept-Encoding": "gzip"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/css")
    assert response.headers.get("content-encoding") == "gzip"  # the copy collectstatic compressed
    assert b"--body-fg" in response.content  # httpx decoded it: the admin's real stylesheet


def test_the_admin_login_page_gets_every_asset_it_references(web):
    page = web.get("/admin/login/")
    assert page.status_code == 200
    urls = _assert_local_assets_answer(web, page.text)
    assert "/static/admin/css/base.css" in urls


def test_the_swagger_ui_loads_its_assets_and_the_schema_from_this_server(web):
    page = web.get("/api/docs/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert 'id="swagger-ui"' in page.text
    urls = _assert_local_assets_answer(web, page.text)
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js" in urls
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui.css" in urls
    found = re.search(r'\burl: ("(?:[^"\\]|\\.)*")', page.text)  # the init script's schema URL (a JS string)
    assert found, "the page names no schema URL"
    schema_url = json.loads(found.group(1))
    assert schema_url == "/api/schema/"
    schema = web.get(schema_url)
    assert schema.status_code == 200
    assert schema.text.startswith("openapi: 3")
    assert "/api/v2/health/" in schema.text
