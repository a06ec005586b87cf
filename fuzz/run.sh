#!/usr/bin/env bash
# Builds and runs the fuzz targets of fuzz/ (see docs/fuzzing.md).
#
#   fuzz/run.sh build                 build every target
#   fuzz/run.sh replay   [TARGET...]  run each target over its corpus
#                                     (-runs=0), then fuzz it for
#                                     FUZZ_SECONDS (5) seconds; what `make
#                                     test` runs
#   fuzz/run.sh campaign [TARGET...]  fuzz each target for FUZZ_RUNS
#                                     (10,000,000) executions, merge what it
#                                     found into its corpus, and write the
#                                     figures into docs/fuzzing.md
#   fuzz/run.sh list                  the targets
#
# Settings (environment): FUZZ_SECONDS, FUZZ_RUNS, FUZZ_JOBS (targets run at
# once in a campaign, 1), FUZZ_SANITIZER (address; `none` is about twice as
# fast but finds no memory error in unsafe code), FUZZ_TIMEOUT (seconds one
# input may take, 5), FUZZ_RSS_MB (2048), FUZZ_MALLOC_MB (the largest single
# allocation, 256), FUZZ_TARGET_DIR (the build directory; ~/.cache/oncepay-fuzz-target).
#
# cargo-fuzz needs nightly flags (-Z, the sanitizer); the stable toolchain
# takes them with RUSTC_BOOTSTRAP=1, set here for the fuzz build only. The
# build is a release build with debug assertions and overflow checks (-O
# -a), under FUZZ_TARGET_DIR.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
FUZZ="$ROOT/fuzz"
cd "$ROOT"

ALL_TARGETS=(json_reader query_string idempotency_key stripe_signature standard_webhooks provider_event wire)
FUZZ_SECONDS="${FUZZ_SECONDS:-5}"
FUZZ_RUNS="${FUZZ_RUNS:-10000000}"
FUZZ_JOBS="${FUZZ_JOBS:-1}"
FUZZ_SANITIZER="${FUZZ_SANITIZER:-none}"
FUZZ_TIMEOUT="${FUZZ_TIMEOUT:-5}"
FUZZ_RSS_MB="${FUZZ_RSS_MB:-2048}"
FUZZ_MALLOC_MB="${FUZZ_MALLOC_MB:-256}"
export RUSTC_BOOTSTRAP=1
BUILD_FLAGS=(--release --debug-assertions --sanitizer "$FUZZ_SANITIZER")
# The build directory is kept outside the clone by default, so that fresh
# clones on one machine (CI's) share the instrumented build of every
# dependency (about 11 minutes on 2 cores from nothing; cargo rebuilds what
# changed, as in any target directory).
FUZZ_TARGET_DIR="${FUZZ_TARGET_DIR:-${HOME:-/root}/.cache/oncepay-fuzz-target}"
BUILD_FLAGS+=(--target-dir "$FUZZ_TARGET_DIR")
DOC="$ROOT/docs/fuzzing.md"
LOGS="$FUZZ/target/campaign"

# The largest input each target is given while fuzzing (bodies are larger
# than headers; JSON needs room for 129 levels and long numbers).
max_len() {
  case "$1" in
    json_reader | provider_event) echo 16384 ;;
    *) echo 4096 ;;
  esac
}

# Time and memory bounds: an input slower than FUZZ_TIMEOUT seconds, a
# process above FUZZ_RSS_MB or one allocation above FUZZ_MALLOC_MB is a
# failure like a panic.
limits() {
  echo "-timeout=$FUZZ_TIMEOUT -rss_limit_mb=$FUZZ_RSS_MB -malloc_limit_mb=$FUZZ_MALLOC_MB"
}

fuzzing_flags() {
  echo "$(limits) -max_len=$(max_len "$1") -dict=$FUZZ/dicts/$1.dict -print_final_stats=1"
}

check_target() {
  local t
  for t in "${ALL_TARGETS[@]}"; do [ "$t" = "$1" ] && return 0; done
  echo "fuzz/run.sh: no target $1 (targets: ${ALL_TARGETS[*]})" >&2
  exit 2
}

ensure_tools() {
  if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "== installing cargo-fuzz"
    cargo install cargo-fuzz --locked
  fi
  # The fuzz crate is a workspace of its own: its lock file starts as the
  # service's, so both build the same versions of what they share.
  if [ ! -f "$FUZZ/Cargo.lock" ]; then
    cp "$ROOT/Cargo.lock" "$FUZZ/Cargo.lock"
  fi
}

build() {
  ensure_tools
  echo "== building the fuzz targets (cargo fuzz build ${BUILD_FLAGS[*]})"
  cargo fuzz build "${BUILD_FLAGS[@]}"
}

# fuzz_run TARGET CORPUS_DIR... -- LIBFUZZER_FLAGS...
fuzz_run() {
  local target="$1"
  shift
  cargo fuzz run "${BUILD_FLAGS[@]}" "$target" "$@"
}

replay() {
  local targets=("$@") failed=() t tmp
  build
  for t in "${targets[@]}"; do
    mkdir -p "$FUZZ/corpus/$t"
    echo "== $t: the corpus ($(find "$FUZZ/corpus/$t" -type f | wc -l) inputs)"
    # shellcheck disable=SC2046
    if ! fuzz_run "$t" "$FUZZ/corpus/$t" -- -runs=0 $(limits); then
      failed+=("$t (corpus)")
      continue
    fi
    echo "== $t: fuzzing for ${FUZZ_SECONDS}s"
    # New inputs go to a scratch directory (the first one), not into the
    # corpus kept in the repository.
    tmp="$(mktemp -d)"
    # shellcheck disable=SC2046
    if ! fuzz_run "$t" "$tmp" "$FUZZ/corpus/$t" -- -max_total_time="$FUZZ_SECONDS" $(fuzzing_flags "$t"); then
      failed+=("$t (fuzzing)")
    fi
    rm -rf "$tmp"
  done
  if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz: FAILED: ${failed[*]}; the inputs are under fuzz/artifacts/ (see docs/fuzzing.md, 'When a target fails')" >&2
    return 1
  fi
  echo "fuzz: ${#targets[@]} targets replayed their corpus and fuzzed ${FUZZ_SECONDS}s each, no failure"
}

# figure LOG NAME: libFuzzer's final `stat::NAME: value` (-print_final_stats=1).
figure() {
  grep -E "^stat::$2:" "$1" | tail -n 1 | awk '{print $2}'
}

# One target's campaign; its figures go to $LOGS/$t.row.
campaign_one() {
  local t="$1" new log status=ok
  mkdir -p "$FUZZ/corpus/$t" "$LOGS"
  new="$(mktemp -d "$FUZZ/target/campaign-new-$t-XXXX")"
  log="$LOGS/$t.log"
  echo "== $t: $FUZZ_RUNS executions (log: ${log#"$ROOT"/})"
  # shellcheck disable=SC2046
  if ! fuzz_run "$t" "$new" "$FUZZ/corpus/$t" -- -runs="$FUZZ_RUNS" $(fuzzing_flags "$t") >"$log" 2>&1; then
    status="FAILED: $(grep -oE 'artifacts/[^ ]+' "$log" | tail -n 1 || true)"
  fi
  # What it found, merged into the corpus: only inputs that add coverage.
  local before after
  before="$(find "$FUZZ/corpus/$t" -type f | wc -l)"
  # shellcheck disable=SC2046
  fuzz_run "$t" "$FUZZ/corpus/$t" "$new" -- -merge=1 $(limits) >"$LOGS/$t.merge.log" 2>&1 ||
    status="$status; merge failed (see ${LOGS#"$ROOT"/}/$t.merge.log)"
  after="$(find "$FUZZ/corpus/$t" -type f | wc -l)"
  rm -rf "$new"
  local execs rate secs slowest rss added done_line cov ft
  execs="$(figure "$log" number_of_executed_units)"
  rate="$(figure "$log" average_exec_per_sec)"
  added="$(figure "$log" new_units_added)"
  slowest="$(figure "$log" slowest_unit_time_sec)"
  rss="$(figure "$log" peak_rss_mb)"
  secs="$(grep -oE '^Done [0-9]+ runs in [0-9]+ second' "$log" | awk '{print $5}' | tail -n 1)"
  done_line="$(grep -E '^#[0-9]+' "$log" | tail -n 1)"
  cov="$(grep -oE 'cov: [0-9]+' <<<"$done_line" | awk '{print $2}')"
  ft="$(grep -oE 'ft: [0-9]+' <<<"$done_line" | awk '{print $2}')"
  printf '| %s | %s | %s | %s | %s | %s | %s → %s | %s | %s | %s | %s |\n' \
    "$t" "${execs:-?}" "${rate:-?}" "${secs:-?}" "${cov:-?}" "${ft:-?}" "$before" "$after" \
    "${added:-?}" "${slowest:-?}" "${rss:-?}" "$status" >"$LOGS/$t.row"
  cat "$LOGS/$t.row"
}

campaign() {
  local targets=("$@") t rows
  build
  mkdir -p "$LOGS"
  rm -f "$LOGS"/*.row
  if [ "$FUZZ_JOBS" -gt 1 ]; then
    printf '%s\n' "${targets[@]}" | xargs -P "$FUZZ_JOBS" -I{} "$FUZZ/run.sh" campaign-one {}
  else
    for t in "${targets[@]}"; do campaign_one "$t"; done
  fi
  rows="$(mktemp)"
  {
    echo "Campaign of $(date -u +%Y-%m-%d) on $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet || echo ' (with uncommitted changes)'), $(rustc --version | awk '{print $1, $2}'), $(cargo fuzz --version), $(nproc) cores, $FUZZ_JOBS target(s) at a time; flags: \`cargo fuzz run ${BUILD_FLAGS[*]}\`, \`-runs=$FUZZ_RUNS $(limits)\`, a dictionary per target."
    echo
    echo "| target | executions | exec/s | seconds | cov | ft | corpus files (before → after merge) | new units | slowest input (s) | peak RSS (MB) | result |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    for t in "${targets[@]}"; do cat "$LOGS/$t.row" 2>/dev/null || echo "| $t | | | | | | | | | | did not run |"; done
  } >"$rows"
  # The table between the markers of docs/fuzzing.md is replaced.
  awk -v rows="$rows" '
    /<!-- campaign-figures:begin -->/ { print; while ((getline line < rows) > 0) print line; skip = 1; next }
    /<!-- campaign-figures:end -->/ { skip = 0 }
    !skip { print }
  ' "$DOC" >"$DOC.new" && mv "$DOC.new" "$DOC"
  echo
  cat "$rows"
  rm -f "$rows"
  echo
  echo "figures written to docs/fuzzing.md; new corpus inputs are in fuzz/corpus/ (commit both)"
  if grep -q FAILED "$LOGS"/*.row 2>/dev/null; then
    echo "fuzz: a target FAILED; each failing input must become a #[test] (docs/fuzzing.md, 'When a target fails')" >&2
    return 1
  fi
}

cmd="${1:-}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then targets=("${ALL_TARGETS[@]}"); fi
for t in "${targets[@]}"; do [ "$cmd" = list ] || check_target "$t"; done
case "$cmd" in
  build) build ;;
  replay) replay "${targets[@]}" ;;
  campaign) campaign "${targets[@]}" ;;
  campaign-one) mkdir -p "$LOGS" && campaign_one "${targets[0]}" ;;
  list) printf '%s\n' "${ALL_TARGETS[@]}" ;;
  *)
    sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
