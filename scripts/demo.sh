#!/usr/bin/env bash
# Sets up, builds and runs the main job: `l2arc bench` on its embedded
# default (a generated dataset on an emulated HDD, cache against no cache).
# Extra arguments go to `l2arc bench`. Installs only what the demo needs
# (a C compiler, pkg-config, Rust): the test tools come with scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release --locked -p l2arc-cli -p l2arc-bench
exec target/release/l2arc bench "$@"
