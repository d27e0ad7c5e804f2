#!/usr/bin/env bash
# Metadata requests on inodes whose pages are not in memory, through the FUSE
# mount of `pfs up` (1 server x 2 workers, its data file on this disk): FILES
# empty files in one directory are created, `pfs up` is stopped cleanly and
# started again (nothing resident), then `ls -l` of the directory (readdir with
# attributes) and a `stat` of every file by 2 processes at once are timed.
# Run for two pfs binaries, A B A B (this machine is shared and noisy): before
# and after inode pages were read in the background.
#
#   benches/cold-icache.sh OLD_PFS NEW_PFS      # as root; FILES=50000, ROUNDS=2
set -euo pipefail
A=$1
B=$2
FILES=${FILES:-50000}
ROUNDS=${ROUNDS:-2}
WORK=${WORK:-/tmp/pfs-cold}
rm -rf "$WORK"
mkdir -p "$WORK"
up() { # bin dir n: starts pfs up (pid in $pid), waits for its n-th mount
    "$1" up --mount "$2/mnt" --data "$2/data" --workers 2 --master-listen 127.0.0.1:0 \
        --size-gib 8 >> "$2/up.log" 2>&1 &
    pid=$!
    for _ in $(seq 300); do
        [ "$(grep -c "mounted on" "$2/up.log")" -ge "$3" ] && break
        sleep 0.1
    done
}
down() { # stops pfs up cleanly (unmount, checkpoint) and waits for it
    kill -INT "$pid"
    wait "$pid" || true
}
now() { date +%s.%N; }
for r in $(seq "$ROUNDS"); do
    for x in A B; do
        bin=${!x}
        d=$WORK/$x.$r
        mkdir -p "$d/mnt"
        up "$bin" "$d" 1
        mkdir "$d/mnt/many"
        (cd "$d/mnt/many" && seq -f "f%06g" 1 "$FILES" | xargs touch)
        down
        up "$bin" "$d" 2
        t0=$(now)
        ls -l "$d/mnt/many" > /dev/null
        t1=$(now)
        # Another restart: the stats below start cold as well.
        down
        up "$bin" "$d" 3
        t2=$(now)
        (cd "$d/mnt/many" && seq -f "f%06g" 1 2 "$FILES" | xargs stat -c %i > /dev/null) &
        s1=$!
        (cd "$d/mnt/many" && seq -f "f%06g" 2 2 "$FILES" | xargs stat -c %i > /dev/null) &
        s2=$!
        wait "$s1" "$s2"
        t3=$(now)
        echo "$(echo "$t1 - $t0" | bc -l) $(echo "$t3 - $t2" | bc -l)" > "$d/times"
        down
    done
done
echo "### $FILES files in one directory after a clean restart, through the mount, mean of $ROUNDS runs"
echo
echo "| step | A s | B s | A/B speed |"
echo "|---|---|---|---|"
for i in 1 2; do
    mean() { cat "$WORK"/"$1".*/times | awk -v i="$i" '{s += $i} END {print s / NR}'; }
    a=$(mean A)
    b=$(mean B)
    name=$([ "$i" = 1 ] && echo "ls -l (readdir with attributes)" || echo "stat of every file, 2 processes")
    printf '| %s | %.3f | %.3f | %.2f |\n' "$name" "$a" "$b" "$(echo "$a / $b" | bc -l)"
done
rm -rf "$WORK"
