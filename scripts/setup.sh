#!/usr/bin/env bash
# Installs what l2arc needs on a fresh Debian machine, in three sets, so
# that each command waits only for what it uses:
#
#   scripts/setup.sh build    build and run the demo (scripts/demo.sh): a C
#                             compiler, pkg-config and Rust
#   scripts/setup.sh package  build, plus cargo-deb (scripts/package.sh)
#   scripts/setup.sh [test]   all of the above, plus every tool the test
#                             suite drives (scripts/test.sh, and so CI)
#
# Idempotent: installs only what is missing. Every tool fetched outside
# Debian is pinned to a version (Debian's own packages are those of the
# release the machine runs).
set -euo pipefail
what="${1:-test}"
case "$what" in
  build | package | test) ;;
  *)
    echo "setup: unknown set '$what': build, package or test" >&2
    exit 2
    ;;
esac
ROOT="$(cd "$(dirname "$0")/.." && pwd)"

# Versions of the tools installed from outside Debian.
RUST_VERSION="1.95.0"        # only when no cargo is found (rustup)
CARGO_DEB_VERSION="3.8.0"    # scripts/package.sh and the package test
PJDFSTEST_VERSION="0.2.2"
PLAYWRIGHT_VERSION="1.65.2"
VERSITYGW_VERSION="v1.8.0"

# Debian packages: to build.
PACKAGES=(
  build-essential # cc and linker for crates with C parts (zstd-sys)
  pkg-config
)
# ... and to test.
TEST_PACKAGES=(
  zstd            # inspecting the reference traces by hand
  util-linux      # losetup: the block-device tests attach loop devices
  fio             # l2arc bench --scenario l2-hit measures the cache device with fio; NBD and FUSE tests
  fuse3           # fusermount3: l2arc mount
  nbdkit          # the NBD peer in the side-by-side benchmark
  libnbd-bin      # nbdcopy, nbdinfo: NBD front-end tests
  qemu-utils      # qemu-io, qemu-img: NBD front-end tests
  prometheus      # promtool: the analytics tests check /metrics with `promtool check metrics`
  chromium        # the live page's test runs it headless (through Playwright, below)
  python3-venv    # the Python environment for Playwright
  rclone          # the rclone mount peer in l2arc bench --scenario s3
  man-db          # man --warnings: the packaging test renders every man page
  groff           # ... with groff's full set of devices
  systemd         # systemd-analyze verify: the packaging test checks the units
  dpkg            # dpkg-deb -x: the packaging test unpacks the .deb
  zsh             # zsh -n: the packaging test checks the zsh completions
  fish            # fish --no-execute: ... and the fish completions
)
[ "$what" = test ] && PACKAGES+=("${TEST_PACKAGES[@]}")

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Rust: edition 2024 needs a recent stable toolchain (Debian's rustc is too old).
if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
  export PATH="$HOME/.cargo/bin:$PATH"
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "setup: cargo not found; installing Rust $RUST_VERSION with rustup" >&2
  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs |
    sh -s -- -y --profile minimal --default-toolchain "$RUST_VERSION" -c rustfmt,clippy
  export PATH="$HOME/.cargo/bin:$PATH"
fi
need="1.91.0"
have=$(rustc --version | awk '{print $2}')
if [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -n1)" != "$need" ]; then
  echo "setup: rustc $have is older than $need; run 'rustup update stable'" >&2
  exit 1
fi
[ "$what" = build ] && exit 0

# cargo-deb builds the Debian package (scripts/package.sh; the package test).
if ! cargo deb --version 2>/dev/null | grep -qF "$CARGO_DEB_VERSION"; then
  echo "setup: installing cargo-deb $CARGO_DEB_VERSION with cargo" >&2
  cargo install --quiet --locked cargo-deb --version "$CARGO_DEB_VERSION"
fi
[ "$what" = package ] && exit 0

for component in rustfmt clippy; do
  if ! cargo "${component/rustfmt/fmt}" --version >/dev/null 2>&1; then
    command -v rustup >/dev/null 2>&1 && rustup component add "$component"
  fi
done

# pjdfstest (the Rust port of the POSIX file-system test suite) checks the
# FUSE mount against its source in the test suite.
if ! "$HOME/.cargo/bin/pjdfstest" -V 2>/dev/null | grep -q "$PJDFSTEST_VERSION"; then
  echo "setup: installing pjdfstest $PJDFSTEST_VERSION with cargo" >&2
  cargo install --quiet --locked pjdfstest --version "$PJDFSTEST_VERSION"
fi

# Playwright for Python drives the system Chromium in the live page's test
# (crates/l2arc-cli/tests/browser.rs). It lives in a virtual environment in
# the repository's ignored .tools/ (Debian's Python refuses system-wide pip
# installs); no browser is downloaded (the test passes Chromium's path).
VENV="$ROOT/.tools/venv"
if ! "$VENV/bin/python" -c "import playwright, sys; from importlib.metadata import version; sys.exit(version('playwright') != '$PLAYWRIGHT_VERSION')" 2>/dev/null; then
  echo "setup: installing Playwright $PLAYWRIGHT_VERSION for Python in $VENV" >&2
  /usr/bin/python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "playwright==$PLAYWRIGHT_VERSION"
fi

# versitygw: a real S3 server over a local directory, started by the
# object-store tests and the s3 benchmark (l2arc-testkit). Built from its Go
# module into $HOME/go/bin, where the tests look for it.
GO=/usr/local/go/bin/go
[ -x "$GO" ] || GO=go
if ! "$GO" version -m "$HOME/go/bin/versitygw" 2>/dev/null |
  grep -qE "^[[:space:]]+mod[[:space:]]+github.com/versity/versitygw[[:space:]]+$VERSITYGW_VERSION[[:space:]]"; then
  echo "setup: installing versitygw $VERSITYGW_VERSION with $GO install" >&2
  GOBIN="$HOME/go/bin" "$GO" install "github.com/versity/versitygw/cmd/versitygw@$VERSITYGW_VERSION"
fi
