"""The suite reads nothing outside the repository: its inputs are in the clone, with their origins.

- No file under ``tests/`` or ``scripts/``, and not the ``Makefile``, names the
  design documents' folder beside the repository, joins a ``shared`` path
  component, or climbs above the repository root from ``__file__``.
- The Flow corpus (``tests/corpus/flows``) is complete: every file is in its
  ``MANIFEST.tsv`` and in ``tests/corpus/SOURCES.tsv`` (public origin and
  licence), and every row names a file that is there.
- ``scripts/proof_inventory.py`` rebuilds ``tests/proof_inventory.tsv`` from a
  seeds ``PROOFS.tsv`` it must be given.
"""
from __future__ import annotations

import csv
import importlib.util
import re
from pathlib import Path

import pytest
from django.conf import settings

ROOT = Path(settings.BASE_DIR)
CORPUS = ROOT / "tests" / "corpus"
SHARED = "sha" + "red"  # spelled in two parts so this file does not match its own patterns
#: What points outside the clone: the folder beside it (relative or absolute), or a path joined onto ``shared``.
OUTSIDE = [
    re.compile(re.escape("../" + SHARED)),
    re.compile(re.escape("/work/" + SHARED)),
    re.compile(r"/\s*[\"']" + SHARED + r"[\"']"),
    re.compile(r"\b(?:ROOT|REPO_ROOT|BASE_DIR)\)?\.parent\b"),
]
#: ``Path(__file__).resolve().parents[N]``: fine while N stays within the repository.
PARENTS = re.compile(r"Path\(__file__\)\.resolve\(\)\.parents\[(\d+)\]")
SOURCES_HEADER = ["file", "repository", "path", "commit", "license", "license_evidence"]


def _scanned() -> list[Path]:
    files = [ROOT / "Makefile"]
    for top in ("tests", "scripts"):
        files += [p for p in sorted((ROOT / top).rglob("*")) if p.is_file() and "__pycache__" not in p.parts]
    return files


def _outside_references(path: Path, text: str) -> list[str]:
    """``line: text`` of each line of ``path`` that points outside the repository."""
    depth = len(path.relative_to(ROOT).parts) - 1  # parents[depth] is the repository root
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        climbs = [int(n) for n in PARENTS.findall(line) if int(n) > depth]
        if climbs or any(p.search(line) for p in OUTSIDE):
            found.append(f"{number}: {line.strip()}")
    return found


def test_no_test_script_or_makefile_names_a_path_outside_the_repository():
    scanned, offenders = 0, {}
    for path in _scanned():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # not text
        scanned += 1
        if found := _outside_references(path, text):
            offenders[path.relative_to(ROOT).as_posix()] = found
    assert scanned > 100
    assert not offenders, offenders


@pytest.mark.parametrize("line", [
    'CORPUS = Path(__file__).resolve().parents[' + '3] / "corpus"',
    "INVENTORY = ROOT" + ".parent / 'PROOFS.tsv'",
    "seeds: ../" + SHARED + "/seeds/",
    "cat /work/" + SHARED + "/PROOFS.tsv",
    'ROOT / "' + SHARED + '" / "x"',
])
def test_the_scan_catches_each_way_out(line):
    assert _outside_references(ROOT / "tests" / "flows" / "conftest.py", line)


def test_the_scan_allows_the_repository_root_and_the_word():
    text = ('ROOT = Path(__file__).resolve().parents[' + '2]\nserving_lock(org_id=org, shared=True)\n'
            '"""a shared lock, shared holders"""\n')
    assert not _outside_references(ROOT / "tests" / "flows" / "conftest.py", text)


def _tsv(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))


def test_every_corpus_file_is_in_the_manifest_and_the_sources_with_its_origin_and_licence():
    flows = sorted(p.name for p in (CORPUS / "flows").glob("*.flow-meta.xml"))
    assert len(flows) == 28
    manifest = _tsv(CORPUS / "flows" / "MANIFEST.tsv")
    assert sorted(row["file"] for row in manifest) == flows
    with (CORPUS / "SOURCES.tsv").open(encoding="utf-8") as handle:
        assert handle.readline().rstrip("\n").split("\t") == SOURCES_HEADER
    sources = _tsv(CORPUS / "SOURCES.tsv")
    on_disk = sorted(p.relative_to(CORPUS).as_posix() for p in CORPUS.rglob("*")
                     if p.is_file() and p.name not in {"SOURCES.tsv", "MANIFEST.tsv"})
    assert sorted(row["file"] for row in sources) == on_disk
    by_file = {row["file"]: row for row in manifest}
    for row in sources:
        assert all(row[column] for column in SOURCES_HEADER), row
        owner, _, repository = row["repository"].partition("/")
        assert Path(row["file"]).name == f"{owner}__{repository}__{row['path'].rsplit('/', 1)[-1]}", row
        origin = by_file[Path(row["file"]).name]
        assert (origin["source_repo"], origin["source_path"], origin["commit"]) == \
            (row["repository"], row["path"], row["commit"]), row
        assert re.fullmatch(r"[0-9a-f]{40}", row["commit"]), row


def _proof_inventory_script():
    spec = importlib.util.spec_from_file_location("proof_inventory", ROOT / "scripts" / "proof_inventory.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_proof_inventory_script_needs_the_seeds_path(capsys):
    with pytest.raises(SystemExit) as exc:
        _proof_inventory_script().main([])
    assert exc.value.code == 2
    assert "seeds" in capsys.readouterr().err


def test_the_proof_inventory_script_keeps_ids_and_sections_only(tmp_path):
    script = _proof_inventory_script()
    committed = (ROOT / "tests" / "proof_inventory.tsv").read_text(encoding="utf-8")
    # Seeds that say what the committed inventory says, with proof text the inventory must not carry.
    seeds = tmp_path / "PROOFS.tsv"
    seeds.write_text("id\tsource\tproof\n" + "".join(f"{line}\tthe proof text of {line.split(chr(9))[0]}\n"
                                                       for line in committed.splitlines()[1:]), encoding="utf-8")
    assert script.main([str(seeds), "--check"]) == 0
    out = tmp_path / "inventory.tsv"
    assert script.main([str(seeds), "--output", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == committed and "proof text" not in committed
    seeds.write_text(seeds.read_text(encoding="utf-8") + "S999-XX-01\t999 New section\tnew\n", encoding="utf-8")
    assert script.main([str(seeds), "--output", str(out), "--check"]) == 1
    with pytest.raises(ValueError, match="repeated"):
        script.inventory_text("id\tsource\tproof\nA\ts\tp\nA\ts\tp\n")
