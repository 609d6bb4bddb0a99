#!/usr/bin/env bash
# Optional suite setup: a throwaway PostgreSQL cluster on 127.0.0.1 for the scale-out tests
# (tests/integration/test_postgres*.py: `tune --storage postgresql://...` plus several `tune worker`s).
#
# Debian's package (installed when missing; CI runs as root), a fresh cluster in a temp directory owned by
# the `postgres` user (or by the current user when not root), on a free port, with a database and a
# password-authenticated user (CREATEDB: each test makes its own database). Appends
# `export TUNER_TEST_POSTGRES_URL=...` to .ci/env; other setup scripts write there too, so only our own
# earlier line is replaced. Run again, it reuses a cluster that still answers. A failure here only makes
# the postgres tests skip with a reason (.ci/run tolerates it).
set -euo pipefail
cd "$(dirname "$0")/.."
DB=tuner_test
ROLE=tuner
PASSWORD=${TUNER_PG_PASSWORD:-tuner-ci}

# A cluster set up earlier that still answers: keep it.
if [ -f .ci/env ] && OLD=$(sed -n 's/^export TUNER_TEST_POSTGRES_URL=//p' .ci/env | tail -1) && [ -n "$OLD" ] \
    && command -v psql >/dev/null 2>&1 && psql -X -q "${OLD/+psycopg2/}" -c 'SELECT 1' >/dev/null 2>&1; then
  echo "postgres already set up: the TUNER_TEST_POSTGRES_URL in .ci/env answers"
  exit 0
fi

pg_bindir() {
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
  if [ -n "$d" ] && [ -x "$d/initdb" ]; then echo "$d"; return; fi
  if command -v initdb >/dev/null 2>&1; then dirname "$(command -v initdb)"; return; fi
  return 1
}

if ! BIN=$(pg_bindir); then
  if [ "$(id -u)" != 0 ]; then
    echo "setup-postgres: PostgreSQL is not installed and we are not root to apt-get install it" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq postgresql >/dev/null
  BIN=$(pg_bindir)
fi
echo "PostgreSQL: $("$BIN/postgres" --version)"

# Run the server tools as an unprivileged user: postgres refuses to run as root.
if [ "$(id -u)" = 0 ]; then
  id postgres >/dev/null 2>&1 || useradd --system --home-dir /var/lib/postgresql --shell /bin/sh postgres
  as_pg() { runuser -u postgres -- "$@"; }
else
  as_pg() { "$@"; }
fi

DATA=$(mktemp -d "${TMPDIR:-/tmp}/slo-tuner-pg.XXXXXX")
chmod 700 "$DATA"
[ "$(id -u)" = 0 ] && chown postgres: "$DATA"
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

as_pg "$BIN/initdb" -D "$DATA/data" -U postgres --auth-local=trust --auth-host=scram-sha-256 \
  -E UTF8 --locale=C >"$DATA/initdb.log" 2>&1 || { tail -20 "$DATA/initdb.log"; exit 1; }
as_pg "$BIN/pg_ctl" -D "$DATA/data" -l "$DATA/server.log" -w -t 60 start \
  -o "-c listen_addresses=127.0.0.1 -p $PORT -c unix_socket_directories=$DATA -c max_connections=200 -c fsync=off" \
  >/dev/null || { tail -20 "$DATA/server.log"; exit 1; }

psql_admin() { as_pg "$BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$DATA" -p "$PORT" -U postgres -d postgres "$@"; }
psql_admin -c "CREATE ROLE $ROLE LOGIN CREATEDB PASSWORD '$PASSWORD'"
psql_admin -c "CREATE DATABASE $DB OWNER $ROLE"

URL="postgresql+psycopg2://$ROLE:$PASSWORD@127.0.0.1:$PORT/$DB"
# Prove the URL works the way the tests will use it (TCP, password), with the project's driver if present.
PGPASSWORD=$PASSWORD "$BIN/psql" -X -q -h 127.0.0.1 -p "$PORT" -U "$ROLE" -d "$DB" -c 'SELECT 1' >/dev/null

touch .ci/env
sed -i '/TUNER_TEST_POSTGRES_URL=/d' .ci/env
echo "export TUNER_TEST_POSTGRES_URL=$URL" >> .ci/env
echo "postgres setup done: cluster $DATA/data on 127.0.0.1:$PORT (stop: pg_ctl -D $DATA/data stop)"
