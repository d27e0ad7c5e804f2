#!/usr/bin/env bash
# CPU an idle pfs uses: starts `pfs up` (master, one server with WORKERS workers,
# the FUSE mount and its client in one process), waits, then samples every
# thread's CPU time over SECS seconds and prints per-thread and total percent of
# one core. Usage: benches/idle-cpu.sh   (as root; SECS, WORKERS override)
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${SECS:-30}
WORKERS=${WORKERS:-2}
WORK=$PWD/target/bench-idle
cargo build --release -q -p pfs --bins
rm -rf "$WORK"; mkdir -p "$WORK/mnt"
./target/release/pfs up --mount "$WORK/mnt" --data "$WORK/data" --workers "$WORKERS" \
    --master-listen 127.0.0.1:0 --size-gib 2 > "$WORK/up.log" 2>&1 &
PID=$!
trap 'kill -INT $PID 2>/dev/null; wait $PID 2>/dev/null || true' EXIT
for _ in $(seq 100); do grep -q "mounted on" "$WORK/up.log" && break; sleep 0.1; done
sleep 2
sample() { for t in /proc/$PID/task/*; do echo "$(basename "$t") $(tr ' ' _ < "$t/comm") $(awk '{print $14+$15}' "$t/stat")"; done | sort; }
sample > "$WORK/t1"; sleep "$SECS"; sample > "$WORK/t2"
HZ=$(getconf CLK_TCK)
echo "| thread | CPU % of one core over ${SECS} s |"
echo "|---|---|"
join "$WORK/t1" "$WORK/t2" | awk -v hz="$HZ" -v s="$SECS" '
    { d = $5 - $3; by[$2] += d; total += d; if ($2 ~ /^pfs-(worker|heartbeat|acceptor|memcpy)/) server += d }
    END {
        for (n in by) if (by[n] > 0) printf "| %s | %.2f |\n", n, by[n] / hz / s * 100
        printf "| **server threads** | **%.2f** |\n", server / hz / s * 100
        printf "| **whole process** | **%.2f** |\n", total / hz / s * 100
    }'
