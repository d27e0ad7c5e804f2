#!/usr/bin/env bash
# UringDevice vs fio on the same file, same block size, queue depth and runtime.
#
#   benches/device-vs-fio.sh            # defaults below; override with env variables
#   DIR=/data QD=64 RUNTIME=20 REPEAT=3 benches/device-vs-fio.sh
#
# DIR      disk-backed directory for the data file (default: <repo>/target/bench-dev)
# SIZE     data file size (default 2G)
# QD       queue depth for both (default 32)
# RUNTIME  seconds per run (default 10)
# REPEAT   runs per tool and workload, alternating fio and ours; best is kept (default 2)
#
# Workloads: 4 KiB random read, 4 KiB random write, 1 MiB sequential read and write.
# fio: --direct=1 --ioengine=io_uring --numjobs=1 --norandommap; ours: one thread,
# registered buffers. Prints a table with ours/fio ratios.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${DIR:-$repo/target/bench-dev}"
SIZE="${SIZE:-2G}"
QD="${QD:-32}"
RUNTIME="${RUNTIME:-10}"
REPEAT="${REPEAT:-2}"
FILE="$DIR/device-bench.img"

for tool in fio jq cargo; do
    command -v "$tool" >/dev/null || { echo "error: $tool not found" >&2; exit 1; }
done
mkdir -p "$DIR"
fstype="$(stat -f -c %T "$DIR")"
if [[ "$fstype" == tmpfs || "$fstype" == ramfs ]]; then
    echo "error: $DIR is on $fstype; set DIR to a disk-backed directory" >&2
    exit 1
fi

echo "building the bench..." >&2
bench_bin="$(cd "$repo" && cargo bench --bench device --no-run --message-format=json 2>/dev/null \
    | jq -r 'select(.reason == "compiler-artifact" and .target.name == "device"
                    and .executable != null) | .executable' | tail -n 1)"
[[ -x "$bench_bin" ]] || { echo "error: could not build the device bench" >&2; exit 1; }

size_bytes="$(numfmt --from=iec "$SIZE")"
if [[ ! -f "$FILE" || "$(stat -c %s "$FILE")" -lt "$size_bytes" ]]; then
    echo "laying out $FILE ($SIZE)..." >&2
    fio --name=layout --filename="$FILE" --rw=write --bs=1M --size="$SIZE" --direct=1 \
        --ioengine=io_uring --iodepth=16 --output-format=terse >/dev/null
fi

# fio_run RW BS -> "iops"
fio_run() {
    local rw="$1" bs="$2" dir
    case "$rw" in *read) dir=read ;; *) dir=write ;; esac
    fio --name="$rw" --filename="$FILE" --size="$SIZE" --direct=1 --ioengine=io_uring \
        --rw="$rw" --bs="$bs" --iodepth="$QD" --numjobs=1 --norandommap \
        --runtime="$RUNTIME" --time_based --output-format=json \
        | jq -r ".jobs[0].$dir.iops"
}

# ours_run RW -> "iops"
ours_run() {
    "$bench_bin" --file "$FILE" --workload "$1" --qd "$QD" --runtime "$RUNTIME" \
        | sed -n 's/.* iops=\([0-9.]*\) .*/\1/p'
}

max() { awk -v a="$1" -v b="$2" 'BEGIN { print (a > b ? a : b) }'; }

echo "file: $FILE ($SIZE, $fstype), qd $QD, runtime ${RUNTIME}s, best of $REPEAT" >&2
rows=()
for spec in randread:4096 randwrite:4096 read:1048576 write:1048576; do
    rw="${spec%%:*}" bs="${spec##*:}"
    best_fio=0 best_ours=0
    for ((i = 1; i <= REPEAT; i++)); do
        f="$(fio_run "$rw" "$bs")"
        o="$(ours_run "$rw")"
        echo "  $rw run $i: fio $f IOPS, ours $o IOPS" >&2
        best_fio="$(max "$best_fio" "$f")"
        best_ours="$(max "$best_ours" "$o")"
    done
    rows+=("$rw $bs $best_fio $best_ours")
done

printf '\n| workload | bs | fio IOPS | fio MiB/s | ours IOPS | ours MiB/s | ours/fio |\n'
printf '|---|---|---|---|---|---|---|\n'
for row in "${rows[@]}"; do
    read -r rw bs f o <<<"$row"
    awk -v rw="$rw" -v bs="$bs" -v f="$f" -v o="$o" 'BEGIN {
        printf "| %s | %s | %.0f | %.1f | %.0f | %.1f | %.2f |\n",
            rw, (bs >= 1048576 ? "1 MiB" : "4 KiB"), f, f * bs / 1048576, o, o * bs / 1048576, o / f
    }'
done
