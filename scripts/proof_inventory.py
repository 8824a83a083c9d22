"""Regenerate ``tests/proof_inventory.tsv`` from the design documents' proof list.

The seeds' ``PROOFS.tsv`` (columns ``id``, ``source``, ``proof``) lives with the
design documents, outside this repository. The tests need only its ids and the
section each belongs to, so this keeps those two columns (``id``, ``section``)
in the repository and leaves the proof text where it is::

    python scripts/proof_inventory.py PATH/TO/PROOFS.tsv          # rewrite the inventory
    python scripts/proof_inventory.py PATH/TO/PROOFS.tsv --check  # exit 1 if it is stale
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INVENTORY = ROOT / "tests" / "proof_inventory.tsv"
SEEDS_HEADER = ["id", "source", "proof"]
HEADER = "id\tsection"


def inventory_text(seeds_tsv: str) -> str:
    """The inventory for the text of a seeds ``PROOFS.tsv``: a header, then one ``id<TAB>section`` row per proof.

    Raises ``ValueError`` on a wrong header, a short row or a repeated id.
    """
    lines = seeds_tsv.splitlines()
    if not lines or lines[0].split("\t") != SEEDS_HEADER:
        raise ValueError(f"expected the header {SEEDS_HEADER}, got {lines[:1]}")
    rows, seen = [HEADER], set()
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) < 2 or not fields[0] or not fields[1]:
            raise ValueError(f"line {number}: expected id, source and proof")
        if fields[0] in seen:
            raise ValueError(f"line {number}: id {fields[0]} repeated")
        seen.add(fields[0])
        rows.append(f"{fields[0]}\t{fields[1]}")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("seeds", type=Path, help="the seeds' PROOFS.tsv (columns id, source, proof)")
    parser.add_argument("--output", type=Path, default=INVENTORY, help="the inventory to write (default: %(default)s)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if the inventory is stale")
    args = parser.parse_args(argv)
    try:
        text = inventory_text(args.seeds.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        parser.error(f"{args.seeds}: {exc}")
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is stale: run scripts/proof_inventory.py {args.seeds}", file=sys.stderr)
            return 1
        return 0
    args.output.write_text(text, encoding="utf-8")
    print(f"{args.output}: {text.count(chr(10)) - 1} proofs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
