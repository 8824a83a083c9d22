"""L0 code names no connector provider, CRM object or tenant (ARCHITECTURE.md section 1).

The forbidden words are read from the L1/L2 data itself (pack folders and
keys, metadata object names, tenant ids of the demo service), so a new pack
or object is covered without editing this test.
"""
import json
import re
from pathlib import Path

import pytest
from django.conf import settings

ROOT = Path(settings.BASE_DIR)
L0_DIRS = ["nexusflow", "connectors", "runtime_outbox", "cutover"]
ALWAYS = {"hubspot", "salesforce", "stripe"}


def _forbidden() -> dict[str, re.Pattern]:
    words: dict[str, re.Pattern] = {}
    for pack_json in (ROOT / "packs").glob("*/pack.json"):
        doc = json.loads(pack_json.read_text())
        for word in {pack_json.parent.name, doc["pack_key"], doc["owner_key"]}:
            words[word] = re.compile(re.escape(word), re.IGNORECASE)
    for obj in (ROOT / "metadata" / "objects").glob("*.object.json"):
        name = json.loads(obj.read_text())["object"]
        words[name] = re.compile(r"\b" + re.escape(name) + r"\b")
    service = json.loads((ROOT / "packs" / "demo" / "service.json").read_text())
    for word in {service["org_id"], *(a["account_key"] for a in service["accounts"])}:
        words[word] = re.compile(re.escape(word))
    for word in ALWAYS:
        words[word] = re.compile(word, re.IGNORECASE)
    return words


def _l0_files():
    for top in L0_DIRS:
        for path in sorted((ROOT / top).rglob("*")):
            if path.suffix in {".py", ".json", ".html", ".txt"} and "migrations" not in path.parts:
                yield path


def test_the_forbidden_list_is_not_empty():
    words = _forbidden()
    assert {"hubspot", "billing", "Contact", "demo-org"} <= set(words)


@pytest.mark.parametrize("path", list(_l0_files()), ids=lambda p: str(p.relative_to(ROOT)))
def test_l0_file_names_no_provider_object_or_tenant(path):
    text = path.read_text(encoding="utf-8")
    hits = [(word, text.count(word)) for word, pattern in _forbidden().items() if pattern.search(text)]
    assert not hits, f"{path.relative_to(ROOT)} names L1/L2 literals: {hits}"
