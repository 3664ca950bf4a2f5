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

redis_ping() { timeout 3 redis-cli -h 127.0.0.1 -p "$1" ping 2>/dev/null | grep -q PONG; }

ensure_redis_installed() {
  command -v redis-server >/dev/null && command -v redis-cli >/dev/null || apt_install redis-server
}

ensure_redis() {
  ensure_redis_installed
  export IDEM_REDIS_SERVER=${IDEM_REDIS_SERVER:-$(command -v redis-server)}
  if [ -n "${IDEM_REDIS_URL:-}" ]; then
    log "redis: using IDEM_REDIS_URL"
    return
  fi
  if ! redis_ping 6379; then
    log "redis: starting a server on 127.0.0.1:6379"
    mkdir -p /var/lib/redis /var/log/redis 2>/dev/null || true
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
      --dir "$(mktemp -d)" --logfile "${TMPDIR:-/tmp}/idem-redis-6379.log" >/dev/null \
      || die "redis-server did not start"
    for _ in $(seq 1 40); do redis_ping 6379 && break; sleep 0.25; done
    redis_ping 6379 || die "redis is not answering on 127.0.0.1:6379"
  fi
  export IDEM_REDIS_URL=redis://127.0.0.1:6379
  log "redis: $IDEM_REDIS_URL"
}

# A three-master Redis Cluster on loopback ports 7101-7103.
ensure_redis_cluster() {
  ensure_redis_installed
  if [ -n "${IDEM_REDIS_CLUSTER_URLS:-}" ]; then
    log "redis cluster: using IDEM_REDIS_CLUSTER_URLS"
    return
  fi
  local ports="7101 7102 7103" dir="${TMPDIR:-/tmp}/idem-redis-cluster" port
  if ! timeout 3 redis-cli -p 7101 cluster info 2>/dev/null | grep -q cluster_state:ok; then
    log "redis cluster: starting three masters on ports $ports"
    for port in $ports; do timeout 3 redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; done
    rm -rf "$dir"
    for port in $ports; do
      mkdir -p "$dir/$port"
      redis-server --daemonize yes --bind 127.0.0.1 --port "$port" --cluster-enabled yes \
        --cluster-config-file "$dir/$port/nodes.conf" --dir "$dir/$port" \
        --save "" --appendonly no --logfile "$dir/$port/redis.log" >/dev/null \
        || die "redis-server on port $port did not start"
    done
    for port in $ports; do
      for _ in $(seq 1 40); do redis_ping "$port" && break; sleep 0.25; done
      redis_ping "$port" || die "redis cluster node $port is not answering"
    done
    timeout 30 redis-cli --cluster create 127.0.0.1:7101 127.0.0.1:7102 127.0.0.1:7103 \
      --cluster-replicas 0 --cluster-yes >/dev/null || die "redis-cli --cluster create failed"
    for port in $ports; do
      for _ in $(seq 1 60); do
        timeout 3 redis-cli -p "$port" cluster info 2>/dev/null | grep -q cluster_state:ok && break
        sleep 0.25
      done
      timeout 3 redis-cli -p "$port" cluster info | grep -q cluster_state:ok \
        || die "redis cluster node $port never reached cluster_state:ok"
    done
  fi
  export IDEM_REDIS_CLUSTER_URLS=redis://127.0.0.1:7101,redis://127.0.0.1:7102,redis://127.0.0.1:7103
  log "redis cluster: $IDEM_REDIS_CLUSTER_URLS"
}

# moto's DynamoDB emulator from PyPI, in a virtual environment of our own,
# served behind one lock by scripts/moto_server.py.
MOTO_REQUIREMENTS=("moto[dynamodb]==5.2.5" "flask==3.1.3" "flask-cors==6.0.5")

moto_answers() {
  "$1/bin/python" - "$2" <<'PY' 2>/dev/null
import json, sys, urllib.request
reply = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/__idem/requests?table=ping", timeout=2)
json.load(reply)["requests"]
PY
}

ensure_moto() {
  if [ -n "${IDEM_DYNAMO_ENDPOINT:-}" ]; then
    log "dynamodb: using IDEM_DYNAMO_ENDPOINT"
    return
  fi
  local venv=${IDEM_MOTO_VENV:-$HOME/.cache/idem/moto-venv} port=${IDEM_MOTO_PORT:-8765}
  if ! "$venv/bin/python" -c 'import moto, flask, flask_cors' 2>/dev/null; then
    command -v python3 >/dev/null || apt_install python3
    rm -rf "$venv"
    if ! python3 -m venv "$venv" 2>/dev/null; then
      apt_install python3-venv
      rm -rf "$venv"
      python3 -m venv "$venv" || die "cannot create a virtual environment at $venv"
    fi
    log "dynamodb: installing ${MOTO_REQUIREMENTS[*]} into $venv"
    "$venv/bin/pip" install -q "${MOTO_REQUIREMENTS[@]}" || die "pip install of moto failed"
  fi
  if ! moto_answers "$venv" "$port"; then
    log "dynamodb: starting moto on 127.0.0.1:$port"
    nohup "$venv/bin/python" scripts/moto_server.py --host 127.0.0.1 --port "$port" \
      >"${TMPDIR:-/tmp}/idem-moto-$port.log" 2>&1 &
    for _ in $(seq 1 60); do moto_answers "$venv" "$port" && break; sleep 0.25; done
    moto_answers "$venv" "$port" || die "moto did not answer on port $port (see ${TMPDIR:-/tmp}/idem-moto-$port.log)"
  fi
  export IDEM_DYNAMO_ENDPOINT=http://127.0.0.1:$port
  log "dynamodb: $IDEM_DYNAMO_ENDPOINT"
}
