"""The V1 egress manifest is generated from the code; an untracked provider call site fails the build.

Seed 003 "Ownership boundaries" (the frozen current-tree egress and state manifest of V1).
"""
from __future__ import annotations

import json

from connectors.v1.egress_manifest import MANIFEST_PATH, generate, manifest_problems, render, scan
from tests.guardrails import ROOT, check_http_imports

TRACKED = '''
import httpx

def provider_io(**kw):
    return lambda fn: fn

@provider_io(effect="connectors.V1ProviderCall", marker="io_may_have_started_at")
def send(call, client):
    _mark_sending(call)
    return client.request("PATCH", call.url)

def push(record):
    call = v1_call_prepare(call_site="v1.push.update", kind="push")
    return send(call, None)
'''


def test_the_committed_manifest_is_the_one_the_code_generates_and_has_no_problem():
    manifest, problems = generate()
    assert problems == [] and manifest_problems() == []
    assert MANIFEST_PATH.read_text(encoding="utf-8") == render(manifest)
    (site,) = manifest["provider_io_sites"]
    assert (site["module"], site["function"], site["effect"], site["pre_io_marker"]) == \
        ("connectors/v1/egress.py", "v1_call_send", "connectors.V1ProviderCall", "io_may_have_started_at")
    assert {(r["call_site"], r["module"]) for r in manifest["effect_rows"]} == {
        ("v1.push.update", "connectors/v1/push.py"), ("v1.poll.fetch", "connectors/v1/poller.py")}
    assert all(r["sent_by"] == ["v1_call_send"] for r in manifest["effect_rows"])


def test_only_the_v1_egress_module_and_its_two_callers_import_an_http_client():
    importing = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "connectors" / "v1").rglob("*.py")
                       if check_http_imports(p.read_text(encoding="utf-8"), p.relative_to(ROOT).as_posix()))
    assert importing == ["connectors/v1/egress.py", "connectors/v1/poller.py", "connectors/v1/push.py"]


def test_a_tracked_site_passes_the_scan():
    manifest, problems = scan({"connectors/v1/x.py": TRACKED})
    assert problems == [] and len(manifest["provider_io_sites"]) == 1 and len(manifest["effect_rows"]) == 1


def test_an_untracked_provider_call_site_is_caught():
    untracked = TRACKED + '\ndef sneaky(url):\n    return httpx.post(url)\n'
    _manifest, problems = scan({"connectors/v1/x.py": untracked})
    assert len(problems) == 1 and "untracked provider call httpx.post() in sneaky()" in problems[0]
    client_call = TRACKED + '\ndef other(http_client):\n    http_client.get("/x")\n'
    _manifest, problems = scan({"connectors/v1/x.py": client_call})
    assert len(problems) == 1 and "untracked provider call http_client.get()" in problems[0]


def test_a_call_before_its_pre_io_marker_is_caught():
    late = TRACKED.replace('    _mark_sending(call)\n    return client.request("PATCH", call.url)\n',
                           '    reply = client.request("PATCH", call.url)\n    _mark_sending(call)\n    return reply\n')
    _manifest, problems = scan({"connectors/v1/x.py": late})
    # The call is refused as a site, so the row it would send is reported unsent as well.
    assert any("client.request() in send() is not preceded by the pre-I/O marker" in p for p in problems)


def test_an_effect_row_without_a_literal_site_or_never_sent_is_caught():
    computed = TRACKED.replace('call_site="v1.push.update"', 'call_site=name')
    assert any("literal call_site" in p for p in scan({"connectors/v1/x.py": computed})[1])
    unsent = TRACKED.replace("    return send(call, None)\n", "    return call\n")
    assert any("never sent" in p for p in scan({"connectors/v1/x.py": unsent})[1])


def test_the_manifest_command_checks_and_prints(capsys):
    from django.core.management import call_command

    call_command("v1_egress_manifest", "--check")
    assert "1 provider-I/O site(s), 2 effect row(s)" in capsys.readouterr().out
    call_command("v1_egress_manifest")
    assert json.loads(capsys.readouterr().out) == generate()[0]
