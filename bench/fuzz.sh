#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/ for SECONDS (default 60) each, starting from the
# committed seeds (fuzz/seeds/TARGET) and a scratch corpus (fuzz/corpus/TARGET, not
# committed), and prints the executions per target. A crash leaves its input in
# fuzz/artifacts/TARGET/: fix it and copy the input into fuzz/seeds/TARGET/, where the test
# suite replays it on every build (src/fuzzing.rs), stable toolchain and all.
# Needs the nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`).
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds="${1:-60}"
for target in $(cargo +nightly fuzz list); do
  mkdir -p "corpus/$target"
  log="$(mktemp)"
  if ! cargo +nightly fuzz run "$target" "corpus/$target" "seeds/$target" -- \
      -max_total_time="$seconds" -rss_limit_mb=4096 -print_final_stats=1 > "$log" 2>&1; then
    tail -40 "$log"
    echo "fuzz: $target FAILED (input in fuzz/artifacts/$target/)"
    exit 1
  fi
  execs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || true)"
  echo "fuzz: $target: ${execs:-?} executions in ${seconds}s"
  rm -f "$log"
done
