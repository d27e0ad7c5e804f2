#!/usr/bin/env bash
# How often the workers wait for the device with a small device queue: a
# standalone master and `pfs-server serve` (2 workers, its device a sparse file
# in $WORK) with `io_queue_depth = QD`, and every `pfs bench` workload through
# the native client (2 processes, each phase verified). Prints each phase and,
# from the workers' stop lines (RUST_LOG=pfs_server=info), how often each
# waited for the device while serving, how many device requests waited for room
# in the shard's queue instead, and how many data writes stopped for them.
#
#   benches/small-queue.sh                 # as root; QD=8, WORK=/tmp/pfs-small-queue
#   QD=1 benches/small-queue.sh
#   EXTRA='icache_blocks = 64' benches/small-queue.sh   # more server config lines
#   KEEP=1 benches/small-queue.sh          # keep $WORK (server.log) afterwards
#   MOUNT=1 benches/small-queue.sh         # then, through a pfs-fuse mount: `pfs fsx`
#                                          # on the three data layouts, `tar xf` of
#                                          # /usr/include checked with `diff -r`, `rm -rf`
#   MOUNT=1 PJDFSTEST=/tmp/pjd benches/small-queue.sh  # and pjdfstest (built in that
#                                          # directory: see tests/conformance.rs), its summary
#   MOUNT=1 MOUNT_OPTS=writeback_cache benches/small-queue.sh  # more pfs-fuse -o options
set -euo pipefail
QD=${QD:-8}
BIN=${BIN:-$(cd "$(dirname "$0")/.." && pwd)/target/release}
WORK=${WORK:-/tmp/pfs-small-queue}
rm -rf "$WORK"
mkdir -p "$WORK"
"$BIN/pfs-server" keygen "$WORK/key" > /dev/null
cat > "$WORK/master.toml" <<T
listen = "127.0.0.1:7300"
key_file = "$WORK/key"
servers = 1
state_path = "$WORK/master.state"
T
cat > "$WORK/server.toml" <<T
listen = "127.0.0.1:7301"
advertise = "127.0.0.1:7301"
master = "127.0.0.1:7300"
key_file = "$WORK/key"
data_path = "$WORK/dev"
device_size_bytes = 8589934592
preallocate = false
workers = 2
io_queue_depth = $QD
${EXTRA:-}
T
"$BIN/pfs-server" master -c "$WORK/master.toml" > "$WORK/master.log" 2>&1 &
master=$!
RUST_LOG=pfs_server=info "$BIN/pfs-server" serve -c "$WORK/server.toml" > "$WORK/server.log" 2>&1 &
server=$!
trap 'kill -TERM $server $master 2> /dev/null || true' EXIT
for _ in $(seq 100); do
    grep -q "registered with master" "$WORK/server.log" 2> /dev/null && break
    sleep 0.1
done
for wl in "md-easy --files 5000" "md-hard --files 3000" "io-easy --segments 512" \
    "io-hard --segments 2048" "ckpt" "mdwb"; do
    # shellcheck disable=SC2086
    "$BIN/pfs" bench $wl --key "$WORK/key" pfs://127.0.0.1:7300/ 2>&1 | grep -v "^$"
done
if [ -n "${MOUNT:-}" ]; then
    mkdir -p "$WORK/mnt"
    "$BIN/pfs-fuse" 127.0.0.1:7300 "$WORK/mnt" -o "key=$WORK/key,log=$WORK/fuse.log,allow_other${MOUNT_OPTS:+,$MOUNT_OPTS}"
    for layout in block file io; do
        mkdir "$WORK/mnt/fsx-$layout"
        "$BIN/pfs" fsx --ops 3000 --layout "$layout" "$WORK/mnt/fsx-$layout" 2>&1 | tail -1
    done
    mkdir "$WORK/mnt/md"
    "$BIN/pfs" bench md-hard --files 2000 "$WORK/mnt/md" 2>&1 | grep -E "^(create|read|remove) |verified"
    rmdir "$WORK/mnt/md"
    mkdir "$WORK/mnt/tar"
    tar -C "$WORK/mnt/tar" -xf <(tar -C /usr -cf - include)
    diff -r --no-dereference /usr/include "$WORK/mnt/tar/include" && echo "tar xf of /usr/include: same as the source"
    rm -rf "$WORK/mnt/tar" "$WORK/mnt"/fsx-*
    if [ -n "${PJDFSTEST:-}" ]; then
        mkdir "$WORK/mnt/pjd"
        (cd "$WORK/mnt/pjd" && prove -r -j4 "$PJDFSTEST/tests" 2>&1 | grep -E "^(Files=|Result:)|\.t +\(Wstat" || true)
    fi
    umount "$WORK/mnt"
fi
kill -TERM "$server"
wait "$server" || true
kill -TERM "$master"
wait "$master" || true
trap - EXIT
echo "io_queue_depth = $QD:"
grep "waited for the device" "$WORK/server.log" | sed 's/.*pfs_server::worker\] //; s/; the backlog.*//'
[ -n "${KEEP:-}" ] || rm -rf "$WORK"
