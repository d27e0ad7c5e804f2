#!/usr/bin/env bash
# A/B of two pfs binaries through the FUSE mount of `pfs up` (its defaults, data
# file on this disk), the binaries alternating A B A B (this machine is shared
# and noisy): fio writing 4 KiB with an fsync after each write (2 jobs, psync,
# 4 MiB each: every write waits for a group commit), then `pfs bench md-hard`
# (2 processes, 2000 files each). Prints one line per round and binary: fio's
# IOPS, and each md-hard phase's rate and CPU µs per operation (`--cpu-of` the
# pfs up process plus the bench processes).
#
#   benches/fsync-ab.sh OLD_PFS NEW_PFS      # as root; ROUNDS=3 by default
set -euo pipefail
A=$1
B=$2
ROUNDS=${ROUNDS:-3}
WORK=${WORK:-/tmp/pfs-fsync-ab}
for r in $(seq "$ROUNDS"); do
    for x in A B; do
        bin=${!x}
        umount "$WORK/mnt" 2>/dev/null || true
        rm -rf "$WORK"
        mkdir -p "$WORK/mnt"
        "$bin" up --mount "$WORK/mnt" --data "$WORK/data" --master-listen 127.0.0.1:0 \
            --size-gib 4 > "$WORK/up.log" 2>&1 &
        up=$!
        for _ in $(seq 300); do grep -q "mounted on" "$WORK/up.log" && break; sleep 0.1; done
        iops=$(fio --name=s --directory="$WORK/mnt" --rw=write --bs=4k --size=4m --fsync=1 \
            --numjobs=2 --ioengine=psync --group_reporting --output-format=json 2>/dev/null |
            jq '.jobs[0].write.iops | floor')
        md=$("$bin" bench md-hard --procs 2 --files 2000 --key "$WORK/data/cluster.key" \
            --cpu-of "$up" "$WORK/mnt" 2>&1 |
            awk '/^(create|read|remove) /{printf "%s %s/s %s us/op  ", $1, $5, $NF}')
        echo "round $r $x: fsync-per-write ${iops} IOPS  md-hard $md"
        kill -INT "$up"
        wait "$up" || true
    done
done
rm -rf "$WORK"
