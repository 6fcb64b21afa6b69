#!/usr/bin/env bash
# Sets up, then runs every check: formatting, clippy with warnings as
# errors, and the whole test suite (unit, property, integration, the trace
# reproductions, the CLI end to end).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
[ -f ../shared/traces/OLTP.lis.zst ] || {
  echo "test: ../shared/traces is missing: the reference traces must sit beside the repository" >&2
  exit 1
}
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --locked --all-targets -- -D warnings
echo "== cargo test"
set +e
cargo test --locked --workspace --no-fail-fast 2>&1 | tee /tmp/l2arc-test.log.$$
status=${PIPESTATUS[0]}
set -e
passed=$(grep -Eo '[0-9]+ passed' /tmp/l2arc-test.log.$$ | awk '{s+=$1} END {print s+0}')
failed=$(grep -Eo '[0-9]+ failed' /tmp/l2arc-test.log.$$ | awk '{s+=$1} END {print s+0}')
rm -f /tmp/l2arc-test.log.$$
echo "tests: $passed passed, $failed failed"
[ "$status" -eq 0 ] && [ "$passed" -gt 0 ]
