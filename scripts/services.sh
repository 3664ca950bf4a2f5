# Sourced by scripts/test: makes sure every service the backends' tests need
# is running, starting or installing it when missing, and exports the
# variables the tests read. A service that cannot be had stops the run.
# shellcheck shell=bash

log() { printf '[services] %s\n' "$*" >&2; }
die() { printf '[services] FAILED: %s\n' "$*" >&2; exit 1; }

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

apt_install() {
  log "installing $* from Debian's packages"
  if [ -z "${IDEM_APT_UPDATED:-}" ]; then
    as_root apt-get update -qq >/dev/null || die "apt-get update failed"
    IDEM_APT_UPDATED=1
  fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null \
    || die "apt-get install $* failed"
}

pg_query() { PGCONNECT_TIMEOUT=3 psql "$1" -XtAc "$2" 2>/dev/null; }

ensure_postgres() {
  if [ -n "${IDEM_POSTGRES_URL:-}" ]; then
    pg_query "$IDEM_POSTGRES_URL" 'SELECT 1' >/dev/null || die "IDEM_POSTGRES_URL=$IDEM_POSTGRES_URL does not answer"
    log "postgres: using IDEM_POSTGRES_URL"
    return
  fi
  if ! command -v pg_ctlcluster >/dev/null || ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
    apt_install postgresql postgresql-client
  fi
  if ! pg_isready -q -h 127.0.0.1 -p 5432; then
    local version
    version=$(ls /usr/lib/postgresql | sort -V | tail -n 1)
    if ! ls /etc/postgresql/"$version"/main >/dev/null 2>&1; then
      as_root pg_createcluster "$version" main >/dev/null || die "pg_createcluster failed"
    fi
    log "postgres: starting cluster $version/main"
    as_root pg_ctlcluster --skip-systemctl-redirect "$version" main start || die "postgres did not start"
    for _ in $(seq 1 60); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 0.5; done
    pg_isready -q -h 127.0.0.1 -p 5432 || die "postgres is not accepting connections on 127.0.0.1:5432"
  fi
  # This machine's kind trusts local connections; a stock Debian install wants
  # a password over TCP, so there we make a role of our own.
  local admin=postgres://postgres@127.0.0.1:5432/postgres
  if pg_query "$admin" 'SELECT 1' >/dev/null; then
    pg_query "$admin" "SELECT 1 FROM pg_database WHERE datname = 'test'" | grep -q 1 \
      || pg_query "$admin" 'CREATE DATABASE test' >/dev/null || die "cannot create database test"
    export IDEM_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test
  else
    local url=postgres://idem:idem@127.0.0.1:5432/idem_test
    if ! pg_query "$url" 'SELECT 1' >/dev/null; then
      log "postgres: creating role and database idem_test"
      as_root runuser -u postgres -- psql -Xq -c "CREATE ROLE idem LOGIN PASSWORD 'idem'" 2>/dev/null || true
      as_root runuser -u postgres -- psql -Xq -c "CREATE DATABASE idem_test OWNER idem" 2>/dev/null || true
    fi
    pg_query "$url" 'SELECT 1' >/dev/null || die "cannot log in to postgres as idem"
    export IDEM_POSTGRES_URL=$url
  fi
  log "postgres: $IDEM_POSTGRES_URL"
}
