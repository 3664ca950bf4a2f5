#!/usr/bin/env bash
# Instructions per request, counted by valgrind's callgrind (the same count
# whatever else the machine does, so a regression shows without a quiet
# machine): the HTTP server bare and behind idem-http's layer (fresh key,
# replay) on the memory store, then in process the fingerprint against a
# plain SHA-256 and a direct replay through the layer against
# axum-idempotent's. Needs valgrind (apt-get install valgrind).
#
#   idem-bench/callgrind.sh                 # memory
#   BACKENDS="memory redis postgres" idem-bench/callgrind.sh
#   REQUESTS=500 ITERATIONS=5000 idem-bench/callgrind.sh
set -euo pipefail
cd "$(dirname "$0")/.."

command -v valgrind >/dev/null || { echo "callgrind.sh: valgrind is not installed" >&2; exit 1; }
target=${CARGO_TARGET_DIR:-target}
out=$target/bench
mkdir -p "$out"
cargo build --release -p idem-bench --bin idem-bench-http --bin idem-bench-cost
for backend in ${BACKENDS:-memory}; do
  echo "[callgrind] server instructions per request, $backend" >&2
  "$target/release/idem-bench-http" --mode instructions --backend "$backend" \
    --requests "${REQUESTS:-200}" --workers 1 --callgrind-dir "$out/callgrind"
done
echo "[callgrind] in process: fingerprint and direct calls" >&2
"$target/release/idem-bench-cost" --iterations "${ITERATIONS:-2000}" --callgrind-dir "$out/callgrind"
