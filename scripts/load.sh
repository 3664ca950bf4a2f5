# Sourced by scripts/test (--under-load), or by hand before a subset of the
# tests: busy processes on every core, as other builds on a shared machine
# make them, for as long as the shell that started them runs.
#
#   . scripts/load.sh && start_load 4 && cargo nextest run ...
#
# start_load PER_CORE starts PER_CORE burners per core (4 on two cores: a load
# near 8) and kills them, by their own ids, when the shell exits however it
# exits; stop_load ends them sooner.
# shellcheck shell=bash

load_burners=()
load_reporter=

stop_load() {
  if [ -n "$load_reporter" ]; then
    kill "$load_reporter" 2>/dev/null || true
    load_reporter=
  fi
  if [ "${#load_burners[@]}" -gt 0 ]; then
    kill "${load_burners[@]}" 2>/dev/null || true
    wait "${load_burners[@]}" 2>/dev/null || true
    printf '[load] stopped %d busy processes; load average at the end: %s\n' \
      "${#load_burners[@]}" "$(cut -d' ' -f1-3 /proc/loadavg)" >&2
    load_burners=()
  fi
}

start_load() {
  local per_core=${1:-4} count
  count=$(( $(nproc) * per_core ))
  trap stop_load EXIT
  trap 'exit 130' INT TERM
  for _ in $(seq 1 "$count"); do
    yes >/dev/null &
    load_burners+=("$!")
  done
  printf '[load] %d busy processes on %d cores\n' "$count" "$(nproc)" >&2
  # The load the run meets, once a minute.
  (
    trap 'kill "$nap" 2>/dev/null; exit 0' TERM
    while :; do
      sleep 60 & nap=$!
      wait "$nap"
      printf '[load] load average %s\n' "$(cut -d' ' -f1-3 /proc/loadavg)" >&2
    done
  ) &
  load_reporter=$!
}
