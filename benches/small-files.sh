#!/usr/bin/env bash
# Small files read through the mount the way `cat`, `cp` and job input readers
# do: open, read, close, each file found by a lookup (its name not in the
# kernel's cache). A/B of two pfs binaries, alternating A B A B (this machine is
# shared and noisy): each round a fresh `pfs up --workers 1`, FILES files of
# SIZE bytes written through the mount, a pause past the kernel's name lifetime
# (1 s), then PROCS processes each reading every file once (timed). Prints the
# files read per second of each and B/A, and the pfs up process's CPU time per
# file read.
#
#   benches/small-files.sh OLD_PFS NEW_PFS     # as root; ROUNDS=2 FILES=5000 SIZE=3901 PROCS=1
set -euo pipefail
A=$1
B=$2
ROUNDS=${ROUNDS:-2}
FILES=${FILES:-5000}
SIZE=${SIZE:-3901}
PROCS=${PROCS:-1}
WORK=${WORK:-/tmp/pfs-small-files}
command -v python3 >/dev/null || { echo "error: python3 not found" >&2; exit 1; }
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
declare -A RATE CPU
for r in $(seq "$ROUNDS"); do
    for x in A B; do
        bin=${!x}
        d=$WORK/$x.$r
        rm -rf "$d"
        mkdir -p "$d/mnt"
        "$bin" up --mount "$d/mnt" --data "$d/data" --workers 1 --master-listen 127.0.0.1:0 \
            --size-gib 4 > "$d/up.log" 2>&1 &
        up=$!
        for _ in $(seq 300); do grep -q "mounted on" "$d/up.log" && break; sleep 0.1; done
        python3 - "$d/mnt/s" "$FILES" "$SIZE" <<'EOF'
import os, sys
d, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.makedirs(d)
data = bytes((i * 7) % 251 for i in range(size))
for i in range(n):
    fd = os.open(f"{d}/f{i}", os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, data)
    os.close(fd)
EOF
        sleep 1.5
        t0=$(ticks "$up")
        start=$(date +%s.%N)
        for p in $(seq "$PROCS"); do
            python3 - "$d/mnt/s" "$FILES" "$SIZE" <<'EOF' &
import os, sys
d, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for i in range(n):
    fd = os.open(f"{d}/f{i}", os.O_RDONLY)
    got = os.read(fd, size + 1)
    os.close(fd)
    assert len(got) == size, f"f{i}: {len(got)} bytes"
EOF
        done
        wait $(jobs -p | grep -v "^$up$") 2>/dev/null || true
        end=$(date +%s.%N)
        t1=$(ticks "$up")
        reads=$((FILES * PROCS))
        RATE[$x]=$(echo "${RATE[$x]:-0} + $reads / ($end - $start)" | bc -l)
        CPU[$x]=$(echo "${CPU[$x]:-0} + ($t1 - $t0) * 1000000 / $(getconf CLK_TCK) / $reads" | bc -l)
        kill -INT "$up"
        wait "$up" || true
    done
done
echo "$PROCS process(es) reading $FILES files of $SIZE bytes through the mount, mean of $ROUNDS rounds"
echo
echo "| measure | A | B | B/A |"
echo "|---|---|---|---|"
ra=$(echo "${RATE[A]} / $ROUNDS" | bc -l)
rb=$(echo "${RATE[B]} / $ROUNDS" | bc -l)
ca=$(echo "${CPU[A]} / $ROUNDS" | bc -l)
cb=$(echo "${CPU[B]} / $ROUNDS" | bc -l)
printf '| files read/s | %.0f | %.0f | %.2f |\n' "$ra" "$rb" "$(echo "$rb / $ra" | bc -l)"
printf '| pfs up CPU µs per file | %.1f | %.1f | %.2f |\n' "$ca" "$cb" "$(echo "$cb / $ca" | bc -l)"
