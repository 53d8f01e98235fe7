# syntax=docker/dockerfile:1
# planbot's container image: the planbot binary, git, CA certificates and a pinned OpenTofu,
# running as an unprivileged user with its state in the /var/lib/planbot volume.
#
#   docker build -t planbot .
#   docker build --build-arg TOFU_VERSION=1.10.6 --build-arg TOFU_SHA256=<sha256> -t planbot .
#
# TOFU_SHA256 is the SHA-256 of tofu_<version>_linux_amd64.tar.gz as listed in the release's
# tofu_<version>_SHA256SUMS (https://github.com/opentofu/opentofu/releases). The build stops
# when the download does not match it.
#
# Run it with the config at /etc/planbot/planbot.toml and each secret as a file in
# $CREDENTIALS_DIRECTORY (default /run/secrets, where Docker and Compose put secrets): a
# relative `<key>_file` path in the config names a file there. See the README, "Install".

ARG RUST_VERSION=1.95
ARG DEBIAN_RELEASE=bookworm

# --- planbot, built from this source tree -----------------------------------------------------
FROM rust:${RUST_VERSION}-${DEBIAN_RELEASE} AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin planbot \
 && install -m 0755 target/release/planbot /usr/local/bin/planbot

# --- OpenTofu, downloaded and checked against the pinned checksum ------------------------------
FROM debian:${DEBIAN_RELEASE}-slim AS tofu
ARG TOFU_VERSION=1.10.6
ARG TOFU_SHA256=b6b46b4fd8dd0b96e624f2a2d5fbc4efae2fc0174529b37292775c847c2e7d2c
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /tmp/tofu
RUN curl -fsSL -o tofu.tar.gz \
      "https://github.com/opentofu/opentofu/releases/download/v${TOFU_VERSION}/tofu_${TOFU_VERSION}_linux_amd64.tar.gz" \
 && echo "${TOFU_SHA256}  tofu.tar.gz" | sha256sum --check --strict - \
 && tar -xzf tofu.tar.gz tofu \
 && install -m 0755 tofu /usr/local/bin/tofu \
 && /usr/local/bin/tofu version

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
