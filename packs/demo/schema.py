"""A new pair of databases holding the project's schema: migrated once per set of migrations, copied after.

The demo, the journeys and their tests start from empty databases many times. Running every migration costs
about 11 s each time; copying the tables of a database migrated once costs about 2 s. The first run for a
set of migrations migrates a template pair (``<main>_t<digest>`` and ``<main>_t<digest>_control``, under the
names ``make db`` grants) with ``manage.py migrate``, exactly as before, and marks it complete; every run then copies
the template's tables (``SHOW CREATE TABLE``, foreign keys and checks included) and rows (``django_migrations``
and what data migrations wrote). A change to any migration file changes the digest: the next run migrates a new
template and drops the old ones. Two runs at once serialize on a server lock named after the template.
"""
from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from pathlib import Path

import django
import MySQLdb

ROOT = Path(__file__).resolve().parents[2]
#: The schema comment of a template whose migrations all ran.
COMPLETE = "nexusflow schema template: complete"
LOCK_WAIT_SECONDS = 600


def migration_digest() -> str:
    """A hex digest of every migration file of the project (paths and bytes) and the Django version."""
    digest = hashlib.sha256(repr(django.VERSION).encode())
    for path in sorted(ROOT.glob("**/migrations/*.py")):
        if ".venv" in path.parts or "var" in path.parts:
            continue
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def template_names(main: str, digest: str) -> tuple[str, str]:
    """``(main template, control template)`` for the main database name ``main``.

    ``(<main>_t<6 hex digits>, <main>_t<6 hex digits>_control)``: no longer than the journeys' names, so any
    name ``make db`` accepts fits (``scripts/create_databases.py``).
    """
    stem = f"{main}_t{digest[:6]}"
    return stem, f"{stem}_control"


def _is_template(name: str, main: str) -> bool:
    return re.fullmatch(re.escape(main) + r"_t[0-9a-f]{6}(_control)?", name) is not None


def _connect(cfg: dict):
    return MySQLdb.connect(host=cfg["HOST"] or "127.0.0.1", port=int(cfg["PORT"] or 3306), user=cfg["USER"],
                           password=cfg["PASSWORD"], charset="utf8mb4", autocommit=True)


def _complete(cursor, names: tuple[str, ...]) -> bool:
    cursor.execute("SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME IN %s AND SCHEMA_COMMENT = %s",
                   [names, COMPLETE])
    return cursor.fetchone()[0] == len(names)


def _recreate(cursor, name: str) -> None:
    cursor.execute(f"DROP DATABASE IF EXISTS `{name}`")
    cursor.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci")


def _copy(cursor, source: str, target: str) -> None:
    """Every base table of ``source`` into the empty database ``target``: its definition, then its rows."""
    cursor.execute("SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s "
                   "AND TABLE_TYPE = 'BASE TABLE' ORDER BY TABLE_NAME", [source])
    tables = [row[0] for row in cursor.fetchall()]
    cursor.execute("SET SESSION foreign_key_checks = 0")
    try:
        cursor.execute(f"USE `{target}`")
        for table in tables:
            cursor.execute(f"SHOW CREATE TABLE `{source}`.`{table}`")
            cursor.execute(cursor.fetchone()[1])
        for table in tables:
            cursor.execute(f"INSERT INTO `{target}`.`{table}` SELECT * FROM `{source}`.`{table}`")
    finally:
        cursor.execute("SET SESSION foreign_key_checks = 1")


def create_migrated_databases(cfg: dict, main: str, control: str, *, migrate: Callable[[str, str], None]) -> bool:
    """Drop and create ``main`` and ``control`` holding the project's migrated schema, as ``cfg``'s user.

    Args:
        cfg: the settings' connection dictionary of the server (``NAME``, ``HOST``, ``PORT``, ``USER``,
            ``PASSWORD``); the template is named after its ``NAME``, so the demo and the journeys share one.
        main, control: the database names to create (dropped first when they exist).
        migrate: ``migrate(main_name, control_name)`` runs ``manage.py migrate`` for both aliases against
            those databases; called only when the template for the current migrations is missing.

    Returns:
        True when the template was migrated by this call, False when it already existed.

    Raises:
        MySQLdb.Error: the server refused (a name outside the user's grants, say).
        TimeoutError: another run held the template's lock for ``LOCK_WAIT_SECONDS``.
        Whatever ``migrate`` raises; the template is then left incomplete and the next run migrates it again.
    """
    template = template_names(cfg["NAME"], migration_digest())
    conn = _connect(cfg)
    try:
        cursor = conn.cursor()
        cursor.execute("SELECT GET_LOCK(%s, %s)", [f"nexusflow.schema.{template[0]}", LOCK_WAIT_SECONDS])
        if cursor.fetchone()[0] != 1:
            raise TimeoutError(f"the schema template {template[0]} stayed locked for {LOCK_WAIT_SECONDS} s")
        migrated = not _complete(cursor, template)
        if migrated:
            cursor.execute("SELECT SCHEMA_NAME FROM information_schema.SCHEMATA WHERE SCHEMA_NAME LIKE %s",
                           [cfg["NAME"].replace("_", r"\_") + r"\_t%"])
            for (stale,) in cursor.fetchall():
                if _is_template(stale, cfg["NAME"]):
                    cursor.execute(f"DROP DATABASE IF EXISTS `{stale}`")
            for name in template:
                _recreate(cursor, name)
            migrate(*template)
            for name in template:
                cursor.execute(f"ALTER DATABASE `{name}` COMMENT %s", [COMPLETE])
        for source, target in zip(template, (main, control), strict=True):
            _recreate(cursor, target)
            _copy(cursor, source, target)
        return migrated
    finally:
        conn.close()
