#!/usr/bin/env bash
# Install (Debian apt) and start a local PostgreSQL server, create a user + database for the
# protocol tests, and print the SQLAlchemy URL on stdout (everything else goes to stderr).
#   export SWARMRL_TEST_DATABASE_URL="$(scripts/ci-postgres.sh)"
# Needs root (apt-get, pg_ctlcluster). Binds 127.0.0.1 only. Idempotent: reruns reuse the cluster.
set -euo pipefail
DB_NAME="${SWARMRL_PG_DB:-swarmrl_test}"
DB_USER="${SWARMRL_PG_USER:-swarmrl}"
DB_PASS="${SWARMRL_PG_PASSWORD:-swarmrl}"
PORT="${SWARMRL_PG_PORT:-5432}"

log() { echo "[ci-postgres] $*" >&2; }

if ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then
  log "installing postgresql with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq postgresql >&2
fi
VER="$(ls /usr/lib/postgresql | sort -V | tail -n1)"
CLUSTER=main
if ! pg_lsclusters -h 2>/dev/null | awk '{print $1" "$2}' | grep -qx "$VER $CLUSTER"; then
  log "creating cluster $VER/$CLUSTER"
  pg_createcluster "$VER" "$CLUSTER" -p "$PORT" -- --auth-local=peer --auth-host=scram-sha-256 >&2
fi
CONF_DIR="/etc/postgresql/$VER/$CLUSTER"
sed -i "s/^#\?listen_addresses.*/listen_addresses = '127.0.0.1'/" "$CONF_DIR/postgresql.conf"
PORT="$(pg_lsclusters -h | awk -v v="$VER" -v c="$CLUSTER" '$1==v && $2==c {print $3}')"
if ! pg_lsclusters -h | awk -v v="$VER" -v c="$CLUSTER" '$1==v && $2==c {print $4}' | grep -q online; then
  log "starting cluster $VER/$CLUSTER on port $PORT"
  pg_ctlcluster "$VER" "$CLUSTER" start >&2
fi
for _ in $(seq 1 30); do
  su postgres -c "psql -p $PORT -tAc 'select 1'" >/dev/null 2>&1 && break
  sleep 1
done
su postgres -c "psql -p $PORT -v ON_ERROR_STOP=1 -q" >&2 <<SQL
DO \$\$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$DB_USER') THEN
    CREATE ROLE $DB_USER LOGIN PASSWORD '$DB_PASS';
  ELSE
    ALTER ROLE $DB_USER LOGIN PASSWORD '$DB_PASS';
  END IF;
END \$\$;
SQL
if ! su postgres -c "psql -p $PORT -tAc \"select 1 from pg_database where datname='$DB_NAME'\"" | grep -q 1; then
  su postgres -c "createdb -p $PORT -O $DB_USER $DB_NAME" >&2
fi
log "ready"
echo "postgresql+psycopg2://$DB_USER:$DB_PASS@127.0.0.1:$PORT/$DB_NAME"
