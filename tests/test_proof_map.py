"""``tests/PROOFS.tsv`` stays true: every id is a seed proof, every node id a real test."""
import re
from pathlib import Path

from django.conf import settings

ROOT = Path(settings.BASE_DIR)
SHARED = ROOT.parent / "shared" / "PROOFS.tsv"


def _rows():
    lines = (ROOT / "tests" / "PROOFS.tsv").read_text(encoding="utf-8").splitlines()
    assert lines[0] == "id\tnode id"
    return [line.split("\t") for line in lines[1:] if line.strip()]


def test_every_row_names_an_existing_test_function():
    rows = _rows()
    assert rows
    for row in rows:
        assert len(row) == 2, row
        path, _, name = row[1].partition("::")
        source = (ROOT / path).read_text(encoding="utf-8")
        assert re.search(rf"^def {re.escape(name)}\(", source, re.MULTILINE), row


def test_every_id_is_in_the_seed_inventory():
    if not SHARED.exists():
        return  # the inventory lives beside the repository; a lone clone cannot check ids
    known = {line.split("\t", 1)[0] for line in SHARED.read_text(encoding="utf-8").splitlines()[1:] if line.strip()}
    unknown = [row[0] for row in _rows() if row[0] not in known]
    assert not unknown, unknown
