#!/usr/bin/env bash
# Workers and clients on the same cores: `pfs up --workers N` with `pfs bench
# md-easy --procs 2` through the native client, for each binary in BINS and each
# worker count in WORKERS, alternating within each round (this machine is shared
# and noisy). Prints per binary and worker count the median rate of each phase
# and the CPU time per operation: the pfs up process (its workers, FUSE threads
# idle) plus the bench processes, user + system, over every operation.
#
#   cargo build --release -p pfs
#   benches/shared-cores.sh                          # as root
#   BINS="/tmp/old/pfs target/release/pfs" benches/shared-cores.sh   # A/B two builds
#   WORKERS="1 2" FILES=10000 ROUNDS=3 UP_ARGS="--idle-spin-us 0" benches/shared-cores.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BINS=${BINS:-target/release/pfs}
WORKERS=${WORKERS:-"1 2"}
FILES=${FILES:-10000}
ROUNDS=${ROUNDS:-3}
WORK=${WORK:-/tmp/pfs-shared-cores}
for b in $BINS; do
    [ -x "$b" ] || { echo "error: $b not found (cargo build --release -p pfs)" >&2; exit 1; }
done
up=
trap '[ -n "$up" ] && kill -INT "$up" 2>/dev/null && wait "$up" 2>/dev/null' EXIT
rm -rf "$WORK"
mkdir -p "$WORK"
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
for r in $(seq "$ROUNDS"); do
    i=0
    for b in $BINS; do
        i=$((i + 1))
        for w in $WORKERS; do
            d=$WORK/run
            rm -rf "$d"
            mkdir -p "$d/mnt"
            # shellcheck disable=SC2086
            "$b" up --mount "$d/mnt" --data "$d/data" --workers "$w" \
                --master-listen 127.0.0.1:0 --size-gib 8 ${UP_ARGS:-} > "$d/up.log" 2>&1 &
            up=$!
            for _ in $(seq 300); do grep -q "mounted on" "$d/up.log" && break; sleep 0.1; done
            master=$(sed -n 's/^pfs up: master on \([^,]*\),.*/\1/p' "$d/up.log")
            mkdir "$d/mnt/n"
            out=$WORK/b$i-w$w-r$r
            before=$(ticks "$up")
            TIMEFORMAT='%U %S'
            { time "$b" bench md-easy --procs 2 --files "$FILES" --key "$d/data/cluster.key" \
                --json "$out.json" "pfs://$master/n" > "$out.out" 2>&1; } 2> "$out.time"
            echo $(( $(ticks "$up") - before )) > "$out.server_ticks"
            kill -INT "$up"
            wait "$up" || true
            up=
        done
    done
done
median='sort | if length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end'
echo "### md-easy through the native client, \`pfs bench md-easy --procs 2 --files $FILES\`, median of $ROUNDS rounds"
echo
echo "| binary | workers | create | stat | remove | CPU µs/op |"
echo "|---|---|---|---|---|---|"
i=0
for b in $BINS; do
    i=$((i + 1))
    for w in $WORKERS; do
        rates=()
        for phase in create stat remove; do
            rates+=("$(cat "$WORK"/b$i-w$w-r*.json | jq -s "[.[].phases[] | select(.name==\"$phase\") | .rate] | $median")")
        done
        total=0
        ops=0
        for r in $(seq "$ROUNDS"); do
            out=$WORK/b$i-w$w-r$r
            read -r u s < "$out.time"
            total=$(echo "$total + ($(cat "$out.server_ticks") / $hz) + $u + $s" | bc -l)
            ops=$((ops + $(jq '[.phases[].ops] | add' "$out.json")))
        done
        printf '| %s | %s | %.0f | %.0f | %.0f | %.1f |\n' "$b" "$w" "${rates[@]}" \
            "$(echo "$total * 1000000 / $ops" | bc -l)"
    done
done
