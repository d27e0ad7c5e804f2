#!/usr/bin/env bash
# FUSE over io_uring against classic /dev/fuse, in the same run: each round mounts
# every target twice, once per transport (`-o uring` or not), alternating, and runs
#   - mdtest easy and hard (`pfs bench md-easy` / `md-hard`, 2 processes),
#   - `tar xf` of /usr/include and `rm -rf` of the result,
#   - fio 1 MiB sequential write and read (pfs only),
# on the in-memory FUSE file system (`pfs-fuse memory`) and on a `pfs up` mount.
# Reports per target and phase the mean rate of each transport over the rounds,
# the ratio io_uring / /dev/fuse, and CPU time per operation (the file system
# process, all threads; for tar/rm plus the tar or rm process).
#
# Usage: benches/fuse-uring.sh > report.md   (as root; sets the fuse module's
# enable_uring to Y for the run and restores it)
# Environment: ROUNDS (2), EASY (files per process, 5000), HARD (2000), PROCS (2),
#   SIZE_MIB (fio file, 512), URING_OPTS (options with uring, "uring"), SKIP_FIO=1,
#   ONLY_FIO=1 (pfs's fio phases alone: more rounds of them in the same time),
#   WORK (target/bench-uring), PFS (the `pfs` binary, target/release/pfs: another
#   build's for an A/B of the pfs side; memfs is always target/release's).
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-2}
EASY=${EASY:-5000}
HARD=${HARD:-2000}
PROCS=${PROCS:-2}
SIZE_MIB=${SIZE_MIB:-512}
URING_OPTS=${URING_OPTS:-uring}
WORK=${WORK:-$PWD/target/bench-uring}
PARAM=/sys/module/fuse/parameters/enable_uring

for tool in fio jq tar; do
    command -v "$tool" >/dev/null || { echo "error: $tool not found (apt-get install -y $tool)" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "error: run as root (FUSE mounts)" >&2; exit 1; }
[ -e "$PARAM" ] || { echo "error: $PARAM missing: this kernel has no FUSE over io_uring" >&2; exit 1; }

echo "building..." >&2
cargo build --release -q -p pfs -p pfs-fuse --bins
# Another build's `pfs` (its `pfs up`) with PFS=...: an A/B of pfs's side.
PFS=${PFS:-$PWD/target/release/pfs}
PFS_FUSE=$PWD/target/release/pfs-fuse

OLD_PARAM=$(cat "$PARAM")
rm -rf "$WORK"
mkdir -p "$WORK/json" "$WORK/mnt"
PID=
cleanup() {
    [ -n "$PID" ] && kill -INT "$PID" 2>/dev/null && sleep 2
    umount -l "$WORK/mnt" 2>/dev/null || true
    echo "$OLD_PARAM" > "$PARAM"
}
trap cleanup EXIT
echo Y > "$PARAM"

cpu_ns() { # pid -> user + system ns, all threads
    awk -v t="$(getconf CLK_TCK)" '{ sub(/^.*\) /, ""); print ($12 + $13) * 1e9 / t }' "/proc/$1/stat"
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
num() { awk -v a="$1" 'BEGIN { printf (a >= 100 ? "%.0f" : "%.1f"), a }'; }

mount_target() { # target transport -> sets PID
    local opts=""
    [ "$2" = uring ] && opts=$URING_OPTS
    if [ "$1" = memfs ]; then
        "$PFS_FUSE" memory "$WORK/mnt" -o "log=$WORK/memfs.log${opts:+,$opts}"
        PID=$(pgrep -n -f "pfs-fuse memory $WORK/mnt")
    else
        rm -rf "$WORK/data"
        "$PFS" up --mount "$WORK/mnt" --data "$WORK/data" --master-listen 127.0.0.1:0 \
            --size-gib 8 ${opts:+-o "$opts"} > "$WORK/up.log" 2>&1 &
        PID=$!
        for _ in $(seq 300); do grep -q "mounted on" "$WORK/up.log" && break; sleep 0.1; done
        grep -q "mounted on" "$WORK/up.log" || { cat "$WORK/up.log" >&2; exit 1; }
        grep "mounted on" "$WORK/up.log" >&2
    fi
}
unmount_target() {
    if [ "$1" = memfs ]; then
        umount "$WORK/mnt"
        # The daemon exits on its own after the unmount: wait, so the next
        # mount's process is the only one.
        while kill -0 "$PID" 2>/dev/null; do sleep 0.05; done
    else
        kill -INT "$PID"; wait "$PID" || true
    fi
    PID=
}

TARBALL=$WORK/include.tar
tar cf "$TARBALL" -C /usr include
ENTRIES=$(tar tf "$TARBALL" | wc -l)
# results: lines "target phase transport rate cpu_us_per_op"
RES=$WORK/results
: > "$RES"
for r in $(seq "$ROUNDS"); do
    targets="memfs pfs"
    [ "${ONLY_FIO:-0}" = 1 ] && targets=pfs
    for target in $targets; do
        for tr in dev uring; do
            echo "round $r: $target over $tr..." >&2
            mount_target "$target" "$tr"
            workloads="md-easy md-hard"
            steps="tar rm"
            [ "${ONLY_FIO:-0}" = 1 ] && workloads= && steps=
            for w in $workloads; do
                files=$([ "$w" = md-easy ] && echo "$EASY" || echo "$HARD")
                j=$WORK/json/$w.$target.$tr.$r.json
                "$PFS" bench "$w" --procs "$PROCS" --files "$files" --cpu-of "$PID" \
                    --json "$j" "$WORK/mnt" >&2
                jq -r --arg t "$target" --arg w "$w" --arg tr "$tr" \
                    '.phases[] | "\($t) \($w)-\(.name) \($tr) \(.rate) \(.cpu_us_per_op)"' "$j" >> "$RES"
            done
            for step in $steps; do
                sync
                c0=$(cpu_ns "$PID"); s0=$(date +%s%N)
                if [ "$step" = tar ]; then
                    mkdir -p "$WORK/mnt/tree"
                    /usr/bin/time -f "%U %S" -o "$WORK/time" tar xf "$TARBALL" -C "$WORK/mnt/tree"
                else
                    /usr/bin/time -f "%U %S" -o "$WORK/time" rm -rf "$WORK/mnt/tree"
                fi
                s1=$(date +%s%N); c1=$(cpu_ns "$PID")
                awk -v t="$target" -v s="$step" -v tr="$tr" -v a="$s0" -v b="$s1" -v c0="$c0" \
                    -v c1="$c1" -v e="$ENTRIES" \
                    '{ printf "%s %s %s %f %f\n", t, s, tr, e / ((b - a) / 1e9), ((c1 - c0) / 1e3 + ($1 + $2) * 1e6) / e }' \
                    "$WORK/time" >> "$RES"
            done
            if [ "$target" = pfs ] && [ "${SKIP_FIO:-0}" != 1 ]; then
                for rw in write read; do
                    c0=$(cpu_ns "$PID")
                    bw=$(fio --name=seq --directory="$WORK/mnt" --rw="$rw" --bs=1M --size="${SIZE_MIB}M" \
                        --ioengine=psync --end_fsync=1 --invalidate=1 --output-format=json 2>/dev/null \
                        | jq -r ".jobs[0].$rw.bw / 1024")
                    c1=$(cpu_ns "$PID")
                    echo "pfs fio-$rw $tr $bw $(awk -v a="$c0" -v b="$c1" -v n="$SIZE_MIB" 'BEGIN { print (b - a) / 1e3 / n }')" >> "$RES"
                done
            fi
            unmount_target "$target"
        done
    done
done

echo "Measured $(date -u +%Y-%m-%d) on $(nproc) cores, $PROCS processes, $ROUNDS rounds (means), pfs up defaults, io_uring options \`$URING_OPTS\`."
echo "Rates: ops/s (tar/rm: entries/s; fio: MiB/s). CPU: us per op (fio: per MiB) of the file system process."
echo
echo "| target | phase | /dev/fuse | io_uring | io_uring / dev | CPU /dev/fuse | CPU io_uring | CPU ratio |"
echo "|---|---|---|---|---|---|---|---|"
awk '{ k = $1 " " $2; if (!(k in seen)) { seen[k] = 1; order[n++] = k }
       rate[k, $3] += $4; cpu[k, $3] += $5; cnt[k, $3]++ }
     END { for (i = 0; i < n; i++) { k = order[i]; split(k, p, " ")
             d = rate[k, "dev"] / cnt[k, "dev"]; u = rate[k, "uring"] / cnt[k, "uring"]
             cd = cpu[k, "dev"] / cnt[k, "dev"]; cu = cpu[k, "uring"] / cnt[k, "uring"]
             printf "| %s | %s | %.0f | %.0f | %.2f | %.1f | %.1f | %.2f |\n", p[1], p[2], d, u, u / d, cd, cu, (cd > 0 ? cu / cd : 0) } }' "$RES"
