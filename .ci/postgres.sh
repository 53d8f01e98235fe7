# Start a throwaway PostgreSQL cluster for the tests; source this file, then call
# `start_test_postgres`. It exports PLANBOT_TEST_POSTGRES_URL and PLANBOT_TEST_POSTGRES_CA, and
# stops (and deletes) the cluster when the calling shell exits. Used by .ci/run; developers can source it too:
#   source .ci/postgres.sh && start_test_postgres && cargo test --locked --all-targets
# initdb refuses to run as root, so as root the server runs as the `postgres` system user
# (created by Debian's package), on a private socket directory and a free loopback port.
# The server offers TLS (ssl=on) with a certificate for the name `localhost` only (not for
# 127.0.0.1), signed by a throwaway CA made with the openssl CLI (PLANBOT_TEST_POSTGRES_CA, its
# PEM); plaintext connections work too (the `host` lines of pg_hba.conf accept both).

pg_bin_dir() {
  if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
    dirname "$(readlink -f "$(command -v pg_ctl)")"
    return
  fi
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  [ -n "$d" ] && echo "$d"
}

start_test_postgres() {
  local bin
  bin=$(pg_bin_dir || true)
  if [ -z "$bin" ]; then
    echo "ci: installing PostgreSQL for the store tests"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >/dev/null
    bin=$(pg_bin_dir)
  fi
  local as=()
  if [ "$(id -u)" = 0 ]; then
    if ! id postgres >/dev/null 2>&1; then
      useradd --system --no-create-home --shell /usr/sbin/nologin postgres
    fi
    as=(runuser -u postgres --)
  fi
  PG_TEST_DIR=$(mktemp -d /tmp/planbot-pg.XXXXXX)
  chmod 0755 "$PG_TEST_DIR"
  mkdir -p "$PG_TEST_DIR/data" "$PG_TEST_DIR/sock" "$PG_TEST_DIR/tls"
  make_test_postgres_certs "$PG_TEST_DIR/tls" || return 1
  [ "$(id -u)" = 0 ] && chown -R postgres: "$PG_TEST_DIR"
  local port
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  "${as[@]}" "$bin/initdb" -D "$PG_TEST_DIR/data" -U postgres --auth=trust -E UTF8 \
    --no-sync >"$PG_TEST_DIR/initdb.log" 2>&1 || { cat "$PG_TEST_DIR/initdb.log" >&2; return 1; }
  "${as[@]}" "$bin/pg_ctl" -D "$PG_TEST_DIR/data" -l "$PG_TEST_DIR/server.log" -w -t 60 \
    -o "-h 127.0.0.1 -p $port -k $PG_TEST_DIR/sock -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=400 -c ssl=on -c ssl_cert_file=$PG_TEST_DIR/tls/server.pem -c ssl_key_file=$PG_TEST_DIR/tls/server.key" \
    start >/dev/null || { cat "$PG_TEST_DIR/server.log" >&2; return 1; }
  PG_TEST_STOP=("${as[@]}" "$bin/pg_ctl" -D "$PG_TEST_DIR/data" -m immediate stop)
  trap stop_test_postgres EXIT
  export PLANBOT_TEST_POSTGRES_URL="postgres://postgres@127.0.0.1:$port/postgres"
  export PLANBOT_TEST_POSTGRES_CA="$PG_TEST_DIR/tls/ca.pem"
  echo "ci: PostgreSQL for the tests: $("$bin/postgres" --version) at 127.0.0.1:$port (data in $PG_TEST_DIR)"
}

# A CA (ca.pem) and a server certificate for DNS:localhost only (server.pem, server.key) in $1.
make_test_postgres_certs() {
  local dir=$1
  if ! command -v openssl >/dev/null 2>&1; then
    echo "ci: installing the openssl CLI for the PostgreSQL TLS tests"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openssl >/dev/null
  fi
  (
    cd "$dir" &&
      openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 \
        -subj "/CN=planbot test PostgreSQL CA" \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" &&
      openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj "/CN=localhost" &&
      printf 'subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' >ext.cnf &&
      openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem \
        -days 2 -extfile ext.cnf &&
      chmod 0600 server.key ca.key && chmod 0644 ca.pem
  ) >"$dir/openssl.log" 2>&1 || { cat "$dir/openssl.log" >&2; return 1; }
}

stop_test_postgres() {
  if [ -n "${PG_TEST_DIR:-}" ] && [ -d "$PG_TEST_DIR" ]; then
    "${PG_TEST_STOP[@]}" >/dev/null 2>&1 || true
    rm -rf "$PG_TEST_DIR"
  fi
}
