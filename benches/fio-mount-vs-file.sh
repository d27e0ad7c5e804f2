#!/usr/bin/env bash
# The fio goal of the server issue in one run: fio 1 MiB sequential write then
# read (psync, --end_fsync=1, --invalidate=1, one job) through the FUSE mount of
# `pfs up` (its defaults) against the same fio on a file of the same disk,
# alternating file and mount for ROUNDS rounds (this machine is shared and
# noisy; odd rounds run the file first, even rounds the mount, each run after
# `sync` and SETTLE seconds). Prints each round's rates and the mean of pfs/file
# per direction.
#
#   benches/fio-mount-vs-file.sh [PFS]      # as root; ROUNDS=3, SIZE_MIB=1024
# Environment: ROUNDS, SIZE_MIB, SETTLE (seconds, 30), UP_ARGS (extra `pfs up` options), WORK.
set -euo pipefail
cd "$(dirname "$0")/.."
PFS=${1:-$PWD/target/release/pfs}
ROUNDS=${ROUNDS:-3}
SIZE_MIB=${SIZE_MIB:-1024}
SETTLE=${SETTLE:-30}
WORK=${WORK:-$PWD/target/bench-fio-mount}
for tool in fio jq bc; do
    command -v "$tool" >/dev/null || { echo "error: $tool not found" >&2; exit 1; }
done
[ -x "$PFS" ] || { echo "error: $PFS is not an executable (cargo build --release -p pfs)" >&2; exit 1; }
up=
cleanup() { [ -n "$up" ] && kill -INT "$up" 2>/dev/null && wait "$up" 2>/dev/null; true; }
trap cleanup EXIT
rm -rf "$WORK"
mkdir -p "$WORK/raw" "$WORK/mnt"
# shellcheck disable=SC2086
"$PFS" up --mount "$WORK/mnt" --data "$WORK/data" --master-listen 127.0.0.1:0 \
    --size-gib 8 ${UP_ARGS:-} > "$WORK/up.log" 2>&1 &
up=$!
for _ in $(seq 300); do grep -q "mounted on" "$WORK/up.log" && break; sleep 0.1; done
grep -q "mounted on" "$WORK/up.log" || { cat "$WORK/up.log" >&2; exit 1; }
fio_bw() { # dir rw -> MiB/s
    fio --name=seq --directory="$1" --rw="$2" --bs=1M --size="${SIZE_MIB}M" --ioengine=psync \
        --end_fsync=1 --invalidate=1 --output-format=json 2>/dev/null | jq -r ".jobs[0].$2.bw / 1024"
}
settle() { sync; sleep "$SETTLE"; }
echo "Measured $(date -u +%Y-%m-%d) on $(nproc) cores, one fio job, ${SIZE_MIB} MiB, MiB/s."
echo
echo "| round | rw | file | pfs mount | pfs/file |"
echo "|---|---|---|---|---|"
declare -A SUM
for r in $(seq "$ROUNDS"); do
    for rw in write read; do
        # Who runs first alternates by round, and each run starts after the
        # disk settled: on this VM a run within 5 s after another one's 1 GiB write
        # went at half speed, whichever side it was (the host's cache draining).
        if [ $((r % 2)) = 1 ]; then
            settle; raw=$(fio_bw "$WORK/raw" "$rw")
            settle; pfs=$(fio_bw "$WORK/mnt" "$rw")
        else
            settle; pfs=$(fio_bw "$WORK/mnt" "$rw")
            settle; raw=$(fio_bw "$WORK/raw" "$rw")
        fi
        q=$(echo "$pfs / $raw" | bc -l)
        SUM[$rw]=$(echo "${SUM[$rw]:-0} + $q" | bc -l)
        printf '| %s | %s | %.0f | %.0f | %.2f |\n' "$r" "$rw" "$raw" "$pfs" "$q"
    done
    rm -f "$WORK"/raw/* "$WORK"/mnt/*
done
echo
for rw in write read; do
    printf 'mean pfs/file, %s: %.2f\n' "$rw" "$(echo "${SUM[$rw]} / $ROUNDS" | bc -l)"
done
