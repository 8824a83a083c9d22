"""L0 code names no connector provider, CRM object or tenant (ARCHITECTURE.md section 1).

L0 is ``nexusflow/`` (kernel, records, flows and the project), ``connectors``,
``runtime_outbox`` and ``cutover``, migrations excluded. The forbidden words
are an explicit list kept here plus the words read from the L1/L2 data itself
(pack folders and keys, metadata object names, the demo service's tenant and
account keys), so a new pack or object is covered without editing this test.
"""
import json
import re

import pytest

from tests.guardrails import ROOT, check_neutrality, l0_files, relative, substring_pattern, word_pattern

#: Provider names: matched case-insensitively anywhere, identifiers included.
PROVIDERS = ("hubspot", "salesforce", "sforce", "stripe", "billing", "zendesk", "shopify", "pipedrive")
#: CRM object names: matched case-sensitively as whole words ("contact" the verb is fine, "Contact" is not).
CRM_OBJECTS = ("Contact", "Lead", "Opportunity", "Account", "Case", "Campaign", "Quote", "Deal")
#: L0 file kinds that can carry a literal.
SUFFIXES = (".py", ".json", ".html", ".txt", ".xml", ".md", ".sql")
#: ``(path, exact stripped line)`` pairs allowed to name a literal. The Flow metadata front end
#: (``nexusflow/flows/frontend.py``, read by ``nexusflow/flows/compiler/``) matches elements by XML local
#: name and treats the metadata namespace as data, so it names no provider today and needs no entry; if it
#: ever must name its own format (the Flow XML namespace), list exactly that line here and nothing broader.
EXEMPT: tuple[tuple[str, str], ...] = ()


def forbidden() -> dict[str, re.Pattern]:
    """Word -> pattern: the explicit lists above plus the words the L1/L2 data defines."""
    words: dict[str, re.Pattern] = {}
    for word in PROVIDERS:
        words[word] = substring_pattern(word)
    for word in CRM_OBJECTS:
        words[word] = word_pattern(word, case_sensitive=True)
    for pack_json in (ROOT / "packs").glob("*/pack.json"):
        doc = json.loads(pack_json.read_text())
        for word in {pack_json.parent.name, doc["pack_key"], doc["owner_key"]}:
            words[word] = substring_pattern(word)
    for obj in (ROOT / "metadata" / "objects").glob("*.object.json"):
        name = json.loads(obj.read_text())["object"]
        words[name] = word_pattern(name, case_sensitive=True)
    service = json.loads((ROOT / "packs" / "demo" / "service.json").read_text())
    for word in {service["org_id"], *(a["account_key"] for a in service["accounts"])}:
        words[word] = re.compile(re.escape(word))
    return words


def test_the_forbidden_list_holds_the_explicit_and_the_derived_words():
    words = forbidden()
    assert {"hubspot", "salesforce", "stripe", "billing", "Contact", "Lead", "Opportunity"} <= set(words)
    assert {"pack.hubspot", "pack.billing", "demo-org", "crm-webhooks", "billing-main"} <= set(words)


def test_every_l0_area_is_scanned():
    scanned = {"/".join(relative(p).split("/")[:2]) for p in l0_files(SUFFIXES)}
    assert {"connectors/outbound", "connectors/inbound", "runtime_outbox/services.py", "cutover/services.py", "nexusflow/kernel",
            "nexusflow/records", "nexusflow/flows", "nexusflow/settings.py"} <= scanned
    assert not [p for p in l0_files(SUFFIXES) if "migrations" in p.parts]


@pytest.mark.parametrize("path", list(l0_files(SUFFIXES)), ids=lambda p: relative(p))
def test_l0_file_names_no_provider_object_or_tenant(path):
    violations = check_neutrality(path.read_text(encoding="utf-8"), relative(path), forbidden(), EXEMPT)
    assert not violations, "\n".join(map(str, violations))


# --- the guardrail catches a deliberate breakage ------------------------------
def test_a_provider_name_in_l0_is_caught():
    broken = 'def push(effect):\n    """Send it."""\n    return effect.send(url="https://api.hubspot.example/x")\n'
    violations = check_neutrality(broken, "connectors/new.py", forbidden())
    assert [(v.line, v.rule, v.detail) for v in violations] == [(3, "l0-neutrality", "names 'hubspot'")]


def test_an_object_name_is_matched_case_sensitively_as_a_word():
    text = "if record.object_name == 'Lead':\n    contact_the_owner()\nLeader = 1\n"
    violations = check_neutrality(text, "nexusflow/records/x.py", forbidden())
    assert [(v.line, v.detail) for v in violations] == [(1, "names 'Lead'")]


def test_the_demo_tenant_and_account_keys_are_caught():
    text = 'ORG = "demo-org"\nACCOUNT = "billing-main"\n'
    details = {(v.line, v.detail) for v in check_neutrality(text, "cutover/x.py", forbidden())}
    assert (1, "names 'demo-org'") in details and (2, "names 'billing-main'") in details


def test_an_exemption_covers_exactly_one_line_of_one_file():
    text = 'NS = "http://soap.sforce.com/2006/04/metadata"\nOTHER = "sforce"\n'
    exempt = [("nexusflow/flows/compiler.py", 'NS = "http://soap.sforce.com/2006/04/metadata"')]
    assert [v.line for v in check_neutrality(text, "nexusflow/flows/compiler.py", forbidden(), exempt)] == [2]
    assert [v.line for v in check_neutrality(text, "nexusflow/flows/services.py", forbidden(), exempt)] == [1, 2]


def test_neutral_code_passes():
    text = "def record_get(*, org_id, object_name, record_key):\n    return (org_id, object_name, record_key)\n"
    assert check_neutrality(text, "nexusflow/records/x.py", forbidden()) == []
