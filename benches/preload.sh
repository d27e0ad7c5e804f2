#!/usr/bin/env bash
# libpfs_preload against the native client and the FUSE mount, in one run:
# `pfs up` (1 server x 2 workers, its data file on this disk), then `pfs bench`
# md-easy, md-hard and io-easy on three targets, alternating within each round
# (this machine is shared and noisy):
#   native  pfs://MASTER/nN             (the native client, no kernel)
#   preload /pfs-preload-bench/pN       (LD_PRELOAD=libpfs_preload.so, PFS_MOUNT=/pfs-preload-bench)
#   mount   MOUNTPOINT/mN               (the FUSE mount of pfs up)
# Prints, per workload and phase, the median rate of each, preload/native and
# preload/mount (the ratio of the medians, and the median of each round's own
# ratio: "paired", whose two runs ran seconds apart, so a slow spell of this VM
# moves both), and the CPU time per operation (the pfs up process, with its
# FUSE threads, and the bench processes); then `tar xf` and `rm -rf` of
# /usr/include through the library and through the mount.
#
# md-easy runs 20,000 files per process and md-hard 10,000 by default: with
# 5,000 and 2,000 a native remove phase lasted 0.1 s, and the same binary's
# rate moved 0.45-1.36x between runs.
#
#   cargo build --release -p pfs -p pfs-preload
#   benches/preload.sh                 # as root; ROUNDS=2, WORKLOADS="md-easy md-hard io-easy"
#   WORKERS=1 benches/preload.sh       # pfs up's workers (2 by default here)
#   UP_ARGS="--idle-spin-us 1000" benches/preload.sh   # more pfs up options
#   TARGETS="preload native mount" benches/preload.sh   # the targets (each round
#                                      # starts one further along the list; any two
#                                      # of them, or one, e.g. TARGETS="native preload")
#   WARMUP=20000 benches/preload.sh    # an unmeasured native md-easy of that many files
#                                      # per process after each pfs up starts
#   TAR=0 benches/preload.sh           # no tar xf / rm -rf (it runs only with both
#                                      # preload and mount among the targets)
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
declare -A OPTS=([md-easy]="--files 20000" [md-hard]="--files 10000" [io-easy]="--segments 512" [io-hard]="--segments 2048" [ckpt]="--particles 1048576")
WORKLOADS=${WORKLOADS:-"md-easy md-hard io-easy"}
# A workload's options from the environment: OPTS_md_hard="--files 20000".
for w in "${!OPTS[@]}"; do
    v=OPTS_${w//-/_}
    if [ -n "${!v:-}" ]; then OPTS[$w]=${!v}; fi
done
TARGETS=${TARGETS:-"native preload mount"}
for t in $TARGETS; do
    case $t in
        native | preload | mount) ;;
        *) echo "error: TARGETS: unknown target $t (native, preload, mount)" >&2; exit 1 ;;
    esac
done
# tar xf and rm -rf run when both the library and the mount are targets (TAR=0: never).
TAR=${TAR:-1}
[[ " $TARGETS " == *" preload "* && " $TARGETS " == *" mount "* ]] || TAR=0
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
    if [ "${WARMUP:-0}" -gt 0 ]; then
        # Not measured: the device file's inode and log pages written once.
        mkdir "$d/mnt/warmup"
        "$BIN" bench md-easy --procs 2 --files "$WARMUP" --key "$d/data/cluster.key" \
            "pfs://$master/warmup" > "$d/warmup.out" 2>&1
    fi
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
    [ "$TAR" = 1 ] && for t in preload mount; do
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
has() { [[ " $TARGETS " == *" $1 "* ]]; }
first=${TARGETS%% *}
# The statistic over the rounds of numbers given one per line.
stat() { jq -s "$jq_stat"; }
# Target $1's rate of phase $2 of workload $3 in each round, one per line.
rates() { for d in "$WORK"/*/; do jq ".phases[] | select(.name==\"$2\") | .rate" "$d/$1-$3.json"; done; }
# Per round, target $1's rate over target $2's (runs minutes apart at most).
paired() { paste <(rates "$1" "$3" "$4") <(rates "$2" "$3" "$4") | awk '{ printf "%.6f\n", $1 / $2 }'; }
fmt() { if [ -n "$2" ]; then printf "$1" "$2"; else printf -- '-'; fi; }
for w in $WORKLOADS; do
    echo "### $w (\`pfs bench $w --procs 2 ${OPTS[$w]}\`), rates the $STAT of $ROUNDS runs each"
    echo
    echo "Ratios: of the ${STAT}s, then (paired) the $STAT of each round's own ratio."
    echo
    echo "| phase | native | preload | mount | preload/native | paired | preload/mount | paired |"
    echo "|---|---|---|---|---|---|---|---|"
    for phase in $(jq -r '.phases[].name' "$WORK/1/$first-$w.json"); do
        n= p= m= pn= ppn= pm= ppm=
        has native && n=$(rates native "$phase" "$w" | stat)
        has preload && p=$(rates preload "$phase" "$w" | stat)
        has mount && m=$(rates mount "$phase" "$w" | stat)
        if [ -n "$p" ] && [ -n "$n" ]; then
            pn=$(echo "$p / $n" | bc -l)
            ppn=$(paired preload native "$phase" "$w" | stat)
        fi
        if [ -n "$p" ] && [ -n "$m" ]; then
            pm=$(echo "$p / $m" | bc -l)
            ppm=$(paired preload mount "$phase" "$w" | stat)
        fi
        echo "| $phase | $(fmt %.0f "$n") | $(fmt %.0f "$p") | $(fmt %.0f "$m") | $(fmt %.2f "$pn") | $(fmt %.2f "$ppn") | $(fmt %.2f "$pm") | $(fmt %.2f "$ppm") |"
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
    n= p= m= pn= pm=
    has native && n=$(cpu native)
    has preload && p=$(cpu preload)
    has mount && m=$(cpu mount)
    [ -n "$p" ] && [ -n "$n" ] && pn=$(echo "$p / $n" | bc -l)
    [ -n "$p" ] && [ -n "$m" ] && pm=$(echo "$p / $m" | bc -l)
    echo "| CPU µs/op (all phases) | $(fmt %.1f "$n") | $(fmt %.1f "$p") | $(fmt %.1f "$m") | $(fmt %.2f "$pn") | | $(fmt %.2f "$pm") | |"
    echo
done
if [ "$TAR" = 1 ]; then
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
fi
