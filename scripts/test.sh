#!/usr/bin/env bash
# Sets up, then runs every check: formatting, clippy with warnings as
# errors, and the whole test suite (unit, property, integration, the trace
# reproductions, the CLI end to end).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh test
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
[ -f ../shared/traces/OLTP.lis.zst ] || {
  echo "test: ../shared/traces is missing: the reference traces must sit beside the repository" >&2
  exit 1
}
echo "== import circles in the engine"
scripts/import-cycles --self-test
scripts/import-cycles
echo "== assertions per function in the engine (scripts/assertion-count)"
scripts/assertion-count --self-test
scripts/assertion-count
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --locked --all-targets -- -D warnings
echo "== cargo test"
set +e
cargo test --locked --workspace --no-fail-fast 2>&1 | tee /tmp/l2arc-test.log.$$
status=${PIPESTATUS[0]}
# The flash integrity, crash and online suites once more through read
# queues (many reads in flight), with io_uring and with psync: both paths
# must return the same bytes under the same faults. `--workspace` with the
# targets named, not `-p l2arc`: the features cargo unifies are then the
# first run's, so nothing is compiled again (`-p` cost 85 s of rebuild).
for engine in io_uring psync; do
  echo "== cargo test: L2ARC suites through read queues, l2arc_ioengine=$engine"
  L2ARC_TEST_READ_PATH=queue L2ARC_TEST_IOENGINE=$engine \
    cargo test --locked --workspace --no-fail-fast \
    --test l2arc_integrity --test l2arc_crash --test l2arc_online --test l2arc_headers \
    2>&1 | tee -a /tmp/l2arc-test.log.$$
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
done
set -e
passed=$(grep -Eo '[0-9]+ passed' /tmp/l2arc-test.log.$$ | awk '{s+=$1} END {print s+0}')
failed=$(grep -Eo '[0-9]+ failed' /tmp/l2arc-test.log.$$ | awk '{s+=$1} END {print s+0}')
rm -f /tmp/l2arc-test.log.$$
echo "tests: $passed passed, $failed failed"
[ "$status" -eq 0 ] && [ "$passed" -gt 0 ]
