#!/usr/bin/env bash
# libpfs_preload against the native client and the FUSE mount, in one run:
# `pfs up` (1 server x 2 workers, its data file on this disk), then `pfs bench`
# md-easy, md-hard and io-easy on three targets, alternating within each round
# (this machine is shared and noisy):
#   native  pfs://MASTER/nN             (the native client, no kernel)
#   preload /pfs-preload-bench/pN       (LD_PRELOAD=libpfs_preload.so, PFS_MOUNT=/pfs-preload-bench)
#   mount   MOUNTPOINT/mN               (the FUSE mount of pfs up)
# Prints, per workload and phase, the mean rate of each, preload/native and
# preload/mount, and the CPU time per operation (the pfs up process, with its
# FUSE threads, and the bench processes); then `tar xf` and `rm -rf` of
# /usr/include through the library and through the mount.
#
#   cargo build --release -p pfs -p pfs-preload
#   benches/preload.sh                 # as root; ROUNDS=2, WORKLOADS="md-easy md-hard io-easy"
#   WORKERS=1 benches/preload.sh       # pfs up's workers (2 by default here)
#   UP_ARGS="--idle-spin-us 1000" benches/preload.sh   # more pfs up options
#   TARGETS="preload native mount" benches/preload.sh   # the targets (each round
#                                      # starts one further along the list)
#   OPTS_md_hard="--files 20000" benches/preload.sh   # a workload's options
#   STAT=mean benches/preload.sh       # rates as the mean of the rounds (default: the
#                                      # median, which a round caught in this VM's slow
#                                      # scheduling state moves less)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/pfs}
LIB=${LIB:-$PWD/target/release/libpfs_preload.so}
ROUNDS=${ROUNDS:-2}
STAT=${STAT:-median}
case $STAT in
    median) jq_stat='sort | if length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end' ;;
    mean) jq_stat='add / length' ;;
    *) echo "error: STAT=$STAT: median or mean" >&2; exit 1 ;;
esac
WORK=${WORK:-/tmp/pfs-preload-bench}
PFS_AT=/pfs-preload-bench
declare -A OPTS=([md-easy]="--files 5000" [md-hard]="--files 2000" [io-easy]="--segments 512" [io-hard]="--segments 2048" [ckpt]="--particles 1048576")
WORKLOADS=${WORKLOADS:-"md-easy md-hard io-easy"}
# A workload's options from the environment: OPTS_md_hard="--files 20000".
for w in "${!OPTS[@]}"; do
    v=OPTS_${w//-/_}
    if [ -n "${!v:-}" ]; then OPTS[$w]=${!v}; fi
done
TARGETS=${TARGETS:-"native preload mount"}
for f in "$BIN" "$LIB"; do
    [ -e "$f" ] || { echo "error: $f not found (cargo build --release -p pfs -p pfs-preload)" >&2; exit 1; }
done
up=
# A failure leaves no pfs up (and its mount) behind.
trap '[ -n "$up" ] && kill -INT "$up" 2>/dev/null && wait "$up" 2>/dev/null' EXIT
rm -rf "$WORK"
mkdir -p "$WORK"
tar -C /usr -cf "$WORK/include.tar" include
entries=$(tar -tf "$WORK/include.tar" | wc -l)
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
for r in $(seq "$ROUNDS"); do
    d=$WORK/$r
    mkdir -p "$d/mnt"
    # shellcheck disable=SC2086
    "$BIN" up --mount "$d/mnt" --data "$d/data" --workers "${WORKERS:-2}" \
        --master-listen 127.0.0.1:0 --size-gib 8 ${UP_ARGS:-} > "$d/up.log" 2>&1 &
    up=$!
    for _ in $(seq 300); do grep -q "mounted on" "$d/up.log" && break; sleep 0.1; done
    master=$(sed -n 's/^pfs up: master on \([^,]*\),.*/\1/p' "$d/up.log")
    for w in $WORKLOADS; do
        # Each round starts at another target: the first run after `pfs up`
        # starts is the slowest (in a fixed order native md-easy always ran
        # first: 139K creates/s, against 179K in a rotated order).
        read -ra ts <<< "$TARGETS"
        for i in "${!ts[@]}"; do
            t=${ts[$(( (i + r - 1) % ${#ts[@]} ))]}
            case $t in
                native) target="pfs://$master/n-$w"; mkdir "$d/mnt/n-$w" ;;
                preload) target="$PFS_AT/p-$w"; mkdir "$d/mnt/p-$w" ;;
                mount) target="$d/mnt/m-$w"; mkdir "$d/mnt/m-$w" ;;
            esac
            env=()
            [ "$t" = preload ] && env=(LD_PRELOAD="$LIB" PFS_MOUNT="$PFS_AT" PFS_MASTER="$master" PFS_KEY="$d/data/cluster.key")
            before=$(ticks "$up")
            TIMEFORMAT='%U %S'
            # shellcheck disable=SC2086
            { time env "${env[@]}" "$BIN" bench "$w" --procs 2 ${OPTS[$w]} --key "$d/data/cluster.key" \
                --json "$d/$t-$w.json" "$target" > "$d/$t-$w.out" 2>&1; } 2> "$d/$t-$w.time"
            echo $(( $(ticks "$up") - before )) > "$d/$t-$w.server_ticks"
        done
    done
    # tar xf and rm -rf of /usr/include, through the library and through the mount.
    for t in preload mount; do
        env=()
        case $t in
            preload) dir="$PFS_AT/tar"; env=(LD_PRELOAD="$LIB" PFS_MOUNT="$PFS_AT" PFS_MASTER="$master" PFS_KEY="$d/data/cluster.key") ;;
            mount) dir="$d/mnt/tar-m" ;;
        esac
        mkdir -p "$d/mnt/$(basename "$dir")"
        before=$(ticks "$up")
        TIMEFORMAT='%R %U %S'
        { time env "${env[@]}" tar -C "$dir" -xf "$WORK/include.tar"; } 2> "$d/$t-tar.time"
        echo $(( $(ticks "$up") - before )) > "$d/$t-tar.server_ticks"
        before=$(ticks "$up")
        { time env "${env[@]}" rm -rf "$dir"; } 2> "$d/$t-rm.time"
        echo $(( $(ticks "$up") - before )) > "$d/$t-rm.server_ticks"
    done
    kill -INT "$up"
    wait "$up" || true
    up=
done
hz=$(getconf CLK_TCK)
for w in $WORKLOADS; do
    echo "### $w (\`pfs bench $w --procs 2 ${OPTS[$w]}\`), rates the $STAT of $ROUNDS runs each"
    echo
    echo "| phase | native | preload | mount | preload/native | preload/mount |"
    echo "|---|---|---|---|---|---|"
    for phase in $(jq -r '.phases[].name' "$WORK/1/native-$w.json"); do
        mean() { cat "$WORK"/*/"$1-$w".json | jq -s "[.[].phases[] | select(.name==\"$phase\") | .rate] | $jq_stat"; }
        n=$(mean native)
        p=$(mean preload)
        m=$(mean mount)
        printf '| %s | %.0f | %.0f | %.0f | %.2f | %.2f |\n' "$phase" "$n" "$p" "$m" \
            "$(echo "$p / $n" | bc -l)" "$(echo "$p / $m" | bc -l)"
    done
    cpu() { # microseconds of CPU per operation, server and bench processes
        local total=0 ops=0
        for d in "$WORK"/*/; do
            read -r u s < "$d/$1-$w.time"
            total=$(echo "$total + ($(cat "$d/$1-$w.server_ticks") / $hz) + $u + $s" | bc -l)
            ops=$((ops + $(jq '[.phases[].ops] | add' "$d/$1-$w.json")))
        done
        echo "$total * 1000000 / $ops" | bc -l
    }
    n=$(cpu native)
    p=$(cpu preload)
    m=$(cpu mount)
    printf '| CPU µs/op (all phases) | %.1f | %.1f | %.1f | %.2f | %.2f |\n\n' "$n" "$p" "$m" \
        "$(echo "$p / $n" | bc -l)" "$(echo "$p / $m" | bc -l)"
done
echo "### tar xf and rm -rf of /usr/include ($entries entries), mean of $ROUNDS runs each"
echo
echo "| step | preload s | mount s | preload/mount speed | preload CPU µs/entry | mount CPU µs/entry |"
echo "|---|---|---|---|---|---|"
for step in tar rm; do
    avg() { # wall seconds, CPU seconds (tool + server), over the rounds
        local wall=0 cpu=0
        for d in "$WORK"/*/; do
            read -r r u s < "$d/$1-$step.time"
            wall=$(echo "$wall + $r" | bc -l)
            cpu=$(echo "$cpu + $u + $s + $(cat "$d/$1-$step.server_ticks") / $hz" | bc -l)
        done
        echo "$(echo "$wall / $ROUNDS" | bc -l) $(echo "$cpu * 1000000 / $ROUNDS / $entries" | bc -l)"
    }
    read -r pw pc < <(avg preload)
    read -r mw mc < <(avg mount)
    printf '| %s | %.2f | %.2f | %.2f | %.0f | %.0f |\n' "$step" "$pw" "$mw" "$(echo "$mw / $pw" | bc -l)" "$pc" "$mc"
done
