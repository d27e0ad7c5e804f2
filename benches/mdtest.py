#!/usr/bin/env python3
"""mdtest-like metadata phases in one shared directory, N processes.

    benches/mdtest.py DIR [--procs 2] [--files 2000] [--size 0]

Each process creates its share of files in DIR/md (writing SIZE bytes into each
when SIZE > 0), then, after a barrier, stats the files another process created,
then removes them (mdtest -N 1 style, so no process hits only its own cache).
Prints one line per phase: `phase ops seconds ops/s`. Used by
benches/fuse-vs-memfs.sh; pfs bench (issue 5) will replace it.
"""
import argparse
import multiprocessing as mp
import os
import sys
import time


def worker(rank, args, barrier, times):
    d = os.path.join(args.dir, "md")
    data = b"x" * args.size
    mine = [os.path.join(d, f"file.{rank}.{i}") for i in range(args.files)]
    other = (rank + 1) % args.procs
    theirs = [os.path.join(d, f"file.{other}.{i}") for i in range(args.files)]

    def phase(name, fn):
        barrier.wait()
        t = time.perf_counter()
        fn()
        times[f"{name}.{rank}"] = time.perf_counter() - t
        barrier.wait()

    def create():
        for p in mine:
            fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            if data:
                os.write(fd, data)
            os.close(fd)

    def stat():
        for p in theirs:
            st = os.stat(p)
            if st.st_size != args.size:
                raise SystemExit(f"{p}: size {st.st_size}, expected {args.size}")

    def remove():
        for p in theirs:
            os.unlink(p)

    phase("create", create)
    phase("stat", stat)
    phase("remove", remove)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--files", type=int, default=2000, help="files per process")
    ap.add_argument("--size", type=int, default=0, help="bytes written per file")
    args = ap.parse_args()
    d = os.path.join(args.dir, "md")
    os.makedirs(d, exist_ok=True)
    barrier = mp.Barrier(args.procs)
    times = mp.Manager().dict()
    ps = [mp.Process(target=worker, args=(r, args, barrier, times)) for r in range(args.procs)]
    for p in ps:
        p.start()
    for p in ps:
        p.join()
        if p.exitcode != 0:
            sys.exit(f"a worker failed ({p.exitcode})")
    left = os.listdir(d)
    if left:
        sys.exit(f"{len(left)} files left after remove")
    os.rmdir(d)
    total = args.procs * args.files
    for name in ("create", "stat", "remove"):
        secs = max(times[f"{name}.{r}"] for r in range(args.procs))
        print(f"{name} {total} {secs:.3f} {total / secs:.0f}")


if __name__ == "__main__":
    main()
