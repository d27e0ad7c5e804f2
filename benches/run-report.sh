#!/usr/bin/env bash
# Regenerates the `pfs bench` report of docs/benchmarks.md ("IO500-style
# workloads") on this machine: every workload on five targets measured in the
# same run, the JSON of every run and one SVG chart per workload in docs/bench/,
# and the markdown tables (ratios to the baselines) on stdout.
#
# Targets:
#   tmpfs   a directory on /dev/shm (no FUSE, no network, no durability)
#   memfs   the in-memory FUSE file system of the FUSE issue (`pfs-fuse memory`):
#           the FUSE ceiling, same adapter and fuser version as the pfs mount
#   mount   pfs through its FUSE mount (`pfs up`: one server, WORKERS shards)
#   native  pfs through the native client (pfs://MASTER, no kernel)
#   fio     for the data workloads: fio on a raw file of the disk that holds the
#           pfs data file, same transfer size, processes and bytes
#
# Usage (as root, on a fresh Debian: apt-get install -y fuse3 fio jq):
#   benches/run-report.sh > /tmp/report.md
# Environment: PROCS (2), WORKERS (2), WORK (target/bench-report), OUT (docs/bench),
#   SCALE (1; multiplies every count).
set -euo pipefail
cd "$(dirname "$0")/.."

PROCS=${PROCS:-2}
WORKERS=${WORKERS:-2}
WORK=${WORK:-$PWD/target/bench-report}
OUT=${OUT:-$PWD/docs/bench}
SCALE=${SCALE:-1}

for tool in fio jq cargo; do
    command -v "$tool" >/dev/null || { echo "error: $tool not found (apt-get install -y $tool)" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "error: run as root (FUSE mounts)" >&2; exit 1; }

echo "building..." >&2
cargo build --release -q -p pfs -p pfs-fuse --bins
PFS=$PWD/target/release/pfs
PFS_FUSE=$PWD/target/release/pfs-fuse

TMPFS=$(mktemp -d /dev/shm/pfs-report.XXXXXX)
rm -rf "$WORK"
mkdir -p "$WORK/mount" "$WORK/memfs" "$WORK/raw" "$OUT"
cleanup() {
    umount "$WORK/memfs" 2>/dev/null || true
    if [ -n "${UP_PID:-}" ]; then
        kill -INT "$UP_PID" 2>/dev/null || true
        wait "$UP_PID" 2>/dev/null || true
    fi
    rm -rf "$TMPFS"
}
trap cleanup EXIT

"$PFS" up --mount "$WORK/mount" --data "$WORK/pfs-data" --workers "$WORKERS" \
    --master-listen 127.0.0.1:0 --size-gib 16 > "$WORK/up.log" 2>&1 &
UP_PID=$!
for _ in $(seq 300); do grep -q "mounted on" "$WORK/up.log" && break; sleep 0.1; done
grep -q "mounted on" "$WORK/up.log" || { cat "$WORK/up.log" >&2; exit 1; }
MASTER=$(sed -n 's/^pfs up: master on \([^,]*\),.*/\1/p' "$WORK/up.log")
KEY=$WORK/pfs-data/cluster.key
"$PFS_FUSE" memory "$WORK/memfs"

n() { echo $(($1 * SCALE)); }
# Options per workload: counts large enough for each phase to last a while on
# pfs, small enough for the whole report to take a few minutes.
declare -A OPTS=(
    [md-easy]="--files $(n 5000)"
    [md-hard]="--files $(n 2000)"
    [io-easy]="--segments $(n 512)"
    [io-hard]="--segments $(n 2048)"
    [mdwb]="--files $(n 2000)"
    [ckpt]="--particles $(n 1048576)"
)
WORKLOADS="md-easy md-hard io-easy io-hard mdwb ckpt"

target_of() {
    case "$1" in
        tmpfs) echo "$TMPFS" ;;
        memfs) echo "$WORK/memfs" ;;
        mount) echo "$WORK/mount" ;;
        native) echo "pfs://$MASTER" ;;
    esac
}

for w in $WORKLOADS; do
    compare=()
    for t in tmpfs memfs mount native; do
        echo "$w on $t..." >&2
        plot=()
        [ "$t" = native ] && plot=(--plot "$OUT/$w.svg" "${compare[@]}")
        # shellcheck disable=SC2086
        "$PFS" bench "$w" --procs "$PROCS" ${OPTS[$w]} --key "$KEY" --label "$t" \
            --json "$OUT/$w.$t.json" "${plot[@]}" "$(target_of "$t")" >&2
        compare+=(--compare "$OUT/$w.$t.json")
    done
done

# fio on the raw disk: the data workloads' transfers, processes and bytes.
fio_bw() { # rw bs size_per_job -> MiB/s (all jobs)
    local rw=$1 bs=$2 size=$3
    fio --name=raw --directory="$WORK/raw" --rw="$rw" --bs="$bs" --size="$size" \
        --numjobs="$PROCS" --group_reporting --ioengine=psync --end_fsync=1 --invalidate=1 \
        --output-format=json 2>/dev/null | jq -r ".jobs[0].${rw}.bw / 1024"
}
declare -A FIO
io_easy_bytes=$((262144 * $(n 512)))
io_hard_bytes=$((47008 * $(n 2048)))
ckpt_bytes=$((38 * $(n 1048576)))
echo "fio on $WORK/raw..." >&2
FIO[io-easy.write]=$(fio_bw write 262144 "$io_easy_bytes")
FIO[io-easy.read]=$(fio_bw read 262144 "$io_easy_bytes")
rm -f "$WORK"/raw/*
FIO[io-hard.write]=$(fio_bw write 47008 "$io_hard_bytes")
FIO[io-hard.read]=$(fio_bw read 47008 "$io_hard_bytes")
rm -f "$WORK"/raw/*
FIO[ckpt.checkpoint]=$(fio_bw write 1048576 "$ckpt_bytes")
FIO[ckpt.restart]=$(fio_bw read 1048576 "$ckpt_bytes")
rm -f "$WORK"/raw/*

rate() { # workload target phase -> rate
    jq -r --arg p "$3" '.phases[] | select(.name == $p) | .rate' "$OUT/$1.$2.json"
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
num() { awk -v a="$1" 'BEGIN { printf (a >= 100 ? "%.0f" : "%.1f"), a }'; }

echo "Measured $(date -u +%Y-%m-%d) on $(nproc) cores, $PROCS processes, pfs up with 1 server x $WORKERS workers"
echo "(data file on $(stat -f -c %T "$WORK"), \`SCALE=$SCALE benches/run-report.sh\`)."
for w in $WORKLOADS; do
    unit=$(jq -r '.phases[0].unit' "$OUT/$w.tmpfs.json")
    echo
    echo "### $w (\`pfs bench $w --procs $PROCS ${OPTS[$w]}\`), $unit"
    echo
    echo "![$w](bench/$w.svg)"
    echo
    if [ -n "${FIO[$w.$(jq -r '.phases[0].name' "$OUT/$w.tmpfs.json")]:-}" ]; then
        echo "| phase | tmpfs | memfs (FUSE) | fio raw file | pfs mount | pfs native | mount/memfs | mount/fio | native/fio | native/tmpfs |"
        echo "|---|---|---|---|---|---|---|---|---|---|"
    else
        echo "| phase | tmpfs | memfs (FUSE) | pfs mount | pfs native | mount/memfs | native/tmpfs |"
        echo "|---|---|---|---|---|---|---|"
    fi
    for phase in $(jq -r '.phases[].name' "$OUT/$w.tmpfs.json"); do
        tm=$(rate "$w" tmpfs "$phase")
        me=$(rate "$w" memfs "$phase")
        mo=$(rate "$w" mount "$phase")
        na=$(rate "$w" native "$phase")
        f=${FIO[$w.$phase]:-}
        if [ -n "$f" ]; then
            echo "| $phase | $(num "$tm") | $(num "$me") | $(num "$f") | $(num "$mo") | $(num "$na") | $(ratio "$mo" "$me") | $(ratio "$mo" "$f") | $(ratio "$na" "$f") | $(ratio "$na" "$tm") |"
        else
            echo "| $phase | $(num "$tm") | $(num "$me") | $(num "$mo") | $(num "$na") | $(ratio "$mo" "$me") | $(ratio "$na" "$tm") |"
        fi
    done
done
