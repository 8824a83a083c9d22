"""``tests/PROOFS.tsv`` stays true: every id is a seed proof, every node id a real test.

The seed proofs' ids and sections are kept in ``tests/proof_inventory.tsv``
(regenerated from the seeds by ``scripts/proof_inventory.py``).
"""
import re
from pathlib import Path

from django.conf import settings

ROOT = Path(settings.BASE_DIR)
INVENTORY = ROOT / "tests" / "proof_inventory.tsv"


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


def _inventory() -> dict[str, str]:
    """The seed proofs: id -> section."""
    lines = INVENTORY.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "id\tsection"
    rows = [line.split("\t") for line in lines[1:] if line.strip()]
    assert rows and all(len(row) == 2 and all(row) for row in rows)
    inventory = dict(rows)
    assert len(inventory) == len(rows), "an id is listed twice"
    return inventory


def test_every_id_is_in_the_seed_inventory():
    known = _inventory()
    unknown = [row[0] for row in _rows() if row[0] not in known]
    assert not unknown, unknown
