#!/usr/bin/env bash
# Load benchmark (not a test): start `planbot serve` (release build) on loopback and drive it with
# signed-off GitLab MR webhooks from wrk, each with a unique Idempotency-Key; then count the
# deliveries really committed to the store and report deliveries/s and p50/p99 latency.
#
#   scripts/bench-webhooks.sh [DURATION=20s] [CONNECTIONS=32] [THREADS=1]
#
# PLANBOT_BIN=path skips the build and benchmarks that binary.
# PLANBOT_BENCH_POSTGRES_URL=postgres://user@host/db benchmarks the PostgreSQL store instead of
# SQLite (an empty database, or one this script made before: it must be only planbot's).
# Needs: wrk (`apt-get install -y wrk`), python3 (to read the SQLite file), psql for
# PostgreSQL, curl.
set -euo pipefail
cd "$(dirname "$0")/.."

duration="${1:-20s}"
connections="${2:-32}"
threads="${3:-1}"
command -v wrk >/dev/null || { echo "bench: wrk is not installed (apt-get install -y wrk)" >&2; exit 2; }

if [ -n "${PLANBOT_BIN:-}" ]; then
  bin="$PLANBOT_BIN"            # an already built release binary
else
  cargo build --release --quiet --bin planbot
  bin="${CARGO_TARGET_DIR:-target}/release/planbot"
fi

work=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
dead=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
secret="bench-webhook-secret-$RANDOM$RANDOM"
cat >"$work/planbot.toml" <<TOML
listen = "127.0.0.1:$port"
data_dir = "$work/data"
fingerprint_key = "bench-fingerprint-key-0123456789"
[gitlab]
url = "http://127.0.0.1:$dead"
token = "glpat-bench-not-real"
webhook_secret = "$secret"
projects = ["flightjs/flight-management"]
[plan]
max_concurrent_plans = 1
TOML
pg="${PLANBOT_BENCH_POSTGRES_URL:-}"
if [ -n "$pg" ]; then
  printf '[store]\nurl = "%s"\n' "$pg" >>"$work/planbot.toml"
fi

fixture="tests/fixtures/gitlab/webhooks/merge_request_open.json"
[ -f "$fixture" ] || { echo "bench: fixture $fixture not found (run from the repository root)" >&2; exit 2; }

RUST_LOG=error "$bin" serve --config "$work/planbot.toml" >"$work/serve.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 100); do
  curl -fsS "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break
  sleep 0.1
done

echo "bench: planbot serve (release) on 127.0.0.1:$port, $(nproc) cores, wrk -t$threads -c$connections -d$duration"
# Warm-up (not counted in wrk's numbers, but counted in SQLite; subtracted below).
BENCH_BODY="$fixture" BENCH_SECRET="$secret" wrk -t1 -c4 -d2s -s scripts/bench-webhooks.lua \
  "http://127.0.0.1:$port" >/dev/null
sql_count() {
  if [ -n "$pg" ]; then
    psql -Atq "$pg" -c "select count(*) from $1"
  else
    python3 -c "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); print(c.execute('select count(*) from ' + sys.argv[2]).fetchone()[0])" "$work/data/planbot.db" "$1"
  fi
}
count() { sql_count deliveries; }
before=$(count)
start=$(date +%s.%N)
BENCH_BODY="$fixture" BENCH_SECRET="$secret" wrk -t"$threads" -c"$connections" -d"$duration" --latency \
  -s scripts/bench-webhooks.lua "http://127.0.0.1:$port" | tee "$work/wrk.out" | grep -E '^bench:|Latency|Req/Sec'
end=$(date +%s.%N)
after=$(count)
jobs=$(sql_count jobs)
store=$([ -n "$pg" ] && echo PostgreSQL || echo SQLite)
python3 - "$before" "$after" "$start" "$end" "$jobs" "$store" <<'PY'
import sys
before, after, start, end, jobs = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
n = after - before
print(f"bench: {n} deliveries committed to {sys.argv[6]} in {end - start:.1f} s = {n / (end - start):.0f} deliveries/s ({jobs} jobs in the queue table)")
PY
