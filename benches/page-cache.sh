#!/usr/bin/env bash
# fio 1 MiB sequential through a `pfs up` mount: write, then read with fio's
# default --invalidate=1 (fadvise DONTNEED first: a cold read), then twice with
# --invalidate=0 (what the page cache kept across opens).
# Usage (root): benches/page-cache.sh; UP_ARGS="-o page_cache=drop" benches/page-cache.sh
# Environment: SIZE_MIB (1024), WORK (/tmp/pfs-page-cache).
set -u
cd "$(dirname "$0")/.."
cargo build --release -q -p pfs -p pfs-fuse --bins || exit 1
BIN=$PWD/target/release
W=${WORK:-/tmp/pfs-page-cache}; umount $W/mnt 2>/dev/null; rm -rf $W; mkdir -p $W/mnt
$BIN/pfs up --mount $W/mnt --data $W/data --master-listen 127.0.0.1:0 --size-gib 4 ${UP_ARGS:-} > $W/up.log 2>&1 &
UP=$!
for _ in $(seq 300); do grep -q "mounted on" $W/up.log && break; sleep 0.1; done
f() { fio --name=seq --directory=$W/mnt --rw=$1 --bs=1M --size=${SIZE_MIB:-1024}M --ioengine=psync --end_fsync=1 --invalidate=$2 --output-format=json 2>/dev/null | jq -r ".jobs[0].$1.bw / 1024 | floor"; }
echo "${UP_ARGS:-default}: write $(f write 1) read-inval $(f read 1) read $(f read 0) reread $(f read 0)"
kill -INT $UP; wait $UP
rm -rf $W
