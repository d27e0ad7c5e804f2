#!/usr/bin/env bash
# A/B of two pfs binaries through the native client: `pfs up` (1 server x 2
# workers, its data file on this disk), then `pfs bench` md-easy, md-hard and
# io-easy on pfs://, the binaries alternating A B A B (this machine is shared
# and noisy). Prints, per workload and phase, the mean rate of each and B/A,
# and the CPU time per operation (the pfs up process and the bench processes).
#
#   benches/ab-native.sh OLD_PFS NEW_PFS      # as root; ROUNDS=2 by default
#   WORKLOADS="io-easy ckpt" benches/ab-native.sh ...   # any of md-easy md-hard io-easy io-hard ckpt
#   OPTS_io_easy="--segments 2048 --transfer 1048576" ...  # a workload's options
#   THROUGH=mount benches/ab-native.sh ...   # on a directory of the FUSE mount instead
set -euo pipefail
THROUGH=${THROUGH:-native}
A=$1
B=$2
ROUNDS=${ROUNDS:-2}
WORK=${WORK:-/tmp/pfs-ab}
declare -A OPTS=([md-easy]="--files 5000" [md-hard]="--files 2000" [io-easy]="--segments 512" [io-hard]="--segments 2048" [ckpt]="--particles 1048576")
WORKLOADS=${WORKLOADS:-"md-easy md-hard io-easy"}
# A workload's options from the environment: OPTS_io_easy="--segments 2048 --transfer 1048576".
for w in "${!OPTS[@]}"; do
    v=OPTS_${w//-/_}
    if [ -n "${!v:-}" ]; then OPTS[$w]=${!v}; fi
done
rm -rf "$WORK"
mkdir -p "$WORK"
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
for r in $(seq "$ROUNDS"); do
    for x in A B; do
        bin=${!x}
        d=$WORK/$x.$r
        mkdir -p "$d/mnt"
        "$bin" up --mount "$d/mnt" --data "$d/data" --workers 2 \
            --master-listen 127.0.0.1:0 --size-gib 8 > "$d/up.log" 2>&1 &
        up=$!
        for _ in $(seq 300); do grep -q "mounted on" "$d/up.log" && break; sleep 0.1; done
        master=$(sed -n 's/^pfs up: master on \([^,]*\),.*/\1/p' "$d/up.log")
        for w in $WORKLOADS; do
            before=$(ticks "$up")
            TIMEFORMAT='%U %S'
            # shellcheck disable=SC2086
            if [ "$THROUGH" = mount ]; then
                target=(--json "$d/$w.json" "$d/mnt")
            else
                target=(--key "$d/data/cluster.key" --json "$d/$w.json" "pfs://$master")
            fi
            { time "$bin" bench "$w" --procs 2 ${OPTS[$w]} "${target[@]}" \
                > "$d/$w.out" 2>&1; } 2> "$d/$w.time"
            echo $(( $(ticks "$up") - before )) > "$d/$w.server_ticks"
        done
        kill -INT "$up"
        wait "$up" || true
    done
done
hz=$(getconf CLK_TCK)
for w in $WORKLOADS; do
    echo "### $w (\`pfs bench $w --procs 2 ${OPTS[$w]}\`), $THROUGH, mean of $ROUNDS runs each"
    echo
    echo "| phase | A | B | B/A |"
    echo "|---|---|---|---|"
    for phase in $(jq -r '.phases[].name' "$WORK/A.1/$w.json"); do
        mean() { cat "$WORK"/"$1".*/"$w".json | jq -s "[.[].phases[] | select(.name==\"$phase\") | .rate] | add / length"; }
        a=$(mean A)
        b=$(mean B)
        printf '| %s | %.0f | %.0f | %.2f |\n' "$phase" "$a" "$b" "$(echo "$b / $a" | bc -l)"
    done
    cpu() { # microseconds of CPU per operation, server and bench processes
        local total=0 ops=0
        for d in "$WORK"/"$1".*; do
            read -r u s < "$d/$w.time"
            total=$(echo "$total + ($(cat "$d/$w.server_ticks") / $hz) + $u + $s" | bc -l)
            ops=$((ops + $(jq '[.phases[].ops] | add' "$d/$w.json")))
        done
        echo "$total * 1000000 / $ops" | bc -l
    }
    a=$(cpu A)
    b=$(cpu B)
    printf '| CPU µs/op (all phases) | %.1f | %.1f | %.2f |\n\n' "$a" "$b" "$(echo "$b / $a" | bc -l)"
done
