"""``packs.demo.schema``: new databases copied from a template migrated once per set of migrations.

Real MariaDB. The ``migrate`` step is a stand-in that writes a small schema (two tables, a foreign key, a check
and a row, as a data migration would) so the copy can be compared with what was migrated.
"""
from __future__ import annotations

import MySQLdb
import pytest
from django.conf import settings

from packs.demo import schema
from packs.demo.run import demo_database_names

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def server():
    cfg = dict(settings.DATABASES["default"])
    conn = MySQLdb.connect(host=cfg["HOST"] or "127.0.0.1", port=int(cfg["PORT"] or 3306), user=cfg["USER"],
                           password=cfg["PASSWORD"], autocommit=True)
    yield cfg, conn.cursor()
    cursor = conn.cursor()
    cursor.execute("SELECT SCHEMA_NAME FROM information_schema.SCHEMATA WHERE SCHEMA_NAME LIKE %s",
                   [cfg["NAME"].replace("_", r"\_") + r"\_%"])
    for (name,) in cursor.fetchall():
        if name.startswith((cfg["NAME"] + "_t", cfg["NAME"] + "_demo")):
            cursor.execute(f"DROP DATABASE `{name}`")
    conn.close()


def _migrate_into(cursor, calls: list):
    def migrate(main: str, control: str) -> None:
        calls.append((main, control))
        cursor.execute(f"CREATE TABLE `{main}`.parent (id INT PRIMARY KEY, state VARCHAR(8) NOT NULL, "
                       "CONSTRAINT state_known CHECK (state IN ('a', 'b')))")
        cursor.execute(f"CREATE TABLE `{main}`.child (id INT PRIMARY KEY AUTO_INCREMENT, parent_id INT NOT NULL, "
                       "CONSTRAINT child_parent FOREIGN KEY (parent_id) REFERENCES parent (id))")
        cursor.execute(f"INSERT INTO `{main}`.parent VALUES (1, 'a')")
        cursor.execute(f"CREATE TABLE `{control}`.journal (id INT PRIMARY KEY)")
        cursor.execute(f"INSERT INTO `{control}`.journal VALUES (7)")
    return migrate


def _shape(cursor, name: str) -> dict:
    cursor.execute("SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s ORDER BY 1", [name])
    tables = [row[0] for row in cursor.fetchall()]
    cursor.execute("SELECT CONSTRAINT_NAME, REFERENCED_TABLE_NAME, UNIQUE_CONSTRAINT_SCHEMA FROM "
                   "information_schema.REFERENTIAL_CONSTRAINTS WHERE CONSTRAINT_SCHEMA = %s", [name])
    foreign = cursor.fetchall()
    cursor.execute("SELECT CONSTRAINT_NAME FROM information_schema.CHECK_CONSTRAINTS WHERE CONSTRAINT_SCHEMA = %s",
                   [name])
    checks = [row[0] for row in cursor.fetchall()]
    return {"tables": tables, "foreign": foreign, "checks": checks}


def test_the_first_run_migrates_a_template_and_every_run_copies_its_tables_keys_checks_and_rows(server, monkeypatch):
    cfg, cursor = server
    monkeypatch.setattr(schema, "migration_digest", lambda: "a1b2c3" + "0" * 58)
    main, control = demo_database_names(cfg["NAME"])
    calls: list = []
    assert schema.create_migrated_databases(cfg, main, control, migrate=_migrate_into(cursor, calls)) is True
    template = schema.template_names(cfg["NAME"], "a1b2c3")
    assert calls == [template] and template == (f"{cfg['NAME']}_ta1b2c3", f"{cfg['NAME']}_ta1b2c3_control")
    cursor.execute(f"INSERT INTO `{main}`.child (parent_id) VALUES (1)")  # written by the run, not the template
    assert schema.create_migrated_databases(cfg, main, control, migrate=_migrate_into(cursor, calls)) is False
    assert calls == [template]  # the second run migrated nothing
    assert _shape(cursor, main) == {"tables": ["child", "parent"], "foreign": ((  "child_parent", "parent", main),),
                                    "checks": ["state_known"]}
    assert _shape(cursor, control)["tables"] == ["journal"]
    cursor.execute(f"SELECT id FROM `{control}`.journal")  # the last database copied keeps its rows too
    assert cursor.fetchall() == ((7,),)
    cursor.execute(f"SELECT id, state FROM `{main}`.parent")
    assert cursor.fetchall() == ((1, "a"),)
    cursor.execute(f"SELECT COUNT(*) FROM `{main}`.child")
    assert cursor.fetchone() == (0,)  # a new copy: the previous run's rows are gone
    with pytest.raises(MySQLdb.IntegrityError):  # the foreign key holds in the copy
        cursor.execute(f"INSERT INTO `{main}`.child (parent_id) VALUES (9)")
    with pytest.raises(MySQLdb.OperationalError):  # and so does the check
        cursor.execute(f"INSERT INTO `{main}`.parent VALUES (2, 'z')")


def test_changed_migrations_migrate_a_new_template_and_drop_the_old_one(server, monkeypatch):
    cfg, cursor = server
    main, control = demo_database_names(cfg["NAME"])
    calls: list = []
    for digest in ("aaaaaa", "bbbbbb"):
        monkeypatch.setattr(schema, "migration_digest", lambda d=digest: d + "0" * 58)
        assert schema.create_migrated_databases(cfg, main, control, migrate=_migrate_into(cursor, calls)) is True
    assert calls == [schema.template_names(cfg["NAME"], "aaaaaa"), schema.template_names(cfg["NAME"], "bbbbbb")]
    cursor.execute("SELECT SCHEMA_NAME FROM information_schema.SCHEMATA WHERE SCHEMA_NAME LIKE %s ORDER BY 1",
                   [cfg["NAME"].replace("_", r"\_") + r"\_t%"])
    assert [row[0] for row in cursor.fetchall()] == list(schema.template_names(cfg["NAME"], "bbbbbb"))


def test_a_migration_that_failed_leaves_the_template_incomplete_and_the_next_run_migrates_again(server, monkeypatch):
    cfg, cursor = server
    monkeypatch.setattr(schema, "migration_digest", lambda: "cccccc" + "0" * 58)
    main, control = demo_database_names(cfg["NAME"])

    def failing(main_name: str, control_name: str) -> None:
        cursor.execute(f"CREATE TABLE `{main_name}`.half (id INT PRIMARY KEY)")
        raise RuntimeError("migration 0007 failed")

    with pytest.raises(RuntimeError, match="0007"):
        schema.create_migrated_databases(cfg, main, control, migrate=failing)
    calls: list = []
    assert schema.create_migrated_databases(cfg, main, control, migrate=_migrate_into(cursor, calls)) is True
    assert len(calls) == 1 and _shape(cursor, main)["tables"] == ["child", "parent"]


def test_the_digest_covers_every_migration_file_of_the_project():
    paths = [p for p in schema.ROOT.glob("**/migrations/*.py") if ".venv" not in p.parts and "var" not in p.parts]
    assert len(paths) > 20 and any("connectors" in p.parts for p in paths)
    assert len(schema.migration_digest()) == 64 and schema.migration_digest() == schema.migration_digest()
