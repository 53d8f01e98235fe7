#!/usr/bin/env bash
# Measurement (not a test): what stalled webhook clients with a WRONG token cost planbot's memory.
# Starts `planbot serve` on loopback, reads its VmRSS (/proc/<pid>/status), opens N clients that
# each announce a 25 MiB body with a wrong X-Gitlab-Token, send 24 MiB of it (as far as planbot
# reads) and stall; reads VmRSS again, and says what each client was answered.
#
#   scripts/measure-stalled-bodies.sh [CLIENTS=16]
#
# PLANBOT_BIN=path measures that binary (e.g. an older build, to compare); else a release build.
# Needs: python3, curl.
set -euo pipefail
cd "$(dirname "$0")/.."

clients="${1:-16}"
if [ -n "${PLANBOT_BIN:-}" ]; then
  bin="$PLANBOT_BIN"
else
  cargo build --release --quiet --bin planbot
  bin="${CARGO_TARGET_DIR:-target}/release/planbot"
fi

work=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
dead=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat >"$work/planbot.toml" <<TOML
listen = "127.0.0.1:$port"
data_dir = "$work/data"
fingerprint_key = "measure-fingerprint-key-0123456789"
[gitlab]
url = "http://127.0.0.1:$dead"
token = "glpat-measure-not-real"
webhook_secret = "measure-webhook-secret-$RANDOM$RANDOM"
projects = ["flightjs/flight-management"]
[plan]
max_concurrent_plans = 1
TOML

RUST_LOG=error "$bin" serve --config "$work/planbot.toml" >"$work/serve.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 100); do
  curl -fsS "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break
  sleep 0.1
done
rss() { awk '/^VmRSS/ {print $2}' "/proc/$pid/status"; }
before=$(rss)

python3 - "$port" "$clients" "$pid" <<'PY'
import socket, sys, time
port, n, pid = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
declared, sent = 25 * 1024 * 1024, 24 * 1024 * 1024
head = (
    "POST /webhooks/gitlab HTTP/1.1\r\nHost: planbot\r\nX-Gitlab-Event: Merge Request Hook\r\n"
    "X-Gitlab-Token: wrong-token\r\nContent-Type: application/json\r\n"
    f"Content-Length: {declared}\r\n\r\n"
).encode()
chunk = b" " * (1024 * 1024)
conns, answers = [], {}
for i in range(n):
    c = socket.create_connection(("127.0.0.1", port))
    c.sendall(head)
    c.settimeout(0.2)
    pushed = 0
    # Send the body while planbot reads it; stop (stall) once 24 MiB are out or it stopped reading.
    while pushed < sent:
        try:
            pushed += c.send(chunk)
        except (socket.timeout, BrokenPipeError, ConnectionResetError):
            break
    try:
        answers[i] = c.recv(64).split(b"\r\n")[0].decode() or "closed"
    except socket.timeout:
        answers[i] = "no answer yet (stalled)"
    except ConnectionResetError:
        answers[i] = "reset"
    conns.append(c)
time.sleep(2)  # let planbot settle what it buffered (a measurement, not a test)
rss = [l for l in open(f"/proc/{pid}/status") if l.startswith("VmRSS")][0].split()[1]
counts = {}
for a in answers.values():
    counts[a] = counts.get(a, 0) + 1
print(f"answers: {counts}")
print(f"planbot VmRSS with {n} stalled wrong-token clients: {rss} KiB ({int(rss) // 1024} MiB)")
PY
echo "planbot VmRSS before: ${before} KiB ($((before / 1024)) MiB)"
