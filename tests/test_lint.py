"""The linter's exceptions are explained: every ``# noqa`` names its codes and a reason on the same line.

``make lint`` (ruff, ``ruff.toml``) runs before the suite; this keeps the escapes from it honest.
"""
from __future__ import annotations

import io
import re
import subprocess
import tokenize

from tests.conftest import ROOT

NOQA = re.compile(r"#\s*noqa\b(?P<rest>.*)$")
WITH_REASON = re.compile(r"^:\s*[A-Z]+[0-9]+(\s*,\s*[A-Z]+[0-9]+)*\s+[-(]?\s*\w.*$")


def _tracked_python() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    return listed.stdout.split()


def _comments(source: str):
    """``(line number, text)`` of each comment of ``source`` (strings that mention noqa are not comments)."""
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string


def test_every_noqa_names_its_codes_and_a_reason():
    bare = []
    for name in _tracked_python():
        for number, comment in _comments((ROOT / name).read_text(encoding="utf-8")):
            found = NOQA.search(comment)
            if found and not WITH_REASON.match(found.group("rest")):
                bare.append(f"{name}:{number}: {comment}")
    assert not bare, "a noqa without codes and a reason:\n" + "\n".join(bare)


def test_the_rule_tells_a_bare_noqa_from_an_explained_one():
    assert list(_comments('x = "# noqa"  # noqa: F401\n')) == [(1, "# noqa: F401")]
    assert not WITH_REASON.match(NOQA.search("import x  # noqa: F401").group("rest"))
    assert not WITH_REASON.match(NOQA.search("import x  # noqa").group("rest"))
    assert WITH_REASON.match(NOQA.search("import x  # noqa: F401 - importing registers it").group("rest"))
