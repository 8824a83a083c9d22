#!/usr/bin/env bash
# Make sure a MariaDB server runs on 127.0.0.1:3306 and that the `nexus` user
# may create the databases the settings name (NEXUS_DB_URL / NEXUS_CONTROL_DB_URL)
# and those the project derives from them (scripts/create_databases.py says which).
# Idempotent. Works where root logs in over TCP with an empty password and where
# root authenticates only through the unix socket (Debian's default).
#
# usage: ensure_mariadb.sh [PYTHON]   (default .venv/bin/python; make db passes its own)
set -euo pipefail

HOST=127.0.0.1
PORT=3306
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
NAMES=scripts/create_databases.py

log() { printf 'db: %s\n' "$*" >&2; }

# A database name outside the rule is refused before anything is installed or granted (exit 2).
"$PY" "$NAMES" --check-names || exit $?

as_root() {
  # Run a privileged command, through sudo when we are not root.
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

server_up() {
  mysqladmin --connect-timeout=2 -h "$HOST" -P "$PORT" -u nexus -pnexus ping >/dev/null 2>&1 \
    || mysqladmin --connect-timeout=2 -h "$HOST" -P "$PORT" -u root ping >/dev/null 2>&1 \
    || mysqladmin --connect-timeout=2 -h "$HOST" -P "$PORT" ping 2>&1 | grep -q -E 'Access denied|is alive'
}

if ! command -v mariadbd >/dev/null 2>&1 && [ ! -x /usr/sbin/mariadbd ]; then
  log "MariaDB is not installed; installing it with apt-get"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y mariadb-server libmariadb-dev pkg-config >/dev/null
fi

if ! server_up; then
  log "starting MariaDB"
  as_root mkdir -p /run/mysqld
  as_root chown mysql:mysql /run/mysqld 2>/dev/null || true
  as_root start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd
  for _ in $(seq 1 60); do
    server_up && break
    sleep 1
  done
  server_up || { log "MariaDB did not come up on $HOST:$PORT"; exit 1; }
fi

if "$PY" "$NAMES" --check-access 2>/dev/null; then
  exit 0
fi
GRANTS=$("$PY" "$NAMES" --grant-sql) || exit $?
SQL="
CREATE USER IF NOT EXISTS 'nexus'@'127.0.0.1' IDENTIFIED BY 'nexus';
CREATE USER IF NOT EXISTS 'nexus'@'localhost' IDENTIFIED BY 'nexus';
$GRANTS
FLUSH PRIVILEGES;
"

if mysql --connect-timeout=3 -h "$HOST" -P "$PORT" -u root -e "SELECT 1" >/dev/null 2>&1; then
  log "configuring the nexus user over TCP as root"
  mysql -h "$HOST" -P "$PORT" -u root -e "$SQL"
elif as_root mysql --connect-timeout=3 -u root -e "SELECT 1" >/dev/null 2>&1; then
  log "configuring the nexus user through the unix socket as root"
  as_root mysql -u root -e "$SQL"
else
  log "cannot log in as the MariaDB root user over TCP or the unix socket"
  exit 1
fi
