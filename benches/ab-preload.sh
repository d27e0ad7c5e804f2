#!/usr/bin/env bash
# A/B of two builds through benches/preload.sh: each round runs preload.sh once
# (one fresh `pfs up`, the native client, libpfs_preload and the FUSE mount)
# with build A and once with build B, the order alternating from round to round
# (this machine is shared and noisy). Prints, per workload, phase and target,
# the median rate of each build and the median of each round's own B/A
# ("paired": its two runs ran a minute apart at most), then the CPU per
# operation and `tar xf` / `rm -rf` rows of each run as preload.sh printed them.
#
#   benches/ab-preload.sh OLD_TARGET_DIR NEW_TARGET_DIR   # as root, each holding
#                          # pfs and libpfs_preload.so (e.g. target/old/release
#                          # built from a `git worktree`, and target/release)
#   ROUNDS=4 benches/ab-preload.sh ...          # rounds (default 3)
#   WORKLOADS="io-easy" TARGETS="native preload" TAR=1 benches/ab-preload.sh ...
#                          # passed on to preload.sh (defaults: md-easy md-hard
#                          # io-easy, all three targets, TAR=0)
set -euo pipefail
cd "$(dirname "$0")/.."
A=$(cd "$1" && pwd)
B=$(cd "$2" && pwd)
ROUNDS=${ROUNDS:-3}
WORK=${WORK:-/tmp/pfs-ab-preload}
rm -rf "$WORK"
mkdir -p "$WORK"
for r in $(seq "$ROUNDS"); do
    if [ $((r % 2)) = 1 ]; then order="A B"; else order="B A"; fi
    for x in $order; do
        dir=${!x}
        BIN=$dir/pfs LIB=$dir/libpfs_preload.so WORK=$WORK/$x-$r ROUNDS=1 TAR=${TAR:-0} \
            WORKLOADS="${WORKLOADS:-md-easy md-hard io-easy}" TARGETS="${TARGETS:-native preload mount}" \
            benches/preload.sh > "$WORK/$x-$r.log" 2>&1 || { echo "error: run $x $r failed: $WORK/$x-$r.log" >&2; exit 1; }
    done
done
python3 - "$WORK" <<'PY'
import collections, glob, json, statistics, sys
work = sys.argv[1]
rates = collections.defaultdict(dict)
for f in glob.glob(f"{work}/*-*/1/*.json"):
    parts = f[len(work) + 1:].split("/")
    build, rnd = parts[0].split("-")
    target, workload = parts[2][:-len(".json")].split("-", 1)
    for ph in json.load(open(f))["phases"]:
        rates[(workload, ph["name"], target, build)][int(rnd)] = ph["rate"]
print("| workload | phase | target | A | B | B/A paired | rounds |")
print("|---|---|---|---|---|---|---|")
for w, p, t in sorted({k[:3] for k in rates}):
    a, b = rates[(w, p, t, "A")], rates[(w, p, t, "B")]
    pairs = [b[r] / a[r] for r in sorted(a) if r in b]
    print(f"| {w} | {p} | {t} | {statistics.median(a.values()):.0f} | {statistics.median(b.values()):.0f} "
          f"| {statistics.median(pairs):.2f} | {' '.join(f'{x:.2f}' for x in pairs)} |")
PY
for x in A B; do
    echo
    echo "$x: CPU µs/op (native, preload, mount) per workload, then tar/rm (preload s, mount s), one line a round"
    for r in $(seq "$ROUNDS"); do
        grep -E '^\| (CPU|tar|rm) ' "$WORK/$x-$r.log" | awk -F'|' '{printf "%s:%s%s%s ", $2, $3, $4, $5} END {print ""}'
    done
done
