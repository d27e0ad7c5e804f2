#!/usr/bin/env bash
# Through-the-mount benchmarks of the FUSE issue, each against a baseline run in
# the same script:
#   1. mdtest easy and hard (`pfs bench md-easy` / `md-hard`, 2 processes) on a
#      `pfs up` mount vs the in-memory FUSE file system of the same adapter and
#      fuser version (`pfs-fuse memory`): the FUSE ceiling. Rates and CPU time
#      per operation: the workers' plus the file system process's (pfs up holds
#      server and mount; memfs is one process), all threads, user + system;
#      Then IOR-style data (`pfs bench io-hard` and `io-easy`, IO_WORKLOADS) the
#      same way, rates in MiB/s;
#   2. `tar xf` of /usr/include and `rm -rf` of the result, same two targets,
#      with the CPU time of tar/rm plus the file system process;
#   3. fio 1 MiB sequential write and read through the pfs mount vs fio on a file
#      of the same disk.
#
# Usage: benches/fuse-vs-memfs.sh > report.md   (as root)
# Environment: EASY (files per process, 5000), HARD (files per process, 2000),
#   PROCS (2), SIZE_MIB (fio file, 1024), WORKERS (pfs up's default: half the
#   cores), WORK (target/bench-fuse), FIO_RUNS (alternating fio runs per side, 3),
#   SETTLE (seconds after a `sync` before each fio run, 30),
#   UP_ARGS (extra `pfs up` options, e.g. "-o writeback_cache"), SKIP_FIO=1,
#   IO_WORKLOADS ("io-hard io-easy"; empty: none), SEGMENTS (transfers per
#   process of each, 2048), MD_WORKLOADS ("md-easy md-hard"; empty: none),
#   SKIP_TAR=1.
set -euo pipefail
cd "$(dirname "$0")/.."

EASY=${EASY:-5000}
HARD=${HARD:-2000}
PROCS=${PROCS:-2}
SIZE_MIB=${SIZE_MIB:-1024}
WORK=${WORK:-$PWD/target/bench-fuse}
WORKERS=${WORKERS:-}
UP_ARGS=${UP_ARGS:-}
IO_WORKLOADS=${IO_WORKLOADS-io-hard io-easy}
MD_WORKLOADS=${MD_WORKLOADS-md-easy md-hard}
SEGMENTS=${SEGMENTS:-2048}

for tool in fio jq tar; do
    command -v "$tool" >/dev/null || { echo "error: $tool not found (apt-get install -y $tool)" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "error: run as root (FUSE mounts)" >&2; exit 1; }

echo "building..." >&2
cargo build --release -q -p pfs -p pfs-fuse --bins
PFS=$PWD/target/release/pfs
PFS_FUSE=$PWD/target/release/pfs-fuse

umount "$WORK/mem-mnt" 2>/dev/null || true
rm -rf "$WORK"
mkdir -p "$WORK/pfs-mnt" "$WORK/mem-mnt" "$WORK/raw" "$WORK/json"
cleanup() {
    umount "$WORK/mem-mnt" 2>/dev/null || true
    if [ -n "${UP_PID:-}" ]; then
        kill -INT "$UP_PID" 2>/dev/null || true
        wait "$UP_PID" 2>/dev/null || true
    fi
}
trap cleanup EXIT

# shellcheck disable=SC2086
"$PFS" up --mount "$WORK/pfs-mnt" --data "$WORK/pfs-data" ${WORKERS:+--workers "$WORKERS"} \
    --master-listen 127.0.0.1:0 --size-gib 8 $UP_ARGS > "$WORK/up.log" 2>&1 &
UP_PID=$!
for _ in $(seq 300); do grep -q "mounted on" "$WORK/up.log" && break; sleep 0.1; done
grep -q "mounted on" "$WORK/up.log" || { cat "$WORK/up.log" >&2; exit 1; }
KEY=$WORK/pfs-data/cluster.key
"$PFS_FUSE" memory "$WORK/mem-mnt"
MEM_PID=$(pgrep -f "pfs-fuse memory $WORK/mem-mnt" | head -1)
[ -n "$MEM_PID" ] || { echo "error: no memfs process" >&2; exit 1; }

dir_of() { [ "$1" = memfs ] && echo "$WORK/mem-mnt" || echo "$WORK/pfs-mnt"; }
pid_of() { [ "$1" = memfs ] && echo "$MEM_PID" || echo "$UP_PID"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
num() { awk -v a="$1" 'BEGIN { printf (a >= 100 ? "%.0f" : "%.1f"), a }'; }
cpu_ns() { # pid -> user + system ns, all threads
    awk -v t="$(getconf CLK_TCK)" '{ sub(/^.*\) /, ""); print ($12 + $13) * 1e9 / t }' "/proc/$1/stat"
}

SHAPE=$(sed -n 's/^pfs up: master on [^,]*, \(.*\), data in .*/\1/p' "$WORK/up.log")
echo "Measured $(date -u +%Y-%m-%d) on $(nproc) cores, $PROCS processes, pfs up with $SHAPE${UP_ARGS:+ ($UP_ARGS)}."
# shellcheck disable=SC2086
for w in $MD_WORKLOADS $IO_WORKLOADS; do
    case $w in
        md-easy) opts="--files $EASY" unit="ops/s" ;;
        md-hard) opts="--files $HARD" unit="ops/s" ;;
        *) opts="--segments $SEGMENTS" unit="MiB/s" ;;
    esac
    for t in memfs pfs; do
        echo "$w on $t..." >&2
        # shellcheck disable=SC2086
        "$PFS" bench "$w" --procs "$PROCS" $opts --key "$KEY" --label "$t" \
            --cpu-of "$(pid_of "$t")" --json "$WORK/json/$w.$t.json" "$(dir_of "$t")" >&2
    done
    echo
    echo "### $w (\`pfs bench $w --procs $PROCS $opts\`)"
    echo
    echo "| phase | memfs $unit | pfs $unit | pfs/memfs | memfs CPU us/op | pfs CPU us/op | pfs/memfs CPU |"
    echo "|---|---|---|---|---|---|---|"
    for phase in $(jq -r '.phases[].name' "$WORK/json/$w.memfs.json"); do
        get() { jq -r --arg p "$phase" ".phases[] | select(.name == \$p) | .$2" "$WORK/json/$w.$1.json"; }
        mr=$(get memfs rate); pr=$(get pfs rate); mc=$(get memfs cpu_us_per_op); pc=$(get pfs cpu_us_per_op)
        echo "| $phase | $(num "$mr") | $(num "$pr") | $(ratio "$pr" "$mr") | $(num "$mc") | $(num "$pc") | $(ratio "$pc" "$mc") |"
    done
done

# tar xf / rm -rf of /usr/include: wall time and CPU (tar or rm, plus the file
# system process).
if [ "${SKIP_TAR:-0}" != 1 ]; then
TARBALL=$WORK/include.tar
tar cf "$TARBALL" -C /usr include
ENTRIES=$(tar tf "$TARBALL" | wc -l)
declare -A SECS CPU
for t in memfs pfs; do
    d=$(dir_of "$t")/tree
    for step in tar rm; do
        echo "$step on $t..." >&2
        sync
        c0=$(cpu_ns "$(pid_of "$t")")
        s0=$(date +%s%N)
        if [ "$step" = tar ]; then
            mkdir -p "$d"
            /usr/bin/time -f "%U %S" -o "$WORK/time" tar xf "$TARBALL" -C "$d"
        else
            /usr/bin/time -f "%U %S" -o "$WORK/time" rm -rf "$d"
        fi
        s1=$(date +%s%N)
        c1=$(cpu_ns "$(pid_of "$t")")
        SECS[$t.$step]=$(awk -v a="$s0" -v b="$s1" 'BEGIN { printf "%.3f", (b - a) / 1e9 }')
        CPU[$t.$step]=$(awk -v a="$c0" -v b="$c1" -v e="$ENTRIES" '{ printf "%.1f", ((b - a) / 1e3 + ($1 + $2) * 1e6) / e }' "$WORK/time")
    done
done
echo
echo "### tar xf and rm -rf of /usr/include ($ENTRIES entries, $(du -sh /usr/include | cut -f1))"
echo
echo "| step | memfs s | pfs s | pfs/memfs speed | memfs CPU us/entry | pfs CPU us/entry | pfs/memfs CPU |"
echo "|---|---|---|---|---|---|---|"
for step in tar rm; do
    echo "| $step | ${SECS[memfs.$step]} | ${SECS[pfs.$step]} | $(ratio "${SECS[memfs.$step]}" "${SECS[pfs.$step]}") | ${CPU[memfs.$step]} | ${CPU[pfs.$step]} | $(ratio "${CPU[pfs.$step]}" "${CPU[memfs.$step]}") |"
done
fi

[ "${SKIP_FIO:-0}" = 1 ] && exit 0
fio_bw() { # dir rw -> MiB/s
    fio --name=seq --directory="$1" --rw="$2" --bs=1M --size="${SIZE_MIB}M" --ioengine=psync \
        --end_fsync=1 --invalidate=1 --output-format=json 2>/dev/null | jq -r ".jobs[0].$2.bw / 1024"
}
# The disk's own rate drifts by 2x from minute to minute on this VM, and a run
# right after another one's 1 GiB write goes at about half speed whichever side
# it is (benches/fio-mount-vs-file.sh): each side runs FIO_RUNS times, who goes
# first alternating, each run after `sync` and SETTLE seconds, and the medians
# are compared.
FIO_RUNS=${FIO_RUNS:-3}
SETTLE=${SETTLE:-30}
settle() { sync; sleep "$SETTLE"; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo
echo "### fio 1 MiB sequential, ${SIZE_MIB} MiB file, one job (psync, end_fsync), median of $FIO_RUNS alternating runs"
echo
echo "| rw | raw file MiB/s | pfs mount MiB/s | pfs/raw | raw runs | pfs runs |"
echo "|---|---|---|---|---|---|"
for rw in write read; do
    echo "fio $rw..." >&2
    raws=() pfss=()
    for i in $(seq "$FIO_RUNS"); do
        if [ $((i % 2)) = 1 ]; then
            settle; raws+=("$(fio_bw "$WORK/raw" "$rw")")
            settle; pfss+=("$(fio_bw "$WORK/pfs-mnt" "$rw")")
        else
            settle; pfss+=("$(fio_bw "$WORK/pfs-mnt" "$rw")")
            settle; raws+=("$(fio_bw "$WORK/raw" "$rw")")
        fi
    done
    raw=$(printf '%s\n' "${raws[@]}" | median)
    pfs=$(printf '%s\n' "${pfss[@]}" | median)
    each() { for v in "$@"; do printf '%s ' "$(num "$v")"; done; }
    echo "| $rw | $(num "$raw") | $(num "$pfs") | $(ratio "$pfs" "$raw") | $(each "${raws[@]}")| $(each "${pfss[@]}")|"
done
