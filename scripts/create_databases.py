"""Create the main and control databases named by the settings, if missing.

Run by ``make db`` after ``ensure_mariadb.sh`` so that ``NEXUS_DB_URL`` /
``NEXUS_CONTROL_DB_URL`` may name other databases than the defaults.
"""
import os
import sys
from pathlib import Path

import MySQLdb

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "nexusflow.settings")

from django.conf import settings  # noqa: E402


def main() -> int:
    for alias, cfg in settings.DATABASES.items():
        try:
            conn = MySQLdb.connect(host=cfg["HOST"] or "127.0.0.1", port=int(cfg["PORT"] or 3306), user=cfg["USER"],
                                   password=cfg["PASSWORD"])
            conn.cursor().execute(f"CREATE DATABASE IF NOT EXISTS `{cfg['NAME']}` "
                                  "CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci")
            conn.close()
        except MySQLdb.Error as exc:
            print(f"db: cannot create database {cfg['NAME']!r} for alias {alias}: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
