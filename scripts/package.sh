#!/usr/bin/env bash
# Builds the Debian package with cargo-deb: target/debian/l2arc_*.deb holds
# the release binary (debug info stripped into l2arc-dbgsym_*.ddeb beside
# it) and the same files as scripts/install.sh /usr: man pages,
# completions, systemd units, example settings (in /etc/l2arc, conffiles).
#
#   scripts/package.sh                      release build, then the package
#   scripts/package.sh --no-build --profile dev
#                                           package the binary already built
#                                           by that profile (the package test)
#
# Extra arguments go to cargo-deb. Prints the path of the .deb last.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
build=1
profile=release
args=()
while (($#)); do
  case "$1" in
    --no-build) build=0 ;;
    --profile)
      profile="$2"
      args+=("$1")
      shift
      args+=("$1")
      ;;
    *) args+=("$1") ;;
  esac
  shift
done
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
cargo deb --version >/dev/null 2>&1 || scripts/setup.sh package
target="${CARGO_TARGET_DIR:-$ROOT/target}"
profile_dir="$profile"
[ "$profile" = dev ] && profile_dir=debug
((build)) && cargo build --locked --profile "$profile" -p l2arc-cli
bin="$target/$profile_dir/l2arc"

# The tree install.sh lays out for /usr, staged where the package's assets
# name it (crates/l2arc-cli/Cargo.toml).
stage="$target/$profile_dir/deb-root"
rm -rf "$stage"
DESTDIR="$stage" L2ARC_BIN="$bin" scripts/install.sh /usr >/dev/null

out="$target/debian"
mkdir -p "$out"
rm -f "$out"/l2arc_*.deb "$out"/l2arc-dbgsym_*.ddeb
cargo deb -p l2arc-cli --no-build --dbgsym --compress-debug-symbols=zstd --output "$out" "${args[@]}" >&2
deb="$(ls "$out"/l2arc_*.deb)"
echo "package: $(dpkg-deb -f "$deb" Installed-Size) KiB installed, $(du -k "$deb" | cut -f1) KiB .deb" >&2
echo "$deb"
