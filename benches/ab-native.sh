#!/usr/bin/env bash
# A/B of two pfs binaries through the native client: `pfs up` (1 server x 2
# workers, its data file on this disk), then `pfs bench` md-easy, md-hard and
# io-easy on pfs://, the binaries alternating A B A B (this machine is shared
# and noisy). Prints, per workload and phase, the mean rate of each, B/A, and
# the median of each round's own B/A ("paired": the two runs of a round ran
# seconds apart), and the CPU time per operation (the pfs up process and the
# bench processes).
#
#   benches/ab-native.sh OLD_PFS NEW_PFS      # as root; ROUNDS=2 by default
#   WORKLOADS="io-easy ckpt" benches/ab-native.sh ...   # any of md-easy md-hard io-easy io-hard ckpt
#   OPTS_io_easy="--segments 2048 --transfer 1048576" ...  # a workload's options
#   THROUGH=mount benches/ab-native.sh ...   # on a directory of the FUSE mount instead
#   THROUGH=preload benches/ab-native.sh ... # through libpfs_preload.so (the one beside
#                                            # each binary) on a path under PFS_MOUNT
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
            env=()
            case $THROUGH in
                mount) target=(--json "$d/$w.json" "$d/mnt") ;;
                preload)
                    mkdir "$d/mnt/$w"
                    env=(LD_PRELOAD="$(cd "$(dirname "$bin")" && pwd)/libpfs_preload.so"
                        PFS_MOUNT=/pfs-ab PFS_MASTER="$master" PFS_KEY="$d/data/cluster.key")
                    target=(--json "$d/$w.json" "/pfs-ab/$w")
                    ;;
                *) target=(--key "$d/data/cluster.key" --json "$d/$w.json" "pfs://$master") ;;
            esac
            { time env "${env[@]}" "$bin" bench "$w" --procs 2 ${OPTS[$w]} "${target[@]}" \
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
    echo "| phase | A | B | B/A | paired |"
    echo "|---|---|---|---|---|"
    for phase in $(jq -r '.phases[].name' "$WORK/A.1/$w.json"); do
        mean() { cat "$WORK"/"$1".*/"$w".json | jq -s "[.[].phases[] | select(.name==\"$phase\") | .rate] | add / length"; }
        a=$(mean A)
        b=$(mean B)
        paired=$(for r in $(seq "$ROUNDS"); do
            jq -s ".[1].phases[] as \$b | .[0].phases[] | select(.name==\"$phase\" and \$b.name==\"$phase\") | \$b.rate / .rate" \
                "$WORK/A.$r/$w.json" "$WORK/B.$r/$w.json"
        done | jq -s 'sort | if length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end')
        printf '| %s | %.0f | %.0f | %.2f | %.2f |\n' "$phase" "$a" "$b" "$(echo "$b / $a" | bc -l)" "$paired"
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
    printf '| CPU µs/op (all phases) | %.1f | %.1f | %.2f | |\n\n' "$a" "$b" "$(echo "$b / $a" | bc -l)"
done
