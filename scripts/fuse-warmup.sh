#!/usr/bin/env bash
# The seed workload's warm-up through the FUSE mount, from an empty cache:
# 4 files of 256 MiB (random bytes) on an emulated 4-spindle HDD (4-12 ms,
# 150 MiB/s), `--arc-max 128MiB`, a 2 GiB cache file, 128 KiB records; fio,
# 32 psync jobs of random 4 KiB buffered reads over the four files, IOPS
# logged every second, the page cache dropped first. Prints the IOPS and
# the primary reads per second, the warm rate (median of the seconds at
# half the best second or more), the first second at 90% of it, and that
# over one pass over the files from the disks (18.1 s: 8192 records at the
# mean service time, 4 spindles in parallel).
#
# Usage (as root, after `cargo build --release`):
#   scripts/fuse-warmup.sh [DATA_DIR] [SECONDS] [extra `l2arc mount` flags...]
# e.g. scripts/fuse-warmup.sh /var/tmp/fw 60 --store-whole-records false
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
l2arc="$root/target/release/l2arc"
data=${1:-/var/tmp/l2arc-fuse-warmup}
secs=${2:-60}
shift $(( $# < 2 ? $# : 2 ))
[ -x "$l2arc" ] || { echo "build first: cargo build --release" >&2; exit 1; }
command -v fio >/dev/null || { echo "fio missing: scripts/setup.sh" >&2; exit 1; }
mkdir -p "$data/src" "$data/mnt"
for i in 0 1 2 3; do
    [ "$(stat -c %s "$data/src/f$i" 2>/dev/null || echo 0)" = 268435456 ] ||
        head -c 256M /dev/urandom > "$data/src/f$i"
done
rm -f "$data/cache.img" "$data/ctl.sock" "$data"/iops_iops.*.log
sync
echo 3 > /proc/sys/vm/drop_caches
"$l2arc" mount "$data/src" "$data/mnt" --arc-max 128MiB --cache "$data/cache.img" \
    --cache-size 2GiB --emulate-hdd-spindles 4 --control "$data/ctl.sock" "$@" \
    > "$data/mount.log" 2>&1 &
mount_pid=$!
trap 'umount "$data/mnt" 2>/dev/null || true; wait $mount_pid 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do mountpoint -q "$data/mnt" && break; sleep 0.1; done
mountpoint -q "$data/mnt" || { cat "$data/mount.log" >&2; exit 1; }
echo "load before: $(cat /proc/loadavg); l2arc mount ... $*"
( for _ in $(seq 1 "$secs"); do
      "$l2arc" ctl --socket "$data/ctl.sock" stats 2>/dev/null |
          awk '$1 == "primary_reads" { printf "%s ", $2 }'
      sleep 1
  done > "$data/primary.log" ) &
stats_pid=$!
(cd "$data" && fio --name=warmup --directory="$data/mnt" --filename=f0:f1:f2:f3 \
    --rw=randread --bs=4k --ioengine=psync --numjobs=32 --size=1G --time_based \
    --runtime="$secs" --group_reporting --write_iops_log=iops --log_avg_msec=1000 \
    --output="$data/fio.out" > /dev/null)
echo "load after: $(cat /proc/loadavg) (FUSE readers waiting count as load)"
wait $stats_pid
echo "primary reads so far, each second: $(cat "$data/primary.log")"
cat "$data"/iops_iops.*.log | awk -F, '{ s[int(($1 + 500) / 1000)] += $2 }
    END { for (i = 1; i in s; i++) print s[i] }' > "$data/iops.txt"
echo "IOPS each second: $(tr '\n' ' ' < "$data/iops.txt")"
# Warm: the median of the seconds at half the best one or more (the page
# cache's plateau); then the first second at 90% of it.
best=$(sort -n "$data/iops.txt" | tail -1)
warm=$(awk -v best="$best" '$1 >= best / 2' "$data/iops.txt" | sort -n |
    awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')
first=$(awk -v warm="$warm" '$1 >= 0.9 * warm { print NR; exit }' "$data/iops.txt")
echo "warm: $warm IOPS; 90% of it first at $first s; one pass from the disks: 18.1 s;" \
    "ratio $(awk -v t="$first" 'BEGIN { printf "%.2f", t / 18.1 }')x (goal 1.2x)"
