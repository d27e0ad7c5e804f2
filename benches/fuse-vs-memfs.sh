#!/usr/bin/env bash
# Through-the-mount benchmarks of the FUSE issue, each against a baseline run in
# the same script:
#   1. metadata (create / stat / remove of empty and of 3901-byte files in one
#      shared directory, 2 processes) on a `pfs up` mount vs the in-memory FUSE
#      file system of the same adapter and fuser version (`pfs-fuse memory`): the
#      FUSE ceiling;
#   2. fio 1 MiB sequential write and read through the pfs mount vs fio on a file
#      of the same disk.
#
# Usage: benches/fuse-vs-memfs.sh   (as root; FILES, PROCS, SIZE_MIB, WORK override)
set -euo pipefail
cd "$(dirname "$0")/.."

FILES=${FILES:-2000}          # files per process per metadata run
PROCS=${PROCS:-2}
SIZE_MIB=${SIZE_MIB:-2048}    # fio file size
WORK=${WORK:-$PWD/target/bench-fuse}
WORKERS=${WORKERS:-2}

cargo build --release -q -p pfs -p pfs-fuse --bins
PFS=$PWD/target/release/pfs
PFS_FUSE=$PWD/target/release/pfs-fuse

rm -rf "$WORK"
mkdir -p "$WORK/pfs-mnt" "$WORK/mem-mnt" "$WORK/raw"
cleanup() {
    umount "$WORK/mem-mnt" 2>/dev/null || true
    [ -n "${UP_PID:-}" ] && kill -INT "$UP_PID" 2>/dev/null && wait "$UP_PID" 2>/dev/null || true
}
trap cleanup EXIT

"$PFS" up --mount "$WORK/pfs-mnt" --data "$WORK/pfs-data" --workers "$WORKERS" \
    --master-listen 127.0.0.1:0 --size-gib 8 > "$WORK/up.log" 2>&1 &
UP_PID=$!
for _ in $(seq 200); do grep -q "mounted on" "$WORK/up.log" && break; sleep 0.1; done
grep -q "mounted on" "$WORK/up.log" || { cat "$WORK/up.log"; exit 1; }
"$PFS_FUSE" memory "$WORK/mem-mnt"

echo "## metadata: $PROCS processes x $FILES files, one shared directory"
echo
echo "| files | phase | memfs ops/s | pfs ops/s | pfs/memfs |"
echo "|---|---|---|---|---|"
for size in 0 3901; do
    mem=$(python3 benches/mdtest.py "$WORK/mem-mnt" --procs "$PROCS" --files "$FILES" --size "$size")
    pfs=$(python3 benches/mdtest.py "$WORK/pfs-mnt" --procs "$PROCS" --files "$FILES" --size "$size")
    for phase in create stat remove; do
        m=$(echo "$mem" | awk -v p="$phase" '$1 == p { print $4 }')
        p=$(echo "$pfs" | awk -v p="$phase" '$1 == p { print $4 }')
        label=$([ "$size" = 0 ] && echo empty || echo "$size B")
        echo "| $label | $phase | $m | $p | $(awk -v a="$p" -v b="$m" 'BEGIN { printf "%.2f", a / b }') |"
    done
done
echo

fio_bw() { # dir rw -> MiB/s
    fio --name=seq --directory="$1" --rw="$2" --bs=1M --size="${SIZE_MIB}M" --ioengine=psync \
        --end_fsync=1 --invalidate=1 --output-format=terse --terse-version=3 2>/dev/null |
        awk -F';' -v rw="$2" '{ print (rw == "write" ? $48 : $7) / 1024 }'
}
echo "## fio 1 MiB sequential, ${SIZE_MIB} MiB file, one job"
echo
echo "| rw | raw file MiB/s | pfs mount MiB/s | pfs/raw |"
echo "|---|---|---|---|"
for rw in write read; do
    raw=$(fio_bw "$WORK/raw" "$rw")
    pfs=$(fio_bw "$WORK/pfs-mnt" "$rw")
    echo "| $rw | $(printf %.0f "$raw") | $(printf %.0f "$pfs") | $(awk -v a="$pfs" -v b="$raw" 'BEGIN { printf "%.2f", a / b }') |"
done
