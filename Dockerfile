# syntax=docker/dockerfile:1
# planbot's container image: the planbot binary (stripped), git, CA certificates and a pinned
# OpenTofu, for linux/amd64 and linux/arm64, running as an unprivileged user with its state in
# the /var/lib/planbot volume.
#
#   docker build -t planbot .
#   docker buildx build --platform linux/amd64,linux/arm64 -t planbot .
#   buildah build --platform linux/amd64,linux/arm64 --manifest planbot .
#
# planbot is compiled on the build machine for the target architecture (no emulation), with
# Cargo's `dist` profile (optimised, symbols stripped: about a fifth of the release build's
# size), its relative relocations packed (DT_RELR: 28 KB instead of 2 MB read at every start;
# glibc 2.36 or later runs it, as this image's Debian has). OpenTofu TOFU_VERSION is installed
# by scripts/install-tofu.sh, which refuses an archive whose SHA-256 is not the one
# scripts/tofu.sha256sums lists for that architecture (amd64 only so far: an arm64 build stops
# until its line is added; docs/install.md).
#
# Run it with the config at /etc/planbot/planbot.toml (deploy/planbot.toml) and each secret as a
# file in $CREDENTIALS_DIRECTORY (default /run/secrets, where Docker and Compose put secrets).
# See docs/install.md, "Container image".

ARG RUST_VERSION=1.95
ARG DEBIAN_RELEASE=bookworm

# --- planbot, built from this source tree for the target architecture -------------------------
FROM --platform=$BUILDPLATFORM rust:${RUST_VERSION}-${DEBIAN_RELEASE} AS build
ARG TARGETARCH
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# The target's Rust triple and, when it is not the build machine's, Debian's cross linker.
# hadolint ignore=DL3008
RUN arch="${TARGETARCH:-$(dpkg --print-architecture)}" \
 && case "$arch" in \
      amd64) triple=x86_64-unknown-linux-gnu; gnu=x86_64-linux-gnu ;; \
      arm64) triple=aarch64-unknown-linux-gnu; gnu=aarch64-linux-gnu ;; \
      *) echo "planbot's image is built for amd64 and arm64, not $arch" >&2; exit 1 ;; \
    esac \
 && echo "$triple" > /rust-target \
 && if [ "$arch" != "$(dpkg --print-architecture)" ]; then \
      apt-get update \
      && apt-get install -y --no-install-recommends "gcc-${gnu//_/-}" "libc6-dev-${arch}-cross" \
      && rm -rf /var/lib/apt/lists/* \
      && rustup target add "$triple" \
      && printf '[target.%s]\nlinker = "%s-gcc"\n' "$triple" "$gnu" >> "$CARGO_HOME/config.toml" \
      && echo "CC_${triple//-/_}=${gnu}-gcc" > /rust-cc; \
    fi
WORKDIR /src
COPY . .
RUN triple="$(cat /rust-target)" \
 && if [ -f /rust-cc ]; then export "$(cat /rust-cc)"; fi \
 && RUSTFLAGS="-C link-arg=-Wl,-z,pack-relative-relocs" \
    cargo build --profile dist --locked --bin planbot --target "$triple" \
 && install -m 0755 "target/$triple/dist/planbot" /usr/local/bin/planbot

# --- OpenTofu for the target architecture, checked against the pinned checksum ----------------
FROM --platform=$BUILDPLATFORM debian:${DEBIAN_RELEASE}-slim AS tofu
ARG TARGETARCH
ARG TOFU_VERSION=1.10.6
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/*
COPY scripts/install-tofu.sh scripts/tofu.sha256sums /tmp/tofu/
RUN /tmp/tofu/install-tofu.sh "${TOFU_VERSION}" /usr/local/bin "${TARGETARCH:-$(dpkg --print-architecture)}"

# --- the runtime image ------------------------------------------------------------------------
FROM debian:${DEBIAN_RELEASE}-slim
ARG TOFU_VERSION=1.10.6
LABEL org.opencontainers.image.title="planbot" \
      org.opencontainers.image.description="Review-before-apply for OpenTofu on GitLab, with Proxmox awareness" \
      org.opencontainers.image.licenses="Apache-2.0" \
      io.planbot.tofu-version="${TOFU_VERSION}"
# git clones the merge requests; curl answers the HEALTHCHECK; tini reaps the engine's
# orphaned provider processes (planbot is not PID 1).
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl git tini \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 planbot \
 && useradd --system --uid 10001 --gid planbot --home-dir /var/lib/planbot \
      --shell /usr/sbin/nologin planbot \
 && install -d -o planbot -g planbot -m 0700 /var/lib/planbot \
 && install -d -m 0755 /etc/planbot
COPY --from=tofu /usr/local/bin/tofu /usr/local/bin/tofu
COPY --from=build /usr/local/bin/planbot /usr/local/bin/planbot
ENV CREDENTIALS_DIRECTORY=/run/secrets \
    RUST_LOG=info
USER 10001:10001
WORKDIR /var/lib/planbot
VOLUME ["/var/lib/planbot"]
EXPOSE 8080
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
  CMD ["curl", "-fsS", "-o", "/dev/null", "http://127.0.0.1:8080/healthz"]
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/planbot"]
CMD ["serve", "--config", "/etc/planbot/planbot.toml"]
