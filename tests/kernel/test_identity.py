"""Canonical identity (seed 003 "Identity rules"): one validator, byte-exact columns, no folding."""
import ast
import re
from pathlib import Path

import pytest
from django.apps import apps
from django.conf import settings
from django.db import connections, models, router
from hypothesis import given
from hypothesis import strategies as st

from nexusflow.kernel.errors import InvalidIdentity
from nexusflow.kernel.identity import IdentityField, canonical_locator, validate_key


@pytest.mark.parametrize("bad", [None, "", " a", "a ", "\ta", "a\x00b", "a\nb", "a\u2028b", b"\xff\xfe", "e\u0301",
                                 "x" * 256, 1.5, True,
                                 # invisible: zero-width space, BOM, bidi override, NBSP inside, soft hyphen,
                                 # Hangul filler, private use, noncharacter, leading combining mark
                                 "a\u200bb", "\ufeffa", "a\u202eb", "a\u00a0b", "a\u00adb", "a\u3164",
                                 "a\ue000", "a\uffff", "\u0301a"])
def test_non_canonical_keys_are_rejected(bad):
    with pytest.raises(InvalidIdentity):
        validate_key(bad)


@pytest.mark.parametrize("good", ["a", "crm-webhooks", "Zoë", "李", "a b", "x" * 255])
def test_canonical_keys_pass_unchanged(good):
    assert validate_key(good) == good


def test_locators_render_integers_and_refuse_floats_and_bools():
    assert canonical_locator(123) == "123"
    assert canonical_locator("abc") == "abc"
    for bad in (1.0, True, " 1"):
        with pytest.raises(InvalidIdentity):
            canonical_locator(bad)


@given(st.text(min_size=1, max_size=40))
def test_validation_never_normalizes(value):
    try:
        assert validate_key(value) == value
    except InvalidIdentity:
        pass


# --- identity is compared byte for byte everywhere ------------------------------



ROOT = Path(settings.BASE_DIR)
L0 = ["connectors", "runtime_outbox", "cutover", "nexusflow"]
IDENTITY_APPS = {"connectors", "runtime_outbox", "cutover", "flows", "records"}
FOLDING_LOOKUPS = re.compile(r"__(iexact|icontains|istartswith|iendswith|iregex)\b")
FOLDING_FUNCTIONS = {"Lower", "Upper", "Trim", "LTrim", "RTrim"}
FOLDING_SQL = re.compile(r"\b(TRIM|LTRIM|RTRIM|LOWER|UPPER|LCASE|UCASE)\s*\(|COLLATE\s+\w+_ci\b", re.IGNORECASE)


def query_time_folding(source: str) -> list[str]:
    """Return the query-time TRIM / case-folding uses in one module's source."""
    found = [f"lookup __{m.group(1)}" for m in FOLDING_LOOKUPS.finditer(source)]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            if name in FOLDING_FUNCTIONS:
                found.append(f"function {name}()")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and FOLDING_SQL.search(node.value):
            found.append(f"SQL {FOLDING_SQL.search(node.value).group(0)!r}")
    return found


def test_the_folding_check_catches_each_form():
    assert query_time_folding("Model.objects.filter(key__iexact=k)") == ["lookup __iexact"]
    assert query_time_folding("from django.db.models.functions import Lower\nq.annotate(k=Lower('key'))") == [
        "function Lower()"]
    assert query_time_folding("cursor.execute('SELECT id FROM t WHERE TRIM(k) = %s', [k])") == ["SQL 'TRIM('"]
    assert query_time_folding("cursor.execute('SELECT id FROM t WHERE k = %s COLLATE utf8mb4_general_ci', [k])") == [
        "SQL 'COLLATE utf8mb4_general_ci'"]
    assert query_time_folding("q.filter(key=k).order_by('key')") == []


def test_no_query_time_trim_or_case_folding_in_l0():
    offenders = {}
    for top in L0:
        for path in sorted((ROOT / top).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            hits = query_time_folding(path.read_text(encoding="utf-8"))
            if hits:
                offenders[str(path.relative_to(ROOT))] = hits
    assert offenders == {}


def _identity_like(field) -> bool:
    return field.name == "org_id" or field.name.endswith(("_key", "_id", "_digest", "_token")) or field.name == "digest"


def test_identity_like_text_columns_are_identity_fields():
    loose = [f"{m.__name__}.{f.name}" for m in apps.get_models() if m._meta.app_label in IDENTITY_APPS
             for f in m._meta.concrete_fields
             if isinstance(f, models.CharField) and not isinstance(f, IdentityField) and _identity_like(f)]
    assert loose == []


@pytest.mark.django_db(databases=["default", "control"])
def test_identity_columns_have_binary_collation_in_the_database():
    expected = {(router.db_for_write(m), m._meta.db_table, f.column) for m in apps.get_models()
                if m._meta.app_label in IDENTITY_APPS
                for f in m._meta.concrete_fields if isinstance(f, IdentityField)}
    collations = {}
    for alias in {e[0] for e in expected}:
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT TABLE_NAME, COLUMN_NAME, COLLATION_NAME FROM information_schema.COLUMNS "
                           "WHERE TABLE_SCHEMA = DATABASE()")
            collations.update({(alias, t, c): coll for t, c, coll in cursor.fetchall()})
    assert len(expected) > 50
    wrong = {key: collations.get(key) for key in expected if collations.get(key) != "utf8mb4_bin"}
    assert wrong == {}


@pytest.mark.django_db
@pytest.mark.parametrize("bad", [" acct", "acct ", "", "a\x00b", "e\u0301", "x" * 300])
def test_insert_refuses_a_non_canonical_identity_before_sql(bad):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from connectors.models import AccountServingGate
    from nexusflow.kernel.errors import InvalidIdentity
    from nexusflow.kernel.models import insert

    with CaptureQueriesContext(connection) as queries:
        with pytest.raises(InvalidIdentity, match="AccountServingGate.account_key"):
            insert(AccountServingGate, org_id="id-org", account_key=bad, pack_key="p", state="v1_serving")
    assert len(queries) == 0
    assert not AccountServingGate.objects.filter(org_id="id-org").exists()
    gate = insert(AccountServingGate, org_id="id-org", account_key="acct", pack_key="p", state="v1_serving")
    assert AccountServingGate.objects.get(org_id="id-org", pk=gate.pk).account_key == "acct"


@pytest.mark.django_db
def test_a_store_refuses_to_write_a_non_canonical_identity_before_sql():
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from connectors.models import DispatchPermit
    from connectors.store import DispatchPermitStore
    from nexusflow.kernel.errors import InvalidIdentity

    from . import rows

    permit = rows.make(DispatchPermit, org_id="id-org", state="granted", version=1)
    with CaptureQueriesContext(connection) as queries:
        with pytest.raises(InvalidIdentity, match="holder_id"):
            DispatchPermitStore.touch(org_id="id-org", pk=permit.pk, state="granted", version=1,
                                      set_fields={"holder_id": "worker-1 "})
    assert len(queries) == 0
    assert DispatchPermit.objects.get(org_id="id-org", pk=permit.pk).holder_id == permit.holder_id


def unique_text_columns_outside_identity(models_: list) -> list[str]:
    """Text columns that take part in a uniqueness rule but are not identity fields."""
    loose = []
    for m in models_:
        unique_sets = [c.fields for c in m._meta.constraints if isinstance(c, models.UniqueConstraint)]
        unique_sets += [(f.name,) for f in m._meta.concrete_fields if f.unique and not f.primary_key]
        for names in unique_sets:
            for name in names:
                field = m._meta.get_field(name)
                if isinstance(field, models.CharField) and not isinstance(field, IdentityField):
                    loose.append(f"{m.__name__}.{name}")
    return sorted(set(loose))


def test_text_columns_in_uniqueness_rules_are_identity_fields():
    # A case-insensitive unique key would make two distinct keys one row (or refuse the second).
    assert unique_text_columns_outside_identity(
        [m for m in apps.get_models() if m._meta.app_label in IDENTITY_APPS]) == []


def test_the_uniqueness_check_catches_a_plain_char_field():
    from django.test.utils import isolate_apps

    with isolate_apps("tests"):
        class Loose(models.Model):
            kind = models.CharField(max_length=8)

            class Meta:
                app_label = "tests"
                constraints = [models.UniqueConstraint(fields=["kind"], name="loose_kind_uniq")]

    assert unique_text_columns_outside_identity([Loose]) == ["Loose.kind"]
