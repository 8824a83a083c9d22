"""``make db`` prepares any database name the README allows, and refuses the others saying which names work.

Runs ``make db``'s own steps (``scripts/ensure_mariadb.sh``, then
``scripts/create_databases.py``) for a fresh name ``nfnew<hex>``, then, as the
``nexus`` user, recreates every database the project derives from it the way
the demo and the journeys do (``packs.demo.run.recreate_databases``), pytest's
``test_`` copies included. Granting needs the MariaDB root user, as ``make db``
does; the name's databases and grants are removed at the end.
"""
from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys

import MySQLdb
import pytest
from django.conf import settings

from packs.demo.run import demo_database_names, recreate_databases
from packs.journeys import journey_database_names
from tests.conftest import ROOT

HOST, PORT = "127.0.0.1", 3306  # where ensure_mariadb.sh keeps the server
STEP_TIMEOUT_SECONDS = 120


def _root_argv() -> list[str] | None:
    """The ``mysql`` command line that logs in as MariaDB root, over TCP or the unix socket as ``ensure_mariadb.sh``
    does; None if neither does."""
    if shutil.which("mysql") is None:
        return None
    socket = ["mysql", "-u", "root"] if os.getuid() == 0 else ["sudo", "-n", "mysql", "-u", "root"]
    for argv in (["mysql", "-h", HOST, "-P", str(PORT), "-u", "root"], socket):
        probe = subprocess.run([*argv, "--connect-timeout=3", "-e", "SELECT 1"], capture_output=True, timeout=30)
        if probe.returncode == 0:
            return argv
    return None


def _root_mysql(argv: list[str], sql: str) -> list[list[str]]:
    """Run ``sql`` as root; its rows, raw (backslashes in names kept as stored)."""
    done = subprocess.run([*argv, "-N", "-B", "-r", "-e", sql], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return [line.split("\t") for line in done.stdout.splitlines() if line]


def _env(name: str) -> dict:
    env = {**os.environ, "NEXUS_DB_URL": f"mysql://nexus:nexus@{HOST}:{PORT}/{name}"}
    env.pop("NEXUS_CONTROL_DB_URL", None)
    return env


def _make_db_steps(env: dict) -> list[subprocess.CompletedProcess]:
    """``make db``'s steps before migrating, stopping at the first that fails."""
    done = []
    steps = (["bash", "scripts/ensure_mariadb.sh", sys.executable], [sys.executable, "scripts/create_databases.py"])
    for argv in steps:
        done.append(subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True,
                                   timeout=STEP_TIMEOUT_SECONDS))
        if done[-1].returncode != 0:
            break
    return done


@pytest.fixture
def custom_name():
    """A fresh database name outside ``nexusflow*``; its databases and grants are removed afterwards."""
    root = _root_argv()
    if root is None:
        pytest.skip("granting a new database name needs the MariaDB root user (TCP or unix socket), as make db does")
    name = "nfnew" + secrets.token_hex(3)
    yield name
    databases = _root_mysql(root, "SELECT schema_name FROM information_schema.schemata "
                                  f"WHERE schema_name LIKE '%{name}%'")
    grants = _root_mysql(root, f"SELECT Db, Host FROM mysql.db WHERE User = 'nexus' AND Db LIKE '%{name}%'")
    cleanup = [f"DROP DATABASE IF EXISTS `{db}`;" for [db] in databases]
    cleanup += [f"REVOKE ALL PRIVILEGES ON `{db}`.* FROM 'nexus'@'{host}';" for db, host in grants]
    if cleanup:
        _root_mysql(root, "".join(cleanup) + "FLUSH PRIVILEGES;")


def test_make_db_prepares_a_custom_name_and_every_database_derived_from_it(custom_name):
    steps = _make_db_steps(_env(custom_name))
    assert [s.returncode for s in steps] == [0, 0], "\n".join(s.stdout + s.stderr for s in steps)

    main, control = custom_name, f"{custom_name}_control"
    derived = [*demo_database_names(main), *journey_database_names(main)]
    tests = [f"test_{name}" for name in (main, control, *derived)]  # pytest's copies; tests run the demo too
    cfg = {**settings.DATABASES["default"], "HOST": HOST, "PORT": PORT, "USER": "nexus", "PASSWORD": "nexus"}
    conn = MySQLdb.connect(host=HOST, port=PORT, user="nexus", password="nexus")
    try:
        cursor = conn.cursor()
        cursor.execute("SHOW DATABASES")
        assert {main, control} <= {row[0] for row in cursor.fetchall()}
        recreate_databases(cfg, derived + tests)  # raises "Access denied" for a name the grants miss
        cursor.execute("SHOW DATABASES")
        assert set(derived + tests) <= {row[0] for row in cursor.fetchall()}
        for name in derived + tests:
            cursor.execute(f"DROP DATABASE `{name}`")
    finally:
        conn.close()


@pytest.mark.parametrize("shape,rule", [
    ("nf-new{}", "ASCII letters, digits and underscores"),
    ("nfnew{}_" + "x" * 28, "the main name at most 39 characters"),  # 40 characters
])
def test_make_db_refuses_a_name_outside_the_rule_and_says_which_names_work(shape, rule):
    name = shape.format(secrets.token_hex(3))
    steps = _make_db_steps(_env(name))
    assert [s.returncode for s in steps] == [2], "\n".join(s.stdout + s.stderr for s in steps)
    assert rule in steps[0].stderr and "Traceback" not in steps[0].stderr
    with MySQLdb.connect(host=HOST, port=PORT, user="nexus", password="nexus") as conn:
        cursor = conn.cursor()
        cursor.execute("SHOW DATABASES LIKE %s", (name.replace("_", "\\_") + "%",))
        assert cursor.fetchall() == ()
