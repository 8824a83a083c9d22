"""The databases ``make db`` prepares: which names work, the grants they need, and their creation.

The names come from the settings (``NEXUS_DB_URL`` / ``NEXUS_CONTROL_DB_URL``):
the main database ``<main>``, the control database (default
``<main>_control``), and the databases the project derives from them: the
demo's ``<main>_demo`` / ``<main>_demo_control``, the journeys'
``<main>_journey`` / ``<main>_journey_control``, pytest's ``test_`` copy of
each of these, and the test databases of each pytest-xdist worker
(``test_<main>_gw<N>``, with its own demo and journey copies: tests run the
demo and the journeys against the test databases).

A name works when it has only ASCII letters, digits and underscores and every
name derived from it fits MariaDB's 64 characters (the main name at most 39,
the control name at most 55).

Usage (``make db`` runs the first three from ``scripts/ensure_mariadb.sh``):

``create_databases.py --check-names``
    exit 0 when the configured names work, else 2 with a message saying which names work.
``create_databases.py --check-access``
    exit 0 when the configured user may create every database named above and read InnoDB's lock waits,
    else 1 (one line per refusal).
``create_databases.py --grant-sql``
    print the ``GRANT`` statements that give the ``nexus`` user exactly those names
    (``<name>``, ``<name>_%``, ``test_<name>``, ``test_<name>_%`` for the main and the control name);
    exit 2 when the configured user is not ``nexus`` (``make db`` manages only that user).
``create_databases.py``
    create the main and the control database if missing; exit 1 with the server's refusal.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import MySQLdb

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "nexusflow.settings")

import django

django.setup()

from django.conf import settings

from packs.demo.run import demo_database_names
from packs.demo.schema import template_names
from packs.journeys import journey_database_names

#: The one user ``ensure_mariadb.sh`` creates and grants.
MANAGED_USER = "nexus"
MAX_NAME = 64  # MariaDB's identifier limit
NAME_RULE = re.compile(r"[A-Za-z0-9_]+")
ANY = "0" * 64  # a migration digest
TEST_PREFIX = "test_"  # Django's default test database name: "test_" + NAME
#: pytest-django's suffix for a pytest-xdist worker's test databases (``make test`` TEST_WORKERS, at most ten).
XDIST_WORKER_SUFFIX = "_gw9"
ER_DBACCESS_DENIED, ER_BAD_DB = 1044, 1049


def configured_names() -> tuple[str, str]:
    """``(main, control)`` database names of the settings."""
    return settings.DATABASES["default"]["NAME"], settings.DATABASES["control"]["NAME"]


def derived_names(main: str, control: str) -> list[str]:
    """Every database the project creates for these names, ``test_`` copies included (no duplicates)."""
    # The schema templates' names carry a digest of the migrations; any digest gives names of the same length.
    own = [main, control, *demo_database_names(main), *journey_database_names(main), *template_names(main, ANY)]
    names = own + [TEST_PREFIX + name for name in own]
    worker = TEST_PREFIX + main + XDIST_WORKER_SUFFIX
    names += [worker, TEST_PREFIX + control + XDIST_WORKER_SUFFIX, *demo_database_names(worker),
              *journey_database_names(worker), *template_names(worker, ANY)]
    return list(dict.fromkeys(names))


def name_problems(main: str, control: str) -> list[str]:
    """Why these names do not work (empty when they do)."""
    problems = []
    for role, name in (("main", main), ("control", control)):
        if not NAME_RULE.fullmatch(name or ""):
            problems.append(f"the {role} database name {name!r} has characters other than ASCII letters, digits "
                            "and underscores")
    if problems:
        return problems
    for name in derived_names(main, control):
        if len(name) > MAX_NAME:
            problems.append(f"the derived database name {name!r} is longer than {MAX_NAME} characters")
    return problems


def _like_literal(name: str) -> str:
    """``name`` as a GRANT database pattern matching only itself (``_`` and ``%`` are wildcards there)."""
    return name.replace("_", "\\_")  # the name rule leaves no other wildcard or backslash


def grant_patterns(main: str, control: str) -> list[str]:
    """GRANT database patterns covering :func:`derived_names` (and the ``_gwN`` copies of pytest-xdist)."""
    bases = [main] if control.startswith(main + "_") else [main, control]
    patterns = []
    for base in bases:
        for name in (base, TEST_PREFIX + base):
            patterns += [_like_literal(name), _like_literal(name + "_") + "%"]
    return patterns


def grant_sql(main: str, control: str) -> str:
    """The GRANT statements for :data:`MANAGED_USER` at ``127.0.0.1`` and ``localhost``.

    Besides its databases, the user may read InnoDB's lock waits (``PROCESS``: ``information_schema``'s
    ``INNODB_LOCK_WAITS`` and ``INNODB_LOCKS``), which the hot-account capacity test of ``make bench``
    samples for the gate-lock wait (docs/scaling.md).
    """
    lines = []
    for host in ("127.0.0.1", "localhost"):
        for pattern in grant_patterns(main, control):  # a backticked name keeps its backslashes as written
            lines.append(f"GRANT ALL PRIVILEGES ON `{pattern}`.* TO '{MANAGED_USER}'@'{host}';")
        lines.append(f"GRANT PROCESS ON *.* TO '{MANAGED_USER}'@'{host}';")
    return "\n".join(lines)


def _connect(cfg: dict, **extra):
    return MySQLdb.connect(host=cfg["HOST"] or "127.0.0.1", port=int(cfg["PORT"] or 3306), user=cfg["USER"],
                           password=cfg["PASSWORD"], **extra)


def access_refusals(main: str, control: str) -> list[str]:
    """The derived names the configured user may not use (``USE`` answers 1044 rather than success or 1049)."""
    try:
        conn = _connect(settings.DATABASES["default"], connect_timeout=3)
    except MySQLdb.Error as exc:
        return [f"cannot log in: {exc}"]
    refusals = []
    try:
        cursor = conn.cursor()
        for name in derived_names(main, control):
            try:
                cursor.execute(f"USE `{name}`")
            except MySQLdb.OperationalError as exc:
                if exc.args[0] != ER_BAD_DB:
                    refusals.append(f"{name}: {exc.args[1] if len(exc.args) > 1 else exc}")
        try:  # the hot-account capacity test samples lock waits (see grant_sql)
            cursor.execute("SELECT COUNT(*) FROM information_schema.INNODB_LOCK_WAITS")
        except MySQLdb.OperationalError as exc:
            refusals.append(f"InnoDB lock waits: {exc.args[1] if len(exc.args) > 1 else exc}")
    finally:
        conn.close()
    return refusals


def create_configured() -> int:
    for alias, cfg in settings.DATABASES.items():
        try:
            conn = _connect(cfg)
            conn.cursor().execute(f"CREATE DATABASE IF NOT EXISTS `{cfg['NAME']}` "
                                  "CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci")
            conn.close()
        except MySQLdb.Error as exc:
            print(f"db: cannot create database {cfg['NAME']!r} for alias {alias}: {exc}", file=sys.stderr)
            return 1
    return 0


def main(argv: list[str]) -> int:
    main_name, control_name = configured_names()
    problems = name_problems(main_name, control_name)
    if problems:
        for problem in problems:
            print(f"db: {problem}", file=sys.stderr)
        print("db: a database name (the last part of NEXUS_DB_URL / NEXUS_CONTROL_DB_URL) may use ASCII letters, "
              "digits and underscores only; the main name at most 39 characters, the control name at most 55 "
              "(the demo, the journeys and the tests append suffixes such as _gw9_journey_control and the prefix "
              "test_)", file=sys.stderr)
        return 2
    mode = argv[0] if argv else None
    if mode == "--check-names":
        return 0
    if mode == "--check-access":
        refusals = access_refusals(main_name, control_name)
        for refusal in refusals:
            print(f"db: {refusal}", file=sys.stderr)
        return 1 if refusals else 0
    if mode == "--grant-sql":
        user = settings.DATABASES["default"]["USER"]
        if user != MANAGED_USER:
            print(f"db: make db creates and grants only the {MANAGED_USER!r} user; {user!r} (NEXUS_DB_URL) needs "
                  f"ALL PRIVILEGES on: {', '.join(grant_patterns(main_name, control_name))}", file=sys.stderr)
            return 2
        print(grant_sql(main_name, control_name))
        return 0
    if mode is not None:
        print(f"usage: {Path(__file__).name} [--check-names | --check-access | --grant-sql]", file=sys.stderr)
        return 2
    return create_configured()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
