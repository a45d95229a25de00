#!/usr/bin/env bash
# Soak: 200 kiln builds (KILN_SOAK_BUILDS), 4 at a time, pushed through a proxy that answers
# 20 % of registry requests 503, throttles with 429 + Retry-After and resets uploads midway;
# prints failures, broken tags, retries, faults and upload sessions left open in the registry.
# Not part of CI. Needs the Debian packages .ci/run installs (docker-registry).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo nextest run --test it --run-ignored only --no-capture \
  -E 'test(=registry_faults::soak_builds_through_the_flaky_proxy)'
