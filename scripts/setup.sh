#!/usr/bin/env bash
# Installs what l2arc needs to build and test on a fresh Debian machine.
# Idempotent: installs only what is missing. Used by scripts/demo.sh,
# scripts/test.sh and (through test.sh) CI.
set -euo pipefail

# Debian packages the build and the tests use.
PACKAGES=(
  build-essential # cc and linker for crates with C parts (zstd-sys)
  pkg-config
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
)

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
  echo "setup: cargo not found; installing Rust with rustup" >&2
  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal -c rustfmt,clippy
  export PATH="$HOME/.cargo/bin:$PATH"
fi
need="1.91.0"
have=$(rustc --version | awk '{print $2}')
if [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -n1)" != "$need" ]; then
  echo "setup: rustc $have is older than $need; run 'rustup update stable'" >&2
  exit 1
fi
for component in rustfmt clippy; do
  if ! cargo "${component/rustfmt/fmt}" --version >/dev/null 2>&1; then
    command -v rustup >/dev/null 2>&1 && rustup component add "$component"
  fi
done

# pjdfstest (the Rust port of the POSIX file-system test suite) checks the
# FUSE mount against its source in the test suite.
PJDFSTEST_VERSION="0.2.2"
if ! "$HOME/.cargo/bin/pjdfstest" -V 2>/dev/null | grep -q "$PJDFSTEST_VERSION"; then
  echo "setup: installing pjdfstest $PJDFSTEST_VERSION with cargo" >&2
  cargo install --quiet --locked pjdfstest --version "$PJDFSTEST_VERSION"
fi

# Playwright for Python drives the system Chromium in the live page's test
# (crates/l2arc-cli/tests/browser.rs). It lives in a virtual environment in
# the repository's ignored .tools/ (Debian's Python refuses system-wide pip
# installs); no browser is downloaded (the test passes Chromium's path).
PLAYWRIGHT_VERSION="1.65.2"
VENV="$(cd "$(dirname "$0")/.." && pwd)/.tools/venv"
if ! "$VENV/bin/python" -c "import playwright, sys; from importlib.metadata import version; sys.exit(version('playwright') != '$PLAYWRIGHT_VERSION')" 2>/dev/null; then
  echo "setup: installing Playwright $PLAYWRIGHT_VERSION for Python in $VENV" >&2
  /usr/bin/python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "playwright==$PLAYWRIGHT_VERSION"
fi

# versitygw: a real S3 server over a local directory, started by the
# object-store tests and the s3 benchmark (l2arc-testkit). Built from its Go
# module into $HOME/go/bin, where the tests look for it.
if [ ! -x "$HOME/go/bin/versitygw" ]; then
  GO=/usr/local/go/bin/go
  [ -x "$GO" ] || GO=go
  echo "setup: installing versitygw with $GO install" >&2
  GOBIN="$HOME/go/bin" "$GO" install github.com/versity/versitygw/cmd/versitygw@latest
fi
