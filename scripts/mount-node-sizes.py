#!/usr/bin/env python3
"""Measures what a node and an open handle cost `l2arc mount` in RSS.

The figures behind the "Memory" section of docs/mount.md: mounts a tree of
empty files through the real CLI, makes the kernel hold NODES nodes (a stat
of every file, with an attribute timeout long enough that the kernel keeps
their dentries), then holds HANDLES open files and HANDLES opens of an empty
directory from this process, reading the daemon's VmRSS and VmHWM from
/proc/PID/status between the steps.

    scripts/mount-node-sizes.py [target/debug/l2arc] [NODES] [HANDLES]

Needs root (or fusermount3) and fuse3, like the mount itself.
"""

import os
import resource
import subprocess
import sys
import tempfile
import time


def status(pid):
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                fields[name] = int(value.split()[0]) * 1024
    return fields["VmRSS"], fields["VmHWM"]


def settle(pid):
    """RSS once it stops moving (the daemon answers asynchronously)."""
    last = None
    while True:
        time.sleep(1.0)
        now = status(pid)
        if now == last:
            return now
        last = now


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else "target/debug/l2arc"
    # The mount holds a descriptor per node and per handle, and caps nodes
    # at half its descriptor limit, handles at a quarter: with a hard
    # limit of 20000 (no CAP_SYS_RESOURCE), 9872 nodes and 4936 handles.
    nodes = int(sys.argv[2]) if len(sys.argv) > 2 else 9_000
    handles = int(sys.argv[3]) if len(sys.argv) > 3 else 2_000
    per_dir = 1000
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 2 * handles + 1024
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, want)), hard))
    with tempfile.TemporaryDirectory() as tmp:
        src, mnt = os.path.join(tmp, "src"), os.path.join(tmp, "mnt")
        os.mkdir(src)
        os.mkdir(mnt)
        os.mkdir(os.path.join(src, "empty"))
        names = []
        for i in range(nodes // per_dir):
            d = f"d{i:04}"
            os.mkdir(os.path.join(src, d))
            for j in range(per_dir):
                name = os.path.join(d, f"f{j:04}")
                open(os.path.join(src, name), "w").close()
                names.append(name)
        child = subprocess.Popen(
            [binary, "mount", src, mnt, "--arc-max", "64MiB",
             "--attr-timeout", "3600",
             "--max-nodes", str(nodes + 500),
             "--max-open-handles", str(2 * handles + 1000)],
            stderr=subprocess.PIPE, text=True)
        try:
            for line in child.stderr:
                print(line.rstrip(), file=sys.stderr)
                if line.startswith("l2arc: mounted "):
                    break
            pid = child.pid
            rss0, _ = settle(pid)
            t = time.time()
            for name in names:
                os.stat(os.path.join(mnt, name))
            rss1, hwm1 = settle(pid)
            per_node = (rss1 - rss0) / len(names)
            print(f"{len(names)} nodes in {time.time() - t:.0f} s: RSS {rss0 >> 20} -> "
                  f"{rss1 >> 20} MiB (peak {hwm1 >> 20}): {per_node:.0f} B per node")
            fds = [os.open(os.path.join(mnt, n), os.O_RDONLY) for n in names[:handles]]
            rss2, hwm2 = settle(pid)
            per_file = (rss2 - rss1) / handles
            print(f"{handles} open files: RSS -> {rss2 >> 20} MiB (peak {hwm2 >> 20}): "
                  f"{per_file:.0f} B per open file")
            empty = os.path.join(mnt, "empty")
            dirs = [os.open(empty, os.O_RDONLY | os.O_DIRECTORY) for _ in range(handles)]
            rss3, hwm3 = settle(pid)
            per_dir_handle = (rss3 - rss2) / handles
            print(f"{handles} open directories: RSS -> {rss3 >> 20} MiB (peak {hwm3 >> 20}): "
                  f"{per_dir_handle:.0f} B per open directory")
            for fd in fds + dirs:
                os.close(fd)
            rss4, _ = settle(pid)
            print(f"all closed: RSS {rss4 >> 20} MiB")
        finally:
            child.terminate()
            child.wait()


if __name__ == "__main__":
    main()
