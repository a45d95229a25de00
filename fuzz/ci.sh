#!/usr/bin/env bash
# Runs every fuzz target for SECONDS (default 15) each, as .ci/run does after the tests, on
# the stable toolchain: the targets and kiln's library get libFuzzer's coverage
# instrumentation through fuzz/instrument, the dependencies are the test build's own
# artifacts. No sanitizer (that needs nightly and a full rebuild: bench/fuzz.sh runs the long
# ASan campaign). A crash fails the run, prints the input as base64, and leaves it in
# fuzz/artifacts/TARGET/: fix it and copy it into fuzz/seeds/TARGET/, which the test suite
# replays (src/fuzzing.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-15}"
RUSTC_WRAPPER="$PWD/fuzz/instrument" cargo build --quiet -p kiln-fuzz --bins
bin="$(cargo metadata --format-version 1 --no-deps | jq -r .target_directory)/debug"
for seeds in fuzz/seeds/*/; do
  target="$(basename "$seeds")"
  corpus="$(mktemp -d)"
  log="$(mktemp)"
  mkdir -p "fuzz/artifacts/$target"
  if ! "$bin/$target" "$corpus" "$seeds" -max_total_time="$seconds" -timeout=10 \
      -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="fuzz/artifacts/$target/" \
      > "$log" 2>&1; then
    tail -40 "$log"
    for input in "fuzz/artifacts/$target"/*; do
      [ -f "$input" ] && echo "fuzz: $target input $input (base64): $(base64 -w0 "$input")"
    done
    echo "fuzz: $target FAILED"
    exit 1
  fi
  # An uninstrumented binary (built without the wrapper) would fuzz blind and pass.
  if ! grep -qE 'Loaded [0-9]+ modules +\([1-9][0-9]* inline 8-bit counters' "$log"; then
    tail -20 "$log"
    echo "fuzz: $target is not instrumented for coverage (see fuzz/instrument)"
    exit 1
  fi
  execs="$(grep -o 'number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')"
  echo "fuzz: $target: $execs executions in ${seconds}s, no crash"
  rm -rf "$corpus" "$log"
done
