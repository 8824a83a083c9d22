"""The linter's exceptions are explained: every ``# noqa`` names its codes and a reason on the same line.

``make lint`` (ruff, ``ruff.toml``) runs before the suite; this keeps the escapes from it honest.
"""
from __future__ import annotations

import re
import subprocess

from tests.conftest import ROOT

NOQA = re.compile(r"#\s*noqa\b(?P<rest>.*)$")
WITH_REASON = re.compile(r"^:\s*[A-Z]+[0-9]+(\s*,\s*[A-Z]+[0-9]+)*\s+[-(]?\s*\w.*$")


def _tracked_python() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    return listed.stdout.split()


def test_every_noqa_names_its_codes_and_a_reason():
    bare = []
    for name in _tracked_python():
        for number, line in enumerate((ROOT / name).read_text(encoding="utf-8").splitlines(), 1):
            found = NOQA.search(line)
            if found and not WITH_REASON.match(found.group("rest")):
                bare.append(f"{name}:{number}: {line.strip()}")
    assert not bare, "a noqa without codes and a reason:\n" + "\n".join(bare)


def test_the_rule_tells_a_bare_noqa_from_an_explained_one():
    assert not WITH_REASON.match(NOQA.search("import x  # noqa: F401").group("rest"))
    assert not WITH_REASON.match(NOQA.search("import x  # noqa").group("rest"))
    assert WITH_REASON.match(NOQA.search("import x  # noqa: F401 - importing registers it").group("rest"))
