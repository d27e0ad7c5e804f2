#!/usr/bin/env bash
# A/B of two pfs binaries on fio 1 MiB sequential write then read (psync,
# `--invalidate=1`, `--end_fsync=1`) through the FUSE mount of `pfs up`, the
# binaries alternating A B A B (this machine is shared and noisy). Prints each
# run's rates and the CPU time of the `pfs up` process per MiB (all threads,
# user + system), which drifts far less than the rates.
#
#   benches/fio-ab.sh OLD_PFS NEW_PFS        # as root; ROUNDS=3 by default
# Environment: ROUNDS (3), SIZE_MIB (1024), UP_ARGS (extra `pfs up` options),
#   WORK (target/bench-fio-ab).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 2 ] || { echo "usage: $0 OLD_PFS NEW_PFS" >&2; exit 2; }
for tool in fio jq bc; do
    command -v "$tool" >/dev/null || { echo "error: $tool not found (apt-get install -y $tool)" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "error: run as root (FUSE mounts)" >&2; exit 1; }
ROUNDS=${ROUNDS:-3}
SIZE_MIB=${SIZE_MIB:-1024}
UP_ARGS=${UP_ARGS:-}
WORK=${WORK:-$PWD/target/bench-fio-ab}
TCK=$(getconf CLK_TCK)

one() { # label binary
    local label=$1 bin=$2
    umount "$WORK/mnt" 2>/dev/null || true
    rm -rf "$WORK"
    mkdir -p "$WORK/mnt"
    # shellcheck disable=SC2086
    "$bin" up --mount "$WORK/mnt" --data "$WORK/data" --master-listen 127.0.0.1:0 \
        --size-gib 4 $UP_ARGS > "$WORK/up.log" 2>&1 &
    local up=$!
    for _ in $(seq 300); do grep -q "mounted on" "$WORK/up.log" && break; sleep 0.1; done
    grep -q "mounted on" "$WORK/up.log" || { cat "$WORK/up.log" >&2; exit 1; }
    cpu() { awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$up/stat"; }
    run() {
        fio --name=seq --directory="$WORK/mnt" --rw="$1" --bs=1M --size="${SIZE_MIB}M" \
            --ioengine=psync --end_fsync=1 --invalidate=1 --output-format=json 2>/dev/null |
            jq -r ".jobs[0].$1.bw / 1024 | floor"
    }
    local c0 c1 c2 w r
    c0=$(cpu); w=$(run write); c1=$(cpu); r=$(run read); c2=$(cpu)
    per() { echo "scale=2; ($2 - $1) * 1000 / $TCK / $SIZE_MIB" | bc; }
    echo "| $label | $w | $(per "$c0" "$c1") | $r | $(per "$c1" "$c2") |"
    kill -INT "$up"; wait "$up" || true
}

echo "| binary | write MiB/s | CPU ms/MiB | read MiB/s | CPU ms/MiB |"
echo "|---|---|---|---|---|"
for _ in $(seq "$ROUNDS"); do
    one A "$1"
    one B "$2"
done
rm -rf "$WORK"
