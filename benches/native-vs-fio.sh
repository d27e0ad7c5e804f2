#!/usr/bin/env bash
# The data goals of the server issue in one run: `pfs bench` io-easy, ckpt and
# io-hard through the native client on `pfs up` (1 server x 2 workers, its data
# file on this disk), against fio with the same transfers, processes and bytes
# on a file of the same disk (psync, --invalidate=1, as benches/run-report.sh),
# alternating fio and pfs for ROUNDS rounds (this machine is shared and noisy).
# Prints per workload and phase the mean rate of each and pfs/fio. Read phases
# also get fio reading the same files with O_DIRECT through io_uring at depth 8
# (the device itself, as the server reads it, without the help buffered fio may
# get from pages the invalidation left; transfers rounded up to 4 KiB): compare
# with both.
#
#   benches/native-vs-fio.sh [PFS]        # as root; ROUNDS=2, PROCS=2 by default
#   SCALE=8 benches/native-vs-fio.sh       # 8x the bytes (at most 8: ckpt's limit)
set -euo pipefail
cd "$(dirname "$0")/.."
PFS=${1:-$PWD/target/release/pfs}
ROUNDS=${ROUNDS:-2}
PROCS=${PROCS:-2}
WORK=${WORK:-$PWD/target/bench-native-fio}
for tool in fio jq; do
    command -v "$tool" >/dev/null || { echo "error: $tool not found" >&2; exit 1; }
done
# SCALE (1..8) multiplies every workload's bytes: at 1 a phase lasts 0.05-0.5 s,
# short enough for one stall to decide it.
SCALE=${SCALE:-1}
declare -A OPTS=([io-easy]="--segments $((512 * SCALE))" [ckpt]="--particles $((1048576 * SCALE))"
    [io-hard]="--segments $((2048 * SCALE))")
# Transfer size and bytes per process of each workload's phases, as pfs bench does them.
declare -A BS=([io-easy]=262144 [ckpt]=1048576 [io-hard]=47008)
declare -A BYTES=([io-easy]=$((262144 * 512 * SCALE)) [ckpt]=$((38 * 1048576 * SCALE))
    [io-hard]=$((47008 * 2048 * SCALE)))
declare -A PHASE_RW=([io-easy.write]=write [io-easy.read]=read [ckpt.checkpoint]=write
    [ckpt.restart]=read [io-hard.write]=write [io-hard.read]=read)
rm -rf "$WORK"
mkdir -p "$WORK/raw"
fio_bw() { # rw bs size_per_job -> MiB/s (all jobs)
    fio --name=raw --directory="$WORK/raw" --rw="$1" --bs="$2" --size="$3" \
        --numjobs="$PROCS" --group_reporting --ioengine=psync --end_fsync=1 --invalidate=1 \
        --output-format=json 2>/dev/null | jq -r ".jobs[0].$1.bw / 1024"
}
fio_direct_bw() { # bs size_per_job -> MiB/s (all jobs), reading the files fio_bw wrote
    fio --name=raw --directory="$WORK/raw" --rw=read --bs="$1" --size="$2" \
        --numjobs="$PROCS" --group_reporting --ioengine=io_uring --iodepth=8 --direct=1 \
        --output-format=json 2>/dev/null | jq -r ".jobs[0].read.bw / 1024"
}
declare -A SUM
for r in $(seq "$ROUNDS"); do
    for w in io-easy ckpt io-hard; do
        for rw in write read; do
            SUM[fio.$w.$rw]=$(echo "${SUM[fio.$w.$rw]:-0} + $(fio_bw "$rw" "${BS[$w]}" "${BYTES[$w]}")" | bc -l)
        done
        # O_DIRECT needs whole sectors: io-hard's 47008 B transfers become 48 KiB.
        dbs=$(((BS[$w] + 4095) / 4096 * 4096))
        SUM[direct.$w]=$(echo "${SUM[direct.$w]:-0} + $(fio_direct_bw "$dbs" "${BYTES[$w]}")" | bc -l)
        rm -f "$WORK"/raw/*
    done
    d=$WORK/pfs.$r
    mkdir -p "$d/mnt"
    "$PFS" up --mount "$d/mnt" --data "$d/data" --workers 2 \
        --master-listen 127.0.0.1:0 --size-gib 8 > "$d/up.log" 2>&1 &
    up=$!
    for _ in $(seq 300); do grep -q "mounted on" "$d/up.log" && break; sleep 0.1; done
    master=$(sed -n 's/^pfs up: master on \([^,]*\),.*/\1/p' "$d/up.log")
    for w in io-easy ckpt io-hard; do
        # shellcheck disable=SC2086
        "$PFS" bench "$w" --procs "$PROCS" ${OPTS[$w]} --key "$d/data/cluster.key" \
            --json "$d/$w.json" "pfs://$master" > "$d/$w.out" 2>&1
        for phase in $(jq -r '.phases[].name' "$d/$w.json"); do
            rate=$(jq -r --arg p "$phase" '.phases[] | select(.name == $p) | .rate' "$d/$w.json")
            SUM[pfs.$w.$phase]=$(echo "${SUM[pfs.$w.$phase]:-0} + $rate" | bc -l)
        done
    done
    kill -INT "$up"
    wait "$up" || true
done
echo "Measured $(date -u +%Y-%m-%d) on $(nproc) cores, $PROCS processes, mean of $ROUNDS rounds, SCALE=$SCALE, MiB/s."
echo
echo "| workload | phase | fio on a file | pfs native | pfs/fio | fio direct (reads) | pfs/direct |"
echo "|---|---|---|---|---|---|---|"
for w in io-easy ckpt io-hard; do
    for phase in $(jq -r '.phases[].name' "$WORK/pfs.1/$w.json"); do
        rw=${PHASE_RW[$w.$phase]}
        f=$(echo "${SUM[fio.$w.$rw]} / $ROUNDS" | bc -l)
        p=$(echo "${SUM[pfs.$w.$phase]} / $ROUNDS" | bc -l)
        if [ "$rw" = read ]; then
            d=$(echo "${SUM[direct.$w]} / $ROUNDS" | bc -l)
            printf '| %s | %s | %.0f | %.0f | %.2f | %.0f | %.2f |\n' "$w" "$phase" "$f" "$p" \
                "$(echo "$p / $f" | bc -l)" "$d" "$(echo "$p / $d" | bc -l)"
        else
            printf '| %s | %s | %.0f | %.0f | %.2f | | |\n' "$w" "$phase" "$f" "$p" "$(echo "$p / $f" | bc -l)"
        fi
    done
done
