#!/usr/bin/env bash
# planbot's fuzz targets (docs/development.md, "Fuzzing"): `cargo fuzz` (libFuzzer) on nightly.
# The properties each target checks are `planbot::core::fuzzing`; `cargo test --lib fuzzing`
# replays the committed corpora and crash fixtures on stable.
#
#   scripts/fuzz.sh TARGET SECONDS [LIBFUZZER_ARG...]   run one target for SECONDS (one job), then
#                                                       merge what it found into fuzz/corpus/TARGET
#   scripts/fuzz.sh all SECONDS                          every target in turn, SECONDS each
#   scripts/fuzz.sh list                                 the targets
#   scripts/fuzz.sh seed                                 seed fuzz/corpus/* from the fixtures
#   scripts/fuzz.sh trim TARGET KIB                      shrink fuzz/corpus/TARGET: the inputs
#                                                       that cover an edge no other covers
#                                                       (libFuzzer's merge), smallest first, up
#                                                       to KIB KiB (its seed-* files are kept)
#   scripts/fuzz.sh keep TARGET FILE NAME                a crash as the replayed fixture
#                                                       tests/fixtures/fuzz/TARGET/NAME
#   scripts/fuzz.sh add NAME                             the fuzz target file and [[bin]] of a new
#                                                       check `planbot::core::fuzzing::NAME`
#
# Needs the nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz --locked`). A crash
# stops the run and leaves its input in fuzz/artifacts/TARGET/; reproduce it with
# `cargo +nightly fuzz run TARGET FILE`. FUZZ_TOOLCHAIN=nightly-2026-… picks another nightly.
set -euo pipefail
cd "$(dirname "$0")/.."

toolchain="${FUZZ_TOOLCHAIN:-nightly}"
# No sanitizer (planbot is safe Rust; twice the cases per second), with debug assertions
# (integer overflow panics). FUZZ_BUILD_FLAGS="" builds with AddressSanitizer instead.
build_flags="${FUZZ_BUILD_FLAGS--s none -a}"
targets() { sed -n 's/^name = "\([a-z_]*\)"$/\1/p' fuzz/Cargo.toml | grep -v '^planbot-fuzz$'; }

usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

# Fixture directories read as corpora too (not copied into fuzz/corpus).
fixture_corpora() { case "$1" in plan_note) echo tests/fixtures/plans tests/fixtures/plans/bpg ;; esac; }

# Inputs larger than this are not tried (the largest plan fixture is ~14 KB).
max_len() { case "$1" in plan_note) echo 16384 ;; *) echo 4096 ;; esac; }

run() {
  local target="$1" seconds="$2"; shift 2
  targets | grep -qx "$target" || { echo "fuzz: no target $target (scripts/fuzz.sh list)" >&2; exit 2; }
  local corpus="fuzz/corpus/$target" scratch="fuzz/target/scratch/$target"
  mkdir -p "$corpus" "$scratch"
  # New inputs go to the scratch directory; the committed corpus only gets what adds coverage.
  # shellcheck disable=SC2046
  cargo "+$toolchain" fuzz run $build_flags --jobs 1 "$target" "$scratch" "$corpus" $(fixture_corpora "$target") -- \
    -max_total_time="$seconds" -max_len="$(max_len "$target")" -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 "$@"
  cargo "+$toolchain" fuzz run $build_flags "$target" "$corpus" "$scratch" -- -merge=1 \
    -max_len="$(max_len "$target")" 2>&1 | grep -E '^MERGE-OUTER: [0-9]+ new files' || true
}

# Seeds: the repository's fixtures, as each target reads its input.
seed() {
  local d
  # webhook: the documented headers of each payload (the token as configured), then the body.
  d=fuzz/corpus/webhook; mkdir -p "$d"
  for h in tests/fixtures/gitlab/webhooks/*.headers.txt; do
    local body="${h%.headers.txt}.json" name
    name=$(basename "$body" .json)
    { grep -E '^(X-Gitlab-Event|X-Gitlab-Token):' "$h" | sed 's/\[REDACTED\]/hook-secret/'
      printf '\n'; cat "$body"; } > "$d/seed-$name"
  done
  # … and one signed the Standard Webhooks way (`core::fuzzing::WEBHOOK_SIGNING_KEY`).
  local body=tests/fixtures/gitlab/webhooks/merge_request_update_oldrev.partial.json sig
  sig=$( { printf 'msg_1.1700000000.'; cat "$body"; } \
    | openssl dgst -sha256 -hmac planbot-fuzz-signing-key -binary | base64)
  { printf 'X-Gitlab-Event: Merge Request Hook\nwebhook-id: msg_1\nwebhook-timestamp: 1700000000\n'
    printf 'webhook-signature: v1,AAAA v1,%s\n\n' "$sig"; cat "$body"; } > "$d/seed-signed"
  # plan_note: the plan fixtures (`show -json`) are read where they are (fixture_corpora).
  # repo_config and service_config: every ```toml block of the docs, and the shipped configs.
  for t in repo_config service_config; do
    d="fuzz/corpus/$t"; mkdir -p "$d"
    for md in docs/*.md; do
      awk -v out="$d/seed-$(basename "$md" .md)" '
        /^```toml/ { n++; f = out "-" n; inside = 1; next }
        /^```/ && inside { inside = 0; close(f); next }
        inside { print > f }' "$md"
    done
  done
  cp deploy/planbot.toml fuzz/corpus/service_config/seed-deploy-planbot
  cp deploy/planbot.example.toml fuzz/corpus/service_config/seed-deploy-example
  # defuse and markdown: texts planbot posts (the note snapshots) and hostile values.
  for t in defuse markdown; do
    d="fuzz/corpus/$t"; mkdir -p "$d"
    local i=0
    for s in src/core/snapshots/*note*.snap tests/it/snapshots/*note*.snap; do
      [ -f "$s" ] || continue
      i=$((i + 1)); [ "$i" -le 8 ] || break
      cp "$s" "$d/seed-$(basename "$s" .snap)"
    done
    printf '/approve\n@all <!-- x\r/close\n```\n/label ~x\n```' > "$d/seed-hostile"
    printf 'a `b` ``c`d`` <!-- --> | \\| [x](javascript:alert) <b>&amp;</b>\n' > "$d/seed-values"
    printf '````\n```\n~~~\n\0\r\n' > "$d/seed-fences"
  done
  for t in $(targets); do echo "fuzz/corpus/$t: $(ls "fuzz/corpus/$t" | wc -l) files"; done
}

trim() {
  local target="$1" kib="$2" corpus="fuzz/corpus/$1" tmp="fuzz/target/trim/$1"
  rm -rf "$tmp"; mkdir -p "$tmp/min" "$tmp/all"
  cp "$corpus"/* "$tmp/all/"
  cargo "+$toolchain" fuzz run $build_flags "$target" "$tmp/min" "$tmp/all" -- -merge=1 \
    -use_counters=0 -max_len="$(max_len "$target")" 2>&1 | grep -E '^MERGE-OUTER: [0-9]+ new files' || true
  rm -f "$corpus"/*
  local budget=$((kib * 1024)) used=0 f size
  for f in $(ls -Sr "$tmp/min"); do
    size=$(stat -c %s "$tmp/min/$f")
    [ $((used + size)) -le "$budget" ] || break
    cp "$tmp/min/$f" "$corpus/"; used=$((used + size))
  done
  for f in "$tmp/all"/seed-*; do [ -f "$f" ] && cp "$f" "$corpus/"; done
  echo "fuzz/corpus/$target: $(ls "$corpus" | wc -l) files, $(du -sb "$corpus" | cut -f1) bytes"
}

keep() {
  local target="$1" file="$2" name="$3"
  mkdir -p "tests/fixtures/fuzz/$target"
  cp "$file" "tests/fixtures/fuzz/$target/$name"
  echo "tests/fixtures/fuzz/$target/$name: say what it was in tests/fixtures/fuzz/README.md"
}

add() {
  local name="$1"
  grep -q "^pub fn $name(data: &\[u8\])" src/core/fuzzing/mod.rs \
    || { echo "fuzz: write pub fn $name(data: &[u8]) in src/core/fuzzing/mod.rs first" >&2; exit 2; }
  cat > "fuzz/fuzz_targets/$name.rs" <<EOF
//! Fuzz target \`$name\`: the input and the properties are \`planbot::core::fuzzing::$name\`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| planbot::core::fuzzing::$name(data));
EOF
  printf '\n[[bin]]\nname = "%s"\npath = "fuzz_targets/%s.rs"\ntest = false\ndoc = false\nbench = false\n' \
    "$name" "$name" >> fuzz/Cargo.toml
  mkdir -p "fuzz/corpus/$name"
  echo "fuzz: added $name; list it in TARGETS (src/core/fuzzing/mod.rs) and give it seeds in fuzz/corpus/$name"
}

case "${1:-}" in
  ""|-h|--help) usage ;;
  list) targets ;;
  seed) seed ;;
  all) [ $# -eq 2 ] || usage; for t in $(targets); do run "$t" "$2"; done ;;
  keep) [ $# -eq 4 ] || usage; keep "$2" "$3" "$4" ;;
  trim) [ $# -eq 3 ] || usage; trim "$2" "$3" ;;
  add) [ $# -eq 2 ] || usage; add "$2" ;;
  *) [ $# -ge 2 ] || usage; run "$@" ;;
esac
